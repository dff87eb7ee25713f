"""Pictures of a parsed trace: one figure per kind, PNG and SVG, one colour per stage everywhere.

Kinds (:data:`PLOT_KINDS`):

``stages``       time per stage, stacked by level (the analyses' ``stage_levels`` when present, else host ops /
                 rest of host wall and GPU busy / overlap / idle from ``stage_summary``); the host bars are the
                 stages' host wall, the GPU bars their share of the steps' GPU spans
``timeline``     stage bands over host threads and GPU streams, step boundaries marked
``top_kernels``  the kernels with the most GPU time, per stage
``top_ops``      the CPU ops with the most host self time, per stage
``memory``       allocated memory over time per device, over stage bands
``layers``       forward / backward time per module (the analyses' ``modules`` table)
``load``         loading sub-steps (the analyses' ``load_breakdown`` table)

A kind whose data is absent (no GPU, no ``[memory]`` events, a table not computed) is skipped with a reason. All
renderers only read the :class:`~profparse.api.ParsedTrace`; matplotlib runs on the Agg backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.marks import STAGES
from profparse.outputs.files import atomic_dir
from profparse.outputs.formats import display
from profparse.outputs.names import shorten_name, unique_labels
from profparse.trace.events import NULL

PLOT_KINDS: tuple[str, ...] = ("stages", "timeline", "top_kernels", "top_ops", "memory", "layers", "load")
FORMATS: tuple[str, ...] = ("png", "svg")

#: One colour per stage, used by every plot (Okabe-Ito palette: readable for colour-blind viewers).
STAGE_COLORS: dict[str, str] = {
    "load": "#CC79A7",
    "forward": "#0072B2",
    "backward": "#E69F00",
    "optimizer": "#009E73",
    "other": "#999999",
}
TOP_N = 8
MAX_TRACKS = 16
MAX_RECTS = 6000  # drawn rectangles in the timeline, all tracks together
MAX_MEMORY_POINTS = 4000  # per device; longer series are reduced to the max per time bin
MIN_MEMORY_BYTES = 64 << 10  # devices whose allocations stay below this are not plotted


def optional_table(parsed: Any, name: str) -> pd.DataFrame | None:
    """``parsed.<name>`` when that table exists and has rows, else None (tables added by later analyses)."""
    try:
        table = getattr(parsed, name)
    except AttributeError:
        return None
    if not isinstance(table, pd.DataFrame) or table.empty:
        return None
    return table


# -- small helpers ----------------------------------------------------------------------------------------------


def time_unit(max_ns: float) -> tuple[float, str]:
    """(divisor, label) so that ``max_ns`` reads well: s, ms or us."""
    if max_ns >= 5e9:
        return 1e9, "s"
    if max_ns >= 1e6:
        return 1e6, "ms"
    return 1e3, "µs"


def _fmt_time(ns: float) -> str:
    scale, unit = time_unit(ns)
    value = ns / scale
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def _fmt_bytes(n: float) -> tuple[float, str]:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return float(scale), unit
    return 1.0, "B"


def _stage_legend(ax: Any, stages: Sequence[str], **kwargs: Any) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=STAGE_COLORS[s], label=s) for s in stages]
    if handles:
        ax.legend(handles=handles, title="stage", **kwargs)


def _style() -> dict[str, Any]:
    return {
        "font.size": 10,
        "axes.titlesize": 12,
        "axes.titleweight": "bold",
        "axes.labelsize": 10,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "legend.fontsize": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.fonttype": "none",
        "text.parse_math": False,  # names from the trace are shown as written: a '$' in one is not math
    }


def _trace_title(parsed: Any) -> str:
    name = display(Path(parsed.path).name)
    rank = f", rank {parsed.rank}" if parsed.rank is not None else ""
    return f"{name}{rank}"


# -- figures ------------------------------------------------------------------------------------------------------

Figure = Any  # matplotlib.figure.Figure; imported lazily
Maker = Callable[[Any], "tuple[Figure | None, str | None]"]


def _shade(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white by ``amount`` (0 = the colour, 1 = white)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _level_panels(parsed: Any) -> list[tuple[pd.DataFrame, str]] | None:
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
    device = _gpu_levels(col("device_busy_ns"), col("device_overlap_ns"), col("device_idle_ns"))
    panels = []
    for frame, title in ((host, "Host threads"), (device, "GPU")):
        frame = frame.loc[frame.sum(axis=1) > 0, frame.sum(axis=0) > 0]
        if not frame.empty:
            panels.append((frame, title))
    return panels


def _gpu_levels(busy: pd.Series, overlap: pd.Series, idle: pd.Series) -> pd.DataFrame:
    """The GPU panel's levels (``stage_summary``'s additive split of the steps' GPU spans)."""
    return pd.DataFrame(
        {"GPU busy (this stage only)": busy, "overlap with other stages": overlap, "idle (waiting for it)": idle}
    )


def _stacked_panel(ax: Any, wide: pd.DataFrame, title: str, scale: float, unit: str) -> None:
    """Stage bars (x) stacked by the columns of ``wide`` (levels), stage colour lightened per level."""
    stages = list(wide.index)
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    levels = list(wide.columns)
    hatches = ["", "//", "..", "xx", "\\\\", "++", "oo"]
    for j, level in enumerate(levels):
        values = wide[level].to_numpy(dtype=float) / scale
        amount = 0.6 * j / max(len(levels) - 1, 1)
        colors = [_shade(STAGE_COLORS[s], amount) for s in stages]
        ax.bar(
            x,
            values,
            bottom=bottom,
            color=colors,
            edgecolor="white",
            linewidth=0.8,
            hatch=hatches[j % len(hatches)],
        )
        bottom += values
    top = bottom.max() if len(bottom) else 0
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
        Patch(facecolor=_shade("#555555", 0.6 * j / max(len(levels) - 1, 1)), hatch=hatches[j % len(hatches)], label=lv)
        for j, lv in enumerate(levels)
    ]
    ax.legend(handles=handles[::-1], title="level (top to bottom)", loc="upper right")


def plot_stages(parsed: Any) -> tuple[Figure | None, str | None]:
    """Time per stage, stacked by level: host levels in one panel, GPU busy / idle in another."""
    import matplotlib.pyplot as plt

    panels = _level_panels(parsed)
    if panels is None:  # no stage_levels table: the levels stage_summary has
        summary = parsed.stage_summary
        totals = summary[summary["scope"] == "total"].set_index("stage")
        totals = totals.reindex([s for s in STAGES if s in totals.index]).astype(float)
        ops = totals[["host_op_ns", "host_wall_ns"]].min(axis=1)  # op time on several threads: at most the wall
        host = pd.DataFrame({"rest of host wall": totals["host_wall_ns"] - ops, "ops (self time)": ops})
        gpu = _gpu_levels(totals["gpu_busy_ns"], totals["gpu_overlap_ns"], totals["gpu_idle_ns"])
        panels = []
        for frame, title in ((host, "Host threads"), (gpu, "GPU")):
            frame = frame.loc[frame.sum(axis=1) > 0, frame.sum(axis=0) > 0]
            if not frame.empty:
                panels.append((frame, title))
    if not panels:
        return None, "no host or GPU time in any stage"
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5.5), squeeze=False, layout="constrained")
    for ax, (frame, title) in zip(axes[0], panels, strict=True):
        scale, unit = time_unit(float(frame.sum(axis=1).max()))
        _stacked_panel(ax, frame, f"{title}: time per stage", scale, unit)
    fig.suptitle(f"Stages by level: {_trace_title(parsed)}")
    return fig, None


def _timeline_intervals(parsed: Any) -> tuple[Any, int]:
    """Stage intervals merged to about a pixel; coarser while there are more than :data:`MAX_RECTS`."""
    from profparse.outputs.perfetto import stage_intervals

    fine = stage_intervals(parsed, gap_ns=0)
    if fine.intervals.empty:
        return fine, 0
    span = int(fine.intervals["end_ns"].max() - fine.intervals["start_ns"].min())
    gap = max(span // 2000, 1)
    tracks = stage_intervals(parsed, gap_ns=gap)
    while len(tracks.intervals) > MAX_RECTS and gap < span:
        gap *= 4
        tracks = stage_intervals(parsed, gap_ns=gap)
    return tracks, gap


def plot_timeline(parsed: Any) -> tuple[Figure | None, str | None]:
    """Stage bands on each host thread and GPU stream (busiest :data:`MAX_TRACKS`), step boundaries dashed."""
    import matplotlib.pyplot as plt

    tracks, gap = _timeline_intervals(parsed)
    intervals = tracks.intervals
    if intervals.empty:
        return None, "no host spans or GPU activity"
    table = tracks.tracks
    hidden = 0
    if len(table) > MAX_TRACKS:
        keep = table.sort_values("busy_ns", ascending=False).head(MAX_TRACKS)["track"]
        hidden = len(table) - MAX_TRACKS
        table = table[table["track"].isin(keep)]
    table = table.sort_values("order")
    origin = int(intervals["start_ns"].min())
    span = int(intervals["end_ns"].max()) - origin
    scale, unit = time_unit(span)
    min_width = span / 1500
    fig_h = 1.6 + 0.42 * len(table)
    fig, ax = plt.subplots(figsize=(14, max(fig_h, 2.8)), layout="constrained")
    ylabels = []
    present: set[str] = set()
    for y, row in enumerate(table.itertuples(index=False)):
        mine = intervals[intervals["track"] == row.track]
        for stage, group in mine.groupby("stage", observed=True):
            start = (group["start_ns"].to_numpy() - origin).astype(float)
            width = np.maximum((group["end_ns"] - group["start_ns"]).to_numpy().astype(float), min_width)
            ax.broken_barh(
                list(zip(start / scale, width / scale, strict=True)),
                (y - 0.36, 0.72),
                facecolors=STAGE_COLORS[str(stage)],
                linewidth=0,
            )
            present.add(str(stage))
        prefix = "GPU" if row.kind == "gpu" else "CPU"
        label = row.label if row.label.startswith("GPU") else f"{prefix} {row.label}"
        ylabels.append(shorten_name(label, 40) if len(label) > 40 else display(label))
    ax.set_yticks(range(len(table)), ylabels)
    ax.set_ylim(len(table) - 0.5, -0.5)
    steps = parsed.steps
    if len(steps):
        from matplotlib.transforms import blended_transform_factory

        along = blended_transform_factory(ax.transData, ax.transAxes)
        last_label = -np.inf
        for st in steps.itertuples(index=False):
            x = (st.start_ns - origin) / scale
            mid = (st.start_ns + st.end_ns) / 2 - origin
            ax.axvline(x, color="#333333", linestyle="--", linewidth=0.7, alpha=0.6)
            # label each step at its middle, skipping labels that would run into the previous one
            if mid / scale - last_label >= span / scale * 0.05:
                ax.text(mid / scale, 1.01, f"step {st.step}", transform=along, fontsize=8, va="bottom", ha="center")
                last_label = mid / scale
    ax.set_xlim(0, span / scale * 1.005)
    ax.set_xlabel(f"time since first event ({unit});  same-stage spans closer than {_fmt_time(gap)} drawn as one bar")
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)
    note = f"; {hidden} quieter tracks not shown" if hidden else ""
    ax.set_title(f"Timeline by stage: {_trace_title(parsed)}{note}", pad=18)
    _stage_legend(ax, [s for s in STAGES if s in present], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig, None


def _top_figure(frame: pd.DataFrame, value: str, what: str, title: str, parsed: Any, kernel: bool) -> Figure:
    """One panel per stage: horizontal bars of the names with the most ``value`` time."""
    import matplotlib.pyplot as plt

    grouped = (
        frame.groupby(["stage", "name"], observed=True)[value]
        .agg(["sum", "count"])
        .reset_index()
        .sort_values(["stage", "sum"], ascending=[True, False], kind="stable")
    )
    stages = [s for s in STAGES if (grouped["stage"] == s).any() and grouped.loc[grouped["stage"] == s, "sum"].sum()]
    tops = {s: grouped[grouped["stage"] == s].head(TOP_N) for s in stages}
    heights = [max(len(t), 1) for t in tops.values()]
    fig, axes = plt.subplots(
        len(stages),
        1,
        figsize=(12, 1.2 + 0.34 * sum(heights) + 0.75 * len(stages)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
        layout="constrained",
    )
    for ax, stage in zip(axes[:, 0], stages, strict=True):
        top = tops[stage]
        total = float(frame.loc[frame["stage"] == stage, value].sum())
        scale, unit = time_unit(float(top["sum"].max()))
        values = top["sum"].to_numpy(dtype=float) / scale
        labels = unique_labels([str(n) for n in top["name"]], kernel=kernel)
        y = np.arange(len(top))
        ax.barh(y, values, color=STAGE_COLORS[stage], height=0.7)
        ax.set_yticks(y, labels, fontsize=9)
        ax.invert_yaxis()
        right = values.max() if len(values) else 1
        for yi, v, s, c in zip(y, values, top["sum"], top["count"], strict=True):
            share = f"{s / total:.0%}" if total else ""
            ax.text(v + right * 0.01, yi, f"{v:,.2f} {unit}  {share}  ×{c:,}", va="center", fontsize=8)
        ax.set_xlim(0, right * 1.3)
        ax.set_title(
            f"{stage}: {_fmt_time(total)} {what} in {frame['stage'].eq(stage).sum():,} events",
            loc="left",
            color=STAGE_COLORS[stage],
        )
        ax.set_xlabel(f"{what} ({unit})")
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    fig.suptitle(f"{title}: {_trace_title(parsed)}")
    return fig


def plot_top_kernels(parsed: Any) -> tuple[Figure | None, str | None]:
    kernels = parsed.kernels
    if kernels.empty or not kernels["dur_ns"].sum():
        return None, "no GPU activity in this trace"
    return _top_figure(kernels, "dur_ns", "GPU time", "Top GPU kernels per stage", parsed, True), None


def plot_top_ops(parsed: Any) -> tuple[Figure | None, str | None]:
    ops = parsed.ops
    if ops.empty or not ops["self_ns"].sum():
        return None, "no CPU ops in this trace"
    return _top_figure(ops, "self_ns", "host self time", "Top CPU ops per stage", parsed, False), None


def _memory_series(parsed: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(device label, ts_ns, bytes allocated) per device, from the analyses' memory table or ``[memory]`` events."""
    table = optional_table(parsed, "memory")
    if table is not None and {"ts_ns", "allocated_bytes", "device"} <= set(table.columns):
        out = []
        for device, group in table.groupby("device", observed=True, sort=True):
            g = group.dropna(subset=["allocated_bytes"]).sort_values("ts_ns", kind="stable")
            relative = "relative" in g.columns and bool(g["relative"].any())
            label = str(device).upper() if str(device) == "cpu" else str(device)
            label = f"{label} (change since first event)" if relative else label
            values = g["allocated_bytes"].to_numpy(np.float64)
            if len(values):
                out.append((label, g["ts_ns"].to_numpy(np.int64), values))
        return out
    events = parsed.raw.events
    memory = (events["kind"] == "memory").to_numpy()
    allocated = events["mem_total_allocated_bytes"].to_numpy()
    change = events["mem_bytes"].to_numpy()
    rows = np.flatnonzero(memory & ((allocated != NULL) | (change != NULL)))
    if len(rows) == 0:
        return []
    dtype = events["mem_device_type"].to_numpy()[rows]
    dev = events["mem_device_id"].to_numpy()[rows]
    ts_all = events["ts_ns"].to_numpy()
    out = []
    for t, d in sorted(set(zip(dtype.tolist(), dev.tolist(), strict=True))):
        pick = rows[(dtype == t) & (dev == d)]
        pick = pick[np.argsort(ts_all[pick], kind="stable")]
        label = "CPU" if t == 0 else (f"GPU {d}" if t == 1 else f"device type {t} id {d}")
        total = allocated[pick]
        if (total != NULL).any():
            keep = pick[total != NULL]
            out.append((label, ts_all[keep], allocated[keep].astype(np.float64)))
        else:  # older traces: only the size of each allocation / free; plot the running sum
            delta = np.where(change[pick] == NULL, 0, change[pick]).astype(np.float64)
            out.append((f"{label} (change since first event)", ts_all[pick], np.cumsum(delta)))
    return out


def _reduce_series(ts: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``bins`` points: the maximum per time bin (peaks stay visible)."""
    if len(ts) <= bins:
        return ts, values
    edges = np.linspace(ts[0], ts[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, bins - 1)
    peak = np.full(bins, -np.inf)
    np.maximum.at(peak, which, values)
    keep = np.isfinite(peak)
    return edges[:-1][keep].astype(np.int64), peak[keep]


def _host_stage_bands(parsed: Any) -> pd.DataFrame:
    """Time ranges of each stage on any host thread (their union per stage), at about a pixel's resolution.

    Without host threads (a GPU-only trace) the GPU streams are used.
    """
    tracks, gap = _timeline_intervals(parsed)
    intervals = tracks.intervals
    if intervals.empty:
        return intervals
    host = tracks.tracks.loc[tracks.tracks["kind"] == "host", "track"]
    if len(host):
        intervals = intervals[intervals["track"].isin(host)]
    frames = []
    for stage, group in intervals.groupby("stage", observed=True):
        g = group.sort_values("start_ns")
        start, end = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        reach = np.maximum.accumulate(end)
        new = np.r_[True, start[1:] > reach[:-1] + gap]
        first = np.flatnonzero(new)
        frames.append(
            pd.DataFrame(
                {
                    "stage": str(stage),
                    "start_ns": start[first],
                    "end_ns": np.maximum.reduceat(end, first),
                }
            )
        )
    out = pd.concat(frames, ignore_index=True)
    # paint "other" first so the training stages stay visible where they overlap it
    out["stage"] = pd.Categorical(out["stage"], categories=["other", *[s for s in STAGES if s != "other"]])
    return out.sort_values(["stage", "start_ns"], kind="stable").reset_index(drop=True)


def _stage_bands(ax: Any, bands: pd.DataFrame, origin: int, scale: float) -> list[str]:
    """Shade the x range of each stage interval in ``bands``. Returns the stages shown."""
    present = []
    for stage, group in bands.groupby("stage", observed=True, sort=True):
        for s, e in zip(group["start_ns"], group["end_ns"], strict=True):
            ax.axvspan((s - origin) / scale, (e - origin) / scale, color=STAGE_COLORS[str(stage)], alpha=0.18, lw=0)
        present.append(str(stage))
    return [s for s in STAGES if s in present]


def plot_memory(parsed: Any) -> tuple[Figure | None, str | None]:
    """Allocated memory (``Total Allocated`` of ``[memory]`` events) over time, one panel per device."""
    import matplotlib.pyplot as plt

    series = _memory_series(parsed)
    if not series:
        return None, "no [memory] events (capture with profile_memory=True)"
    peaks = {label: float(np.abs(values).max()) if len(values) else 0.0 for label, _, values in series}
    series = [item for item in series if peaks[item[0]] >= MIN_MEMORY_BYTES]
    if not series:
        return (
            None,
            f"[memory] events never reach {MIN_MEMORY_BYTES >> 10} KiB allocated (peak {max(peaks.values()):,.0f} B)",
        )
    events = parsed.raw.events
    timed = events["ts_ns"].to_numpy()[(events["kind"] != "metadata").to_numpy()]
    origin = int(timed.min())
    span = int(timed.max()) - origin
    scale, unit = time_unit(span)
    bands = _host_stage_bands(parsed)
    fig, axes = plt.subplots(
        len(series), 1, figsize=(13, 1.6 + 2.6 * len(series)), sharex=True, squeeze=False, layout="constrained"
    )
    for i, (ax, (label, ts, values)) in enumerate(zip(axes[:, 0], series, strict=True)):
        ts, values = _reduce_series(ts, values, MAX_MEMORY_POINTS)
        bscale, bunit = _fmt_bytes(float(np.abs(values).max()) if len(values) else 0)
        present = _stage_bands(ax, bands, origin, scale)
        ax.step((ts - origin) / scale, values / bscale, where="post", color="#222222", linewidth=1.2)
        peak = int(np.argmax(values))
        ax.annotate(
            f"peak {values[peak] / bscale:,.1f} {bunit}",
            xy=((ts[peak] - origin) / scale, values[peak] / bscale),
            xytext=(6, -2),
            textcoords="offset points",
            fontsize=8,
            va="top",
        )
        ax.set_ylabel(f"{label}\nallocated ({bunit})")
        low, high = min(float(values.min()), 0.0) / bscale, max(float(values.max()), 0.0) / bscale
        ax.set_ylim(low * 1.15, high * 1.15 if high > 0 else 1)
        ax.grid(alpha=0.25)
        if i == 0:
            _stage_legend(ax, present, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1, 0].set_xlabel(f"time since first event ({unit})")
    axes[-1, 0].set_xlim(0, span / scale)
    fig.suptitle(f"Memory allocated over time, stages shaded: {_trace_title(parsed)}")
    return fig, None


def _stage_value_frame(table: pd.DataFrame, label_cols: Sequence[str], value_cols: Sequence[str]) -> Any:
    label = next((c for c in label_cols if c in table.columns), None)
    value = next((c for c in value_cols if c in table.columns), None)
    return label, value


def _layer_depth(table: pd.DataFrame) -> int:
    """The shallowest module depth where one class has several instances: the model's repeated blocks
    (``Qwen2DecoderLayer_0..N`` under ``Qwen2Model``, ResNet's ``layer1..4``)."""
    if "depth" not in table.columns or "class" not in table.columns:
        return -1
    per = table.drop_duplicates("module").groupby(["depth", "class"]).size()
    repeated = per[per >= 2]
    if len(repeated):
        return int(repeated.index.get_level_values(0).min())
    return int(per.idxmax()[0]) if len(per) else -1


def plot_layers(parsed: Any) -> tuple[Figure | None, str | None]:
    """Forward and backward time per module at the depth of the repeated layers (the analyses' ``modules``)."""
    import matplotlib.pyplot as plt

    table = optional_table(parsed, "modules")
    if table is None:
        return None, "no nn.Module events (capture with with_stack=True or with_modules=True)"
    if "module" not in table.columns or "stage" not in table.columns:
        return None, f"modules table has no module/stage columns ({', '.join(map(str, table.columns))})"
    gpu = "gpu_ns" in table.columns and table["gpu_ns"].sum() > 0
    value = "gpu_ns" if gpu else next((c for c in ("host_ns", "time_ns", "dur_ns") if c in table.columns), None)
    if value is None:
        return None, "modules table has no time column"
    depth = _layer_depth(table)
    sub = table[table["depth"] == depth] if depth >= 0 else table
    stage = sub["stage"].astype(str)
    if "recompute" in sub.columns:
        stage = stage.where(~sub["recompute"].astype(bool), "backward (recompute)")
    sub = sub.assign(series=stage)
    series = [s for s in ("forward", "backward", "backward (recompute)") if (sub["series"] == s).any()]
    if not series:
        return None, "no forward or backward rows in the modules table"
    sub = sub[sub["series"].isin(series)]
    wide = sub.pivot_table(index="module", columns="series", values=value, aggfunc="sum", sort=False)
    wide = wide.reindex(columns=series).fillna(0).astype(float)
    if "first_ts_ns" in sub.columns:
        first = sub.groupby("module", sort=False)["first_ts_ns"].min()
        wide = wide.loc[first.reindex(wide.index).sort_values(kind="stable").index]
    hidden = 0
    if len(wide) > 60:
        hidden = len(wide) - 60
        keep = wide.sum(axis=1).sort_values(ascending=False).index[:60]
        wide = wide.loc[[m for m in wide.index if m in set(keep)]]
    scale, unit = time_unit(float(wide.to_numpy().max()))
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.32 * len(wide) * max(1, len(series) / 2)), layout="constrained")
    y = np.arange(len(wide))
    h = 0.8 / len(series)
    colors = {"forward": STAGE_COLORS["forward"], "backward": STAGE_COLORS["backward"]}
    for j, name in enumerate(series):
        ax.barh(
            y + (j - (len(series) - 1) / 2) * h,
            wide[name] / scale,
            height=h,
            color=colors.get(name, _shade(STAGE_COLORS["backward"], 0.45)),
            hatch="//" if "recompute" in name else "",
            edgecolor="white",
            linewidth=0.5,
            label=name,
        )
    ax.set_yticks(y, [shorten_name(str(i), 44, kernel=False) for i in wide.index])
    ax.set_ylim(len(wide) - 0.5, -0.5)
    what = "GPU time launched" if gpu else "host time"
    ax.set_xlabel(f"{what} ({unit}), all steps")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(title="stage", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    more = f" ({hidden} smaller modules not shown)" if hidden else ""
    ax.set_title(f"Forward / backward {what} per module at depth {depth}{more}: {_trace_title(parsed)}")
    return fig, None


def plot_load(parsed: Any) -> tuple[Figure | None, str | None]:
    """Loading sub-steps (the analyses' ``load_breakdown``): time per sub-step, in order."""
    import matplotlib.pyplot as plt

    table = optional_table(parsed, "load_breakdown")
    if table is None:
        if not hasattr(type(parsed), "load_breakdown"):
            return None, "no load_breakdown table in this version of profparse"
        return None, "no loading sub-steps (no load stage, or no Python frames to split it: capture with_stack=True)"
    label, value = _stage_value_frame(
        table, ("substep", "sub_step", "name", "step_name"), ("dur_ns", "time_ns", "wall_ns", "total_ns")
    )
    if label is None or value is None:
        if label is not None and {"start_ns", "end_ns"} <= set(table.columns):
            table = table.assign(dur_ns=table["end_ns"] - table["start_ns"])
            value = "dur_ns"
        else:
            return None, f"load_breakdown has no sub-step/time columns ({', '.join(map(str, table.columns))})"
    grouped = table.groupby(label, sort=False)[value].sum()
    if "start_ns" in table.columns:
        grouped = grouped.reindex(table.groupby(label, sort=False)["start_ns"].min().sort_values().index)
    grouped = grouped[grouped > 0]
    if grouped.empty:
        return None, "load_breakdown has no time"
    scale, unit = time_unit(float(grouped.max()))
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.4 * len(grouped)), layout="constrained")
    y = np.arange(len(grouped))
    total = float(grouped.sum())
    ax.barh(y, grouped.to_numpy(dtype=float) / scale, color=STAGE_COLORS["load"], height=0.7)
    for yi, v in zip(y, grouped.to_numpy(dtype=float), strict=True):
        ax.text(v / scale, yi, f"  {v / scale:,.2f} {unit}  {v / total:.0%}", va="center", fontsize=8)
    ax.set_yticks(y, unique_labels([str(i) for i in grouped.index], 44))
    ax.invert_yaxis()
    ax.set_xlim(0, grouped.max() / scale * 1.25)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(f"Loading sub-steps ({_fmt_time(total)} in all): {_trace_title(parsed)}")
    return fig, None


MAKERS: dict[str, Maker] = {
    "stages": plot_stages,
    "timeline": plot_timeline,
    "top_kernels": plot_top_kernels,
    "top_ops": plot_top_ops,
    "memory": plot_memory,
    "layers": plot_layers,
    "load": plot_load,
}


@dataclass
class PlotResult:
    """What one kind produced: its files, or why it was skipped."""

    kind: str
    files: list[Path] = field(default_factory=list)
    skipped: str | None = None


def make_figure(parsed: Any, kind: str) -> tuple[Figure | None, str | None]:
    """Build one figure (Agg backend); returns (figure, None) or (None, why it was skipped)."""
    if kind not in MAKERS:
        raise ValueError(f"unknown plot kind {kind!r}; expected one of {', '.join(PLOT_KINDS)}")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    with plt.rc_context(_style()):
        return MAKERS[kind](parsed)


def save_figure(fig: Figure, base: Path, formats: Sequence[str] = FORMATS, dpi: int = 120) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    try:
        with plt.rc_context(_style()):
            for fmt in formats:
                path = base.with_suffix(f".{fmt}")
                fig.savefig(path, format=fmt, dpi=dpi, bbox_inches="tight", facecolor="white")
                paths.append(path)
    finally:
        plt.close(fig)
    return paths


def write_plots(
    parsed: Any,
    out_dir: str | Path,
    *,
    kinds: Sequence[str] | None = None,
    formats: Sequence[str] = FORMATS,
    force: bool = False,
    dpi: int = 120,
) -> list[PlotResult]:
    """Write ``<kind>.png`` / ``<kind>.svg`` for each kind into ``out_dir`` (created atomically)."""
    kinds = list(kinds) if kinds else list(PLOT_KINDS)
    for kind in kinds:
        if kind not in MAKERS:
            raise ValueError(f"unknown plot kind {kind!r}; expected one of {', '.join(PLOT_KINDS)}")
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    results = []
    target = Path(out_dir)
    owns = [f"{kind}.{fmt}" for kind in kinds for fmt in formats]  # --kind X --force replaces only X's files
    with atomic_dir(target, force=force, verb="plot", inputs=[parsed.path], owns=owns) as tmp:
        for kind in kinds:
            fig, why = make_figure(parsed, kind)
            if fig is None:
                results.append(PlotResult(kind, skipped=why))
                continue
            files = save_figure(fig, tmp / kind, formats, dpi)
            results.append(PlotResult(kind, files=[target / f.name for f in files]))
    return results
