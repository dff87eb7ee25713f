"""Roofline: arithmetic intensity (FLOPs per byte) against achieved TFLOP/s per op name and stage, with the device's
compute peak and memory-bandwidth roof (from :mod:`profparse.analysis.peaks`, or ``--peak-tflops``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.arrays import as_text
from profparse.base.names import unique_labels
from profparse.outputs.views._common import STAGE_COLORS

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "roofline"
TITLE = "Roofline: arithmetic intensity vs achieved TFLOP/s per op and stage"
MAX_POINTS = 400  # the ops with the most time; the rest are too small to read
#: an op under this share of the lowest roof is drawn on the plot's bottom edge: such ops (a scalar's step counter, a
#: one-element kernel) are all launch latency, and drawn where they are they stretched the axis over 9 decades
FLOOR_OF_ROOF = 1e-3
LABELLED = 5  # the op names written beside their point: those with the most time
LABEL_PT = 7  # the names' font size, and the width of one character of it (points, about)
LABEL_CHAR_PT = 0.6 * LABEL_PT


def data(parsed: ParsedTrace) -> tuple[dict[str, Any] | None, str | None]:
    """One point per (op name, stage, math mode) with FLOPs, bytes and time (GPU time; host time on CPU-only traces),
    its label as ``summarize`` shortens op names, and the roof at its intensity (``roof_tflops``: the lower of its math
    mode's peak and intensity x memory bandwidth; ``of_roof``: achieved / roof; NaN where the peak is not known)."""
    flops = parsed.flops
    counted = flops[flops["status"].isin(["counted", "backward via forward op"]) & flops["on_device"]]
    basis = "GPU" if (counted["gpu_ns"] > 0).any() else "host"
    time = "gpu_ns" if basis == "GPU" else "host_ns"
    counted = counted[(counted["flops"] > 0) & (counted["bytes"] > 0) & (counted[time] > 0)]
    if counted.empty:
        return None, "no op with FLOPs, bytes and time (the trace needs record_shapes=True)"
    keys = ["name", "stage"] + (["math_mode"] if "math_mode" in counted.columns else [])
    grouped = counted.groupby(keys, observed=True).agg(
        count=("flops", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"), time_ns=(time, "sum")
    )
    points = grouped.reset_index().sort_values("time_ns", ascending=False, kind="stable").head(MAX_POINTS)
    points = points.assign(
        name=as_text(points["name"]),
        stage=points["stage"].astype(str),
        intensity=points["flops"] / points["bytes"],
        tflops=points["flops"] / points["time_ns"] / 1e3,
    ).reset_index(drop=True)
    peak = parsed.peak
    known = bool(np.isfinite(peak.tflops))
    bandwidth = float(peak.memory_gbps) if known and np.isfinite(peak.memory_gbps) else np.inf
    modes = points["math_mode"].astype(str) if "math_mode" in points.columns else pd.Series("", index=points.index)
    points["math_mode"] = modes
    by_mode = hasattr(peak, "roofs") and known
    compute = peak.roofs(modes) if by_mode else np.full(len(points), float(peak.tflops) if known else np.nan)
    roof = np.minimum(compute, points["intensity"].to_numpy() * bandwidth / 1e3)
    mode_peaks = {m: float(v) for m, v in zip(modes, compute, strict=True) if np.isfinite(v)} if by_mode else {}
    names = list(dict.fromkeys(points["name"]))  # one label per op name, the same in every stage
    labels = dict(zip(names, unique_labels(names, kernel=False), strict=True))
    points.insert(1, "label", points["name"].map(labels))
    points = points.assign(roof_tflops=roof, of_roof=points["tflops"].to_numpy() / roof)
    return {
        "points": points,
        "basis": basis,
        "peak_tflops": float(peak.tflops) if known else None,
        "mode_peaks": dict(sorted(mode_peaks.items(), key=lambda kv: -kv[1])),  # each math mode's compute roof
        "memory_gbps": float(peak.memory_gbps) if known and np.isfinite(peak.memory_gbps) else None,
        "peak_note": peak.note,
        "trace": str(parsed.path),
    }, None


def floor_tflops(points: pd.DataFrame) -> float | None:
    """The lowest TFLOP/s the plot shows: :data:`FLOOR_OF_ROOF` of the lowest roof among ``points``; None without a
    known roof or where no point lies below it."""
    roofs = points["roof_tflops"].to_numpy(dtype=np.float64)
    roofs = roofs[np.isfinite(roofs) & (roofs > 0)]
    if not len(roofs):
        return None
    floor = FLOOR_OF_ROOF * float(roofs.min())
    return floor if bool((points["tflops"] < floor).any()) else None


def draw(prepared: dict[str, Any]) -> Any:
    """Log-log scatter, one colour per stage, marker area by time; horizontal compute peak, diagonal memory roof;
    ops under :func:`floor_tflops` as triangles on the bottom edge."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    points: pd.DataFrame = prepared["points"]
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    area = 20 + 400 * points["time_ns"] / points["time_ns"].max()
    floor = floor_tflops(points)
    under = points["tflops"] < floor if floor is not None else pd.Series(False, index=points.index)
    for stage, group in points.groupby("stage", sort=False):
        color = STAGE_COLORS.get(stage, "#555555")
        shown = group[~under[group.index]]
        ax.scatter(shown["intensity"], shown["tflops"], s=area[shown.index], color=color, alpha=0.7,
                   edgecolors="none", label=stage)  # fmt: skip
        low = group[under[group.index]]
        if len(low):
            ax.scatter(low["intensity"], np.full(len(low), floor), s=30, marker="v", color=color, alpha=0.7,
                       edgecolors="none", clip_on=False)  # fmt: skip
    lo, hi = points["intensity"].min() / 2, points["intensity"].max() * 2
    peak, bandwidth = prepared["peak_tflops"], prepared["memory_gbps"]
    roofs = prepared.get("mode_peaks") or ({"": peak} if peak else {})
    for (mode, value), style in zip(roofs.items(), ("--", ":", "-.", (0, (5, 1, 1, 1))), strict=False):
        named = f"{mode} " if len(roofs) > 1 else ""  # one roof: as before; several: each names its math mode
        ax.axhline(value, color="black", linestyle=style, linewidth=1, label=f"{named}peak {value:g} TFLOP/s")
    peak = max(roofs.values()) if roofs else None
    if bandwidth:
        x = np.geomspace(lo, hi, 64)
        roof = x * bandwidth / 1e3  # FLOP/byte x GB/s = GFLOP/s; / 1e3 = TFLOP/s
        ax.plot(x, np.minimum(roof, peak) if peak else roof, color="grey", linewidth=1,
                label=f"memory {bandwidth:g} GB/s")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")  # the style turns mathtext off, so log ticks are written plainly
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
    ax.set_xlim(lo, hi)
    xlabel = "arithmetic intensity (FLOPs / byte)"
    if floor is not None:
        ax.set_ylim(bottom=floor / 1.6)  # the triangles sit on the floor, whole
        count = int(under.sum())
        xlabel += (
            f"\n{count} (op, stage) point{'s' if count != 1 else ''} under {floor:.2g} TFLOP/s"
            f" ({FLOOR_OF_ROOF:.1%} of the lowest roof) drawn on the bottom edge (triangles)"
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"achieved TFLOP/s ({prepared['basis']} time)")
    _label_top_ops(ax, points[~under], area, LABELLED)  # after the limits: labels are placed in display space
    ax.set_title(f"{TITLE}\n{prepared['peak_note']}", fontsize=9)
    legend = ax.legend(fontsize=8, loc="lower right")
    handles = legend.legend_handles if hasattr(legend, "legend_handles") else legend.legendHandles  # < 3.7
    for handle in handles:
        if hasattr(handle, "set_sizes"):  # stage markers at one size, not the size of each stage's first point
            handle.set_sizes([60])
    ax.grid(True, which="both", alpha=0.2)
    return fig


def _label_top_ops(ax: Any, points: pd.DataFrame, area: pd.Series, count: int) -> None:
    """Name the ``count`` ops with the most time, each once (at its point with the most time), beside its marker:
    on its right, else on its left where the name would leave the plot or cover a name already written; a name
    that fits on neither side is left out (two names printed over each other are neither readable)."""
    written: list[tuple[float, float, float, float]] = []  # the names' boxes in display pixels: x0, x1, y0, y1
    left, right = ax.transAxes.transform((0, 0))[0], ax.transAxes.transform((1, 0))[0]
    px = ax.figure.dpi / 72  # pixels per point
    for row in points.drop_duplicates("name").itertuples():  # points come sorted by time, the most first
        if len(written) == count:
            break
        text = str(row.label).removeprefix("aten::")
        x, y = ax.transData.transform((row.intensity, row.tflops))
        gap = (float(np.sqrt(area[row.Index])) / 2 + 2) * px  # a marker's size is its area in points squared
        width, half = LABEL_CHAR_PT * len(text) * px, LABEL_PT * 0.65 * px
        for x0, ha in ((x + gap, "left"), (x - gap - width, "right")):
            box = (x0, x0 + width, y - half, y + half)
            if left <= box[0] and box[1] <= right and not any(_overlap(box, other) for other in written):
                written.append(box)
                offset = (gap if ha == "left" else -gap) / px
                ax.annotate(text, (row.intensity, row.tflops), fontsize=LABEL_PT, va="center", ha=ha,
                            xytext=(offset, 0), textcoords="offset points")  # fmt: skip
                break


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    """Two boxes (x0, x1, y0, y1) share some area."""
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
