"""The table behind both top-N views: per stage, the names with the most time (sum, count, share)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.formats import count_text
from profparse.base.marks import STAGES
from profparse.base.names import unique_labels
from profparse.outputs.views._common import STAGE_COLORS, Figure, Prepared, fmt_time, time_unit

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

TOP_N = 8


def top_data(frame: pd.DataFrame, value: str, what: str, title: str, kernel: bool, n: int = TOP_N) -> Prepared:
    """Per stage: its total ``value`` time, event count and the top ``n`` names (name, label, total_ns, count,
    share of the stage)."""
    grouped = (
        frame.groupby(["stage", "name"], observed=True)[value]
        .agg(["sum", "count"])
        .reset_index()
        .sort_values(["stage", "sum"], ascending=[True, False], kind="stable")
    )
    stages = []
    for stage in STAGES:
        mine = grouped[grouped["stage"] == stage]
        total = float(frame.loc[frame["stage"] == stage, value].sum())
        if mine.empty or not total:
            continue
        top = mine.head(n)
        rows = pd.DataFrame(
            {
                "name": [str(x) for x in top["name"]],
                "label": unique_labels([str(x) for x in top["name"]], kernel=kernel),
                "total_ns": top["sum"].to_numpy(np.int64),
                "count": top["count"].to_numpy(np.int64),
                "share": top["sum"].to_numpy(float) / total,
            }
        )
        stages.append(
            {"stage": stage, "total_ns": int(total), "events": int((frame["stage"] == stage).sum()), "top": rows}
        )
    return {"what": what, "heading": title, "stages": stages}


def top_draw(prepared: Prepared) -> Figure:
    """One panel per stage: horizontal bars of the names with the most time."""
    import matplotlib.pyplot as plt

    stages = prepared["stages"]
    what = prepared["what"]
    heights = [max(len(s["top"]), 1) for s in stages]
    fig, axes = plt.subplots(
        len(stages),
        1,
        figsize=(12, 1.2 + 0.34 * sum(heights) + 0.75 * len(stages)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
        layout="constrained",
    )
    for ax, item in zip(axes[:, 0], stages, strict=True):
        top, stage, total = item["top"], item["stage"], item["total_ns"]
        scale, unit = time_unit(float(top["total_ns"].max()))
        values = top["total_ns"].to_numpy(dtype=float) / scale
        y = np.arange(len(top))
        ax.barh(y, values, color=STAGE_COLORS[stage], height=0.7)
        ax.set_yticks(y, list(top["label"]), fontsize=9)
        ax.invert_yaxis()
        right = values.max() if len(values) else 1
        for yi, v, share, c in zip(y, values, top["share"], top["count"], strict=True):
            ax.text(v + right * 0.01, yi, f"{v:,.2f} {unit}  {share:.0%}  ×{c:,}", va="center", fontsize=8)
        ax.set_xlim(0, right * 1.3)
        ax.set_title(
            f"{stage}: {fmt_time(total)} {what} in {count_text(item['events'], 'event')}",
            loc="left",
            color=STAGE_COLORS[stage],
        )
        ax.set_xlabel(f"{what} ({unit})")
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    fig.suptitle(f"{prepared['heading']}: {prepared['title']}")
    return fig


def with_title(prepared: Prepared, parsed: ParsedTrace) -> Prepared:
    from profparse.outputs.views._common import trace_title

    prepared["title"] = trace_title(parsed)
    return prepared
