"""View: the critical path of each step over time, coloured by what bounds it, and its make-up per stage and step.

``data`` reads the ``critical_path`` table (:mod:`profparse.analysis.critical_path`). Its segments tile each step,
so a page can draw them as one row under the timeline's time axis. They are aggregated to about a pixel:
consecutive segments of one bound merge, and a run of segments each shorter than a pixel (1/``pixels`` of the
steps' span) in the same pixel merges into one span labelled by the bound with most time in it. The coarser
``gap`` is chosen while more than ``max_rects`` spans remain. The merged spans still tile the steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.analysis.critical_path import BOUNDS
from profparse.base.arrays import as_text, category_codes, text_codes
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.outputs.views._common import (
    Figure,
    Prepared,
    fmt_time,
    mark_steps,
    step_windows,
    style,
    thinned_ticks,
    time_unit,
    trace_title,
)

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "critical_path"
TITLE = "Critical path: what bounds each step"
MAX_RECTS = 6000
NAME_WIDTH = 80  # event names shortened as summarize shortens them (a kernel without its template arguments)
GPU_BOUNDS = frozenset({"gpu_compute", "gpu_comm", "memcpy"})
#: One colour per bound (Paul Tol's muted palette, readable with colour-blindness); GPU idle a pale grey.
BOUND_COLORS: dict[str, str] = {
    "python": "#88CCEE",
    "cpu_op": "#332288",
    "launch": "#44AA99",
    "gpu_compute": "#CC6677",
    "gpu_comm": "#AA4499",
    "memcpy": "#DDCC77",
    "sync_wait": "#882255",
    "data": "#117733",
    "gpu_idle": "#CCCCCC",
}


def _runs(path: pd.DataFrame, gap: int, origin: int) -> pd.DataFrame:
    """Contiguous segments of one step merged: same bound always, any bounds when each is shorter than ``gap``
    and they start in the same ``gap``-wide bin. One row per span: start, end, bound (most time), stage and
    event name (of its longest segment), segments merged."""
    # numpy on the columns' codes, each temporary given back once read: grouping a frame of the path's rows by
    # span and bound held several copies of them (the page's peak on a big trace)
    start = path["start_ns"].to_numpy(np.int64)
    end = path["end_ns"].to_numpy(np.int64)
    step = path["step"].to_numpy(np.int64)
    bound, bound_texts = category_codes(path["bound"])
    ns = end - start
    joined = np.zeros(len(path), dtype=bool)
    joined[1:] = (step[1:] == step[:-1]) & (start[1:] == end[:-1])
    short = ns < gap
    pixel = start - origin
    pixel //= max(gap, 1)
    merged = short[1:] & short[:-1] & (pixel[1:] == pixel[:-1])
    del short, pixel
    merged |= bound[1:] == bound[:-1]
    joined[1:] &= merged
    del merged
    first = np.flatnonzero(~joined)
    del joined
    last = np.r_[first[1:], len(path)] - 1
    longest = _first_longest(ns, first)
    return pd.DataFrame(
        {
            "start_ns": start[first] - origin,
            "end_ns": end[last] - origin,
            "bound": bound_texts[_top_bound(ns, bound, first, len(bound_texts))],
            "stage": path["stage"].take(longest).astype(str).to_numpy(),
            "step": step[first],
            "name": as_text(path["name"].take(longest)).to_numpy(),
            "segments": np.diff(np.r_[first, len(path)]),
        }
    )


def _top_bound(ns: np.ndarray, bound: np.ndarray, first: np.ndarray, count: int) -> np.ndarray:
    """Per run of rows (``first``: each run's first row), the code of the bound with most time in it; of equals
    the one that comes first in the run. One pass per code (a handful), summed in integers."""
    best = np.zeros(len(first), dtype=np.int64)
    best_ns = np.full(len(first), -1, dtype=np.int64)
    best_at = np.full(len(first), len(ns), dtype=np.int64)
    position = np.arange(len(ns))
    for code in range(count):
        mine = bound == code
        if not mine.any():
            continue
        total = np.add.reduceat(np.where(mine, ns, 0), first)
        at = np.minimum.reduceat(np.where(mine, position, len(ns)), first)
        better = (at < len(ns)) & ((total > best_ns) | ((total == best_ns) & (at < best_at)))
        best[better], best_ns[better], best_at[better] = code, total[better], at[better]
    return best


def _first_longest(ns: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per run of consecutive rows (``first``: each run's first row), the row of its longest segment, the first
    of equals (as a stable sort by run, then length, would put first)."""
    if not len(ns):
        return ns
    group = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(ns)]))
    longest = np.maximum.reduceat(ns, first)
    at = np.flatnonzero(ns == longest[group])
    return at[np.r_[True, group[at][1:] != group[at][:-1]]]


def _per_step(path: pd.DataFrame, bounds: list[str]) -> pd.DataFrame:
    """ns on the path per step (index) and bound (columns, in ``bounds`` order)."""
    ns = path["end_ns"].to_numpy(np.int64) - path["start_ns"].to_numpy(np.int64)
    codes, texts = category_codes(path["bound"])
    step = path["step"].to_numpy(np.int64)
    if not (step[1:] >= step[:-1]).all():
        order = np.argsort(step, kind="stable")
        ns, codes, step = ns[order], codes[order], step[order]
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    code_of = {str(t): c for c, t in enumerate(texts)}
    columns = {
        b: np.add.reduceat(np.where(codes == code_of[b], ns, 0), first)
        if b in code_of
        else np.zeros(len(first), dtype=np.int64)
        for b in bounds
    }
    return pd.DataFrame(columns, index=pd.Index(step[first], name="step"), dtype="int64")


def data(parsed: ParsedTrace, max_rects: int | None = None, pixels: int = 2000) -> tuple[Prepared | None, str | None]:
    """The path's spans over time (start/end ns since ``origin_ns``, the first step's start; bound, stage, step,
    as codes in ``bounds`` / ``stages`` / ``names``: the bound with most time, the stage and name of the longest
    segment; segments merged), the ns on the path per step and bound, the steps, and the merge gap."""
    path = parsed.table("critical_path")
    if path.empty:
        return None, "no step has a critical path (no ProfilerStep# or optimizer step marks)"
    step, start = path["step"].to_numpy(), path["start_ns"].to_numpy()
    if not ((step[1:] > step[:-1]) | ((step[1:] == step[:-1]) & (start[1:] >= start[:-1]))).all():
        path = path.sort_values(["step", "start_ns"], kind="stable").reset_index(drop=True)
    del step, start  # the table comes sorted, and a sorted copy of all its columns is as big as the table
    origin = int(path["start_ns"].min())
    span = int(path["end_ns"].max()) - origin
    limit = MAX_RECTS if max_rects is None else max_rects
    gap = max(span // pixels, 1)
    spans = _runs(path, gap, origin)
    while len(spans) > limit and gap < span:
        gap *= 4
        spans = _runs(path, gap, origin)
    codes, names = pd.factorize(spans.pop("name"), sort=False)  # each name once: the page stays small
    spans["name"] = codes.astype(np.int64)
    kernel = spans.groupby("name", sort=True)["bound"].first().isin(GPU_BOUNDS).to_numpy()
    short = [shorten_name(str(n), NAME_WIDTH, kernel=bool(k)) for n, k in zip(names, kernel, strict=True)]
    present = set(text_codes(path["bound"])[1])
    bounds = [b for b in BOUNDS if b in present]
    spans["bound"] = pd.Categorical(spans["bound"], categories=bounds).codes.astype(np.int64)  # a code in bounds
    spans["stage"] = pd.Categorical(spans["stage"], categories=list(STAGES)).codes.astype(np.int64)  # in stages
    steps = parsed.steps
    step_rows = step_windows(steps[steps["step"].isin(path["step"].unique())], origin)
    return {
        "title": trace_title(parsed),
        "spans": spans,
        "names": short,
        "per_step": _per_step(path, bounds),
        "steps": step_rows,
        "bounds": bounds,
        "stages": list(STAGES),
        "colors": {b: BOUND_COLORS[b] for b in BOUNDS},
        "origin_ns": origin,
        "span_ns": span,
        "gap_ns": int(gap),
        "segments": len(path),
    }, None


def draw(prepared: Prepared) -> Figure:
    """Top: the path over time, one bar coloured by bound. Bottom: per step, the ms on the path by bound."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans, span = prepared["spans"], prepared["span_ns"]
    bounds, colors = prepared["bounds"], prepared["colors"]
    scale, unit = time_unit(span)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 6), layout="constrained", height_ratios=(0.7, 2.2))
    for code, group in spans.groupby("bound", sort=False):
        start = group["start_ns"].to_numpy(float)
        width = np.maximum((group["end_ns"] - group["start_ns"]).to_numpy(float), span / 1500)
        pairs = list(zip(start / scale, width / scale, strict=True))
        top.broken_barh(pairs, (0, 1), facecolors=colors[bounds[int(code)]], linewidth=0)
    mark_steps(top, prepared["steps"], scale, span, 1.05)
    top.set_xlim(0, span / scale * 1.005)
    top.set_yticks([])
    gap = fmt_time(prepared["gap_ns"])
    top.set_xlabel(f"time since the first step ({unit}); segments shorter than {gap} drawn by their main bound")
    top.set_title(f"{TITLE}: {prepared['title']}", pad=16)
    per_step = prepared["per_step"]
    step_scale, step_unit = time_unit(float(per_step.sum(axis=1).max()))
    left = np.zeros(len(per_step))
    rows = np.arange(len(per_step))
    edge = 0.4 if len(per_step) <= 60 else 0.0  # white edges would hide bars a pixel or two high
    for bound in bounds:
        values = per_step[bound].to_numpy(float) / step_scale
        bottom.barh(rows, values, left=left, color=colors[bound], edgecolor="white", linewidth=edge)
        left += values
    # one label per step where they fit, else every k-th (a long capture has hundreds of steps)
    shown = thinned_ticks(len(per_step), bottom.get_position().height * fig.get_figheight(), style()["ytick.labelsize"])
    bottom.set_yticks(shown, [f"step {per_step.index[i]}" for i in shown])
    bottom.set_ylim(len(per_step) - 0.5, -0.5)
    bottom.set_xlabel(f"time on the critical path ({step_unit})")
    handles = [Patch(facecolor=colors[b], label=b) for b in bounds]
    bottom.legend(handles=handles, title="bound", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig
