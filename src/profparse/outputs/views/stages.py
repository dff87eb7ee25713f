"""Time per stage, stacked by level: host threads in one panel, the GPU in another, one time unit for both.

Host bars are the stages' host wall (``stage_summary.host_wall_ns``); GPU bars their additive share of the steps'
GPU spans (busy + overlap + idle). Levels come from the analyses' ``stage_levels`` when it exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.outputs.views._common import (
    STAGE_COLORS,
    Figure,
    Prepared,
    optional_table,
    shade,
    time_unit,
    trace_title,
)

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "stages"
TITLE = "Time per stage, by level"
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo"]


def gpu_levels(busy: pd.Series, overlap: pd.Series, idle: pd.Series) -> pd.DataFrame:
    """The GPU panel's levels (``stage_summary``'s additive split of the steps' GPU spans)."""
    return pd.DataFrame(
        {"GPU busy (this stage only)": busy, "overlap with other stages": overlap, "idle (waiting for it)": idle}
    )


def _keep(panels: list[tuple[pd.DataFrame, str]]) -> list[tuple[pd.DataFrame, str]]:
    out = []
    for frame, title in panels:
        frame = frame.loc[frame.sum(axis=1) > 0, frame.sum(axis=0) > 0]
        if not frame.empty:
            out.append((frame, title))
    return out


def level_panels(parsed: ParsedTrace) -> list[tuple[pd.DataFrame, str]] | None:
    """(stage rows x level columns in ns, title) panels from the analyses' ``stage_levels``, when it exists.

    Host levels, from the device up: runtime calls (launches, copies), synchronisation, ops (the framework op
    layer), Python inside ops, Python, waiting; they stack to the stage's host wall. Device levels: GPU busy (this
    stage only), overlap with other stages and the idle time charged to the stage; they stack to its share of the
    GPU spans of the steps.
    """
    table = optional_table(parsed, "stage_levels")
    if table is None or "stage" not in table.columns or "python_ns" not in table.columns:
        return None
    if "scope" in table.columns:
        table = table[table["scope"] == "total"]
    totals = table.groupby("stage", observed=False).sum(numeric_only=True)
    totals = totals.reindex([s for s in STAGES if s in totals.index]).fillna(0)

    def col(name: str) -> pd.Series:
        return totals[name].astype(float) if name in totals.columns else pd.Series(0.0, index=totals.index)

    host = pd.DataFrame(
        {
            "runtime calls": (col("runtime_ns") - col("sync_ns")).clip(lower=0),
            "synchronize": col("sync_ns"),
            "ops (self time)": (col("op_ns") - col("op_python_ns")).clip(lower=0),
            "Python inside ops": col("op_python_ns"),
            "Python": col("python_ns"),
            "waiting": col("wait_ns"),
        }
    )
    device = gpu_levels(col("device_busy_ns"), col("device_overlap_ns"), col("device_idle_ns"))
    return _keep([(host, "Host threads"), (device, "GPU")])


def summary_panels(parsed: ParsedTrace) -> list[tuple[pd.DataFrame, str]]:
    """The levels ``stage_summary`` has (no ``stage_levels`` table): host ops / rest of host wall, GPU split."""
    summary = parsed.stage_summary
    totals = summary[summary["scope"] == "total"].set_index("stage")
    totals = totals.reindex([s for s in STAGES if s in totals.index]).astype(float)
    ops = totals[["host_op_ns", "host_wall_ns"]].min(axis=1)  # op time on several threads: at most the wall
    host = pd.DataFrame({"rest of host wall": totals["host_wall_ns"] - ops, "ops (self time)": ops})
    gpu = gpu_levels(totals["gpu_busy_ns"], totals["gpu_overlap_ns"], totals["gpu_idle_ns"])
    return _keep([(host, "Host threads"), (gpu, "GPU")])


def data(parsed: ParsedTrace) -> tuple[Prepared | None, str | None]:
    """Panels of stage x level time (ns) and the trace's title."""
    panels = level_panels(parsed)
    if panels is None:
        panels = summary_panels(parsed)
    if not panels:
        return None, "no host or GPU time in any stage"
    return {"title": trace_title(parsed), "panels": panels}, None


def _panel(ax: Any, wide: pd.DataFrame, title: str, scale: float, unit: str, top: float) -> None:
    """Stage bars (x) stacked by the columns of ``wide`` (levels), stage colour lightened per level."""
    stages = list(wide.index)
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    levels = list(wide.columns)
    for j, level in enumerate(levels):
        values = wide[level].to_numpy(dtype=float) / scale
        amount = 0.6 * j / max(len(levels) - 1, 1)
        colors = [shade(STAGE_COLORS[s], amount) for s in stages]
        ax.bar(x, values, bottom=bottom, color=colors, edgecolor="white", linewidth=0.8, hatch=HATCHES[j % 7])
        bottom += values
    for i, total in enumerate(bottom):
        ax.text(x[i], total + top * 0.01, f"{total:,.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, stages)
    for tick, stage in zip(ax.get_xticklabels(), stages, strict=True):
        tick.set_color(STAGE_COLORS[stage])
        tick.set_fontweight("bold")
    ax.set_ylabel(f"time ({unit})")
    ax.set_title(title)
    ax.set_ylim(0, top * 1.12 if top else 1)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=shade("#555555", 0.6 * j / max(len(levels) - 1, 1)), hatch=HATCHES[j % 7], label=lv)
        for j, lv in enumerate(levels)
    ]
    # below the axes, never over a bar
    ax.legend(
        handles=handles,
        title="level (bottom to top)",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncols=min(len(handles), 3),
        frameon=False,
    )


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    panels = prepared["panels"]
    # one unit for both panels, so bars compare across them
    top_ns = max(float(frame.sum(axis=1).max()) for frame, _ in panels)
    scale, unit = time_unit(top_ns)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 6), squeeze=False, layout="constrained")
    for ax, (frame, title) in zip(axes[0], panels, strict=True):
        _panel(ax, frame, f"{title}: time per stage", scale, unit, top_ns / scale)
    fig.suptitle(f"Stages by level: {prepared['title']}")
    return fig
