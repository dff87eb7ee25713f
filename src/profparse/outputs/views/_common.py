"""Helpers every view shares: stage colours, time units, optional tables, the aggregated stage intervals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.formats import display
from profparse.base.marks import STAGES

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

#: One colour per stage, used by every plot and the HTML report (Okabe-Ito palette: readable for colour-blind viewers).
STAGE_COLORS: dict[str, str] = {
    "load": "#CC79A7",
    "forward": "#0072B2",
    "backward": "#E69F00",
    "optimizer": "#009E73",
    "other": "#999999",
}
MAX_RECTS = 6000  # aggregated stage intervals in the timeline, all tracks together

Figure = Any  # matplotlib.figure.Figure; imported lazily
Prepared = dict[str, Any]


def optional_table(parsed: ParsedTrace, name: str) -> pd.DataFrame | None:
    """``parsed.<name>`` when that table exists and has rows, else None (tables added by later analyses)."""
    try:
        table = getattr(parsed, name)
    except AttributeError:
        return None
    if not isinstance(table, pd.DataFrame) or table.empty:
        return None
    return table


def time_unit(max_ns: float) -> tuple[float, str]:
    """(divisor, label) so that ``max_ns`` reads well: s, ms or us."""
    if max_ns >= 5e9:
        return 1e9, "s"
    if max_ns >= 1e6:
        return 1e6, "ms"
    return 1e3, "µs"


def fmt_time(ns: float) -> str:
    scale, unit = time_unit(ns)
    value = ns / scale
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def fmt_bytes(n: float) -> tuple[float, str]:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return float(scale), unit
    return 1.0, "B"


def trace_title(parsed: ParsedTrace) -> str:
    name = display(Path(parsed.path).name)
    rank = f", rank {parsed.rank}" if parsed.rank is not None else ""
    return f"{name}{rank}"


def shade(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white by ``amount`` (0 = the colour, 1 = white)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def stage_legend(ax: Any, stages: Sequence[str], **kwargs: Any) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=STAGE_COLORS[s], label=s) for s in stages]
    if handles:
        ax.legend(handles=handles, title="stage", **kwargs)


def style() -> dict[str, Any]:
    """matplotlib rc settings of every figure."""
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


def timeline_intervals(parsed: ParsedTrace, max_rects: int | None = None, pixels: int = 2000) -> tuple[Any, int]:
    """Stage intervals merged to about a pixel (1/``pixels`` of the span); coarser while there are more than
    ``max_rects`` (default :data:`MAX_RECTS`). Returns (StageTracks, gap in ns)."""
    from profparse.analysis.stage_tracks import activity_span, stage_intervals

    limit = MAX_RECTS if max_rects is None else max_rects
    span = activity_span(parsed)  # the intervals' span, without merging them at gap 0 first (half the time)
    if span is None:
        return stage_intervals(parsed, gap_ns=0), 0
    gap = max(span // pixels, 1)
    tracks = stage_intervals(parsed, gap_ns=gap)
    while len(tracks.intervals) > limit and gap < span:
        gap *= 4
        tracks = stage_intervals(parsed, gap_ns=gap)
    return tracks, gap


def host_stage_bands(parsed: ParsedTrace) -> pd.DataFrame:
    """Time ranges of each stage on any host thread (their union per stage), at about a pixel's resolution.

    Without host threads (a GPU-only trace) the GPU streams are used. "other" comes first, so that painting in
    order keeps the training stages visible where they overlap it.
    """
    tracks, gap = timeline_intervals(parsed)
    intervals = tracks.intervals
    if intervals.empty:
        return pd.DataFrame({"stage": pd.Series(dtype=str), "start_ns": [], "end_ns": []})
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
            pd.DataFrame({"stage": str(stage), "start_ns": start[first], "end_ns": np.maximum.reduceat(end, first)})
        )
    out = pd.concat(frames, ignore_index=True)
    out["stage"] = pd.Categorical(out["stage"], categories=["other", *[s for s in STAGES if s != "other"]])
    out = out.sort_values(["stage", "start_ns"], kind="stable").reset_index(drop=True)
    out["stage"] = out["stage"].astype(str)
    return out


def stage_bands(ax: Any, bands: pd.DataFrame, origin: int, scale: float) -> list[str]:
    """Shade the x range of each stage interval in ``bands``. Returns the stages shown."""
    present = []
    for stage, group in bands.groupby("stage", sort=False):
        for s, e in zip(group["start_ns"], group["end_ns"], strict=True):
            ax.axvspan((s - origin) / scale, (e - origin) / scale, color=STAGE_COLORS[str(stage)], alpha=0.18, lw=0)
        present.append(str(stage))
    return [s for s in STAGES if s in present]


def step_windows(steps: pd.DataFrame, origin: int) -> pd.DataFrame:
    """The step windows (``step``, ``start_ns``, ``end_ns``) relative to ``origin``, as the timelines draw them."""
    return pd.DataFrame(
        {
            "step": steps["step"].to_numpy(np.int64),
            "start_ns": (steps["start_ns"] - origin).to_numpy(np.int64),
            "end_ns": (steps["end_ns"] - origin).to_numpy(np.int64),
        }
    )


#: a label's width per character, in font sizes (DejaVu Sans, matplotlib's default: digits 0.64, lower case ~0.6)
CHAR_WIDTH_EM = 0.62


def spaced(centers: Sequence[float], texts: Sequence[str], axis_units: float, fontsize: float) -> list[int]:
    """Which labels to draw, left to right, so that none runs into the one drawn before it: ``centers`` in the
    axis' data units, ``axis_units`` the data units per inch of the axis."""
    keep: list[int] = []
    last_end = -np.inf
    for i, (center, text) in enumerate(zip(centers, texts, strict=True)):
        half = (len(text) + 1) * CHAR_WIDTH_EM * fontsize / 72 * axis_units / 2  # a character's space on each side
        if center - half >= last_end:
            keep.append(i)
            last_end = center + half
    return keep


def mark_steps(
    ax: Any, steps: pd.DataFrame, scale: float, span: float, y: float, fontsize: float = 8, **line: Any
) -> None:
    """A dashed line at each step's start and ``step N`` over the middle of its part in ``[0, span]`` at height
    ``y`` (axes fraction), leaving out the labels that would run into the one before (hundreds of steps in a few
    inches) and those of steps outside the span (a label far off the axes would stretch the saved figure)."""
    from matplotlib.transforms import blended_transform_factory

    along = blended_transform_factory(ax.transData, ax.transAxes)
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    lo = np.maximum(steps["start_ns"].to_numpy(float), 0)
    hi = np.minimum(steps["end_ns"].to_numpy(float), span)
    shown = lo <= hi
    texts = [f"step {s}" for s in steps["step"].to_numpy()[shown]]
    middles = (lo + hi)[shown] / 2 / scale
    for start in steps["start_ns"].to_numpy(float):
        ax.axvline(start / scale, color="#333333", linestyle="--", linewidth=0.7, **line)
    for i in spaced(middles, texts, span / scale / max(width_in, 1e-9), fontsize):
        ax.text(middles[i], y, texts[i], transform=along, fontsize=fontsize, va="bottom", ha="center")


def thinned_ticks(count: int, height_in: float, fontsize: float) -> list[int]:
    """Every k-th of ``count`` rows (from the first) whose labels fit ``height_in`` inches at ``fontsize`` with a
    line's spacing each."""
    fits = max(int(height_in * 72 / (fontsize * 1.5)), 1)
    every = max(-(-count // fits), 1)
    return list(range(0, count, every))
