"""Roofline: arithmetic intensity (FLOPs per byte) against achieved TFLOP/s per op name and stage, with the device's
compute peak and memory-bandwidth roof (from :mod:`profparse.analysis.peaks`, or ``--peak-tflops``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.names import unique_labels
from profparse.outputs.views._common import STAGE_COLORS

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "roofline"
TITLE = "Roofline: arithmetic intensity vs achieved TFLOP/s per op and stage"
MAX_POINTS = 400  # the ops with the most time; the rest are too small to read


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
        name=points["name"].astype(str),
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


def draw(prepared: dict[str, Any]) -> Any:
    """Log-log scatter, one colour per stage, marker area by time; horizontal compute peak, diagonal memory roof."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    points: pd.DataFrame = prepared["points"]
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    area = 20 + 400 * points["time_ns"] / points["time_ns"].max()
    for stage, group in points.groupby("stage", sort=False):
        ax.scatter(group["intensity"], group["tflops"], s=area[group.index], color=STAGE_COLORS.get(stage, "#555555"),
                   alpha=0.7, edgecolors="none", label=stage)  # fmt: skip
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
    for i, row in enumerate(points.head(5).itertuples()):  # name the ops with the most time
        below = i % 2 == 1  # alternate above / below, so two neighbouring points do not print over each other
        ax.annotate(row.name.removeprefix("aten::"), (row.intensity, row.tflops), fontsize=7,
                    xytext=(4, -10 if below else 4), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")  # the style turns mathtext off, so log ticks are written plainly
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
    ax.set_ylabel(f"achieved TFLOP/s ({prepared['basis']} time)")
    ax.set_title(f"{TITLE}\n{prepared['peak_note']}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return fig
