"""Interval math on half-open ``[start, end)`` int64 intervals, vectorised: sort once, then sweep.

Many groups (threads, devices, steps) are handled in one pass by laying them end to end on one line
(:func:`on_one_line`): group ``g`` occupies ``[g * span, (g + 1) * span)``, so a single running maximum covers all.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Packed keys stay below this, so that ``group * span + offset`` never overflows an int64.
KEY_LIMIT = 2**62


def group_start_order(group: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting by (group, start, index), like ``np.lexsort((start, group))`` but in one pass when
    (group, start) fits in one int64 key."""
    if not len(start):
        return np.zeros(0, dtype=np.intp)
    s0 = int(start.min())
    span = int(start.max()) - s0 + 1
    if int(group.min()) >= 0 and (int(group.max()) + 1) * span < KEY_LIMIT:
        key = group.astype(np.int64)
        key *= span
        key += start
        key -= s0
        return np.argsort(key, kind="stable")
    return np.lexsort((start, group))


def on_one_line(
    group: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    out: bool = False,
    *,
    base: int | None = None,
    span: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``start`` and ``end`` shifted so that groups lie far apart on one line (group ``g`` in ``[g * span, (g + 1) *
    span)``, less ``base``): one sweep then covers them all. ``base`` and ``span`` default to those of these
    intervals (pass them to lay two sets of intervals on the same line). ``out``: overwrite ``start`` and ``end``
    instead of copying them."""
    if not len(start):
        return start, end
    base = start.min() if base is None else base
    span = int(end.max() - base) + 1 if span is None else span
    shift = group.astype(np.int64)
    shift *= span
    shift -= base
    if not out:
        return start + shift, end + shift
    start += shift
    end += shift
    return start, end


def line_union(start: np.ndarray, end: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Union length per run starting at ``heads`` of intervals sorted by start on one line (:func:`on_one_line`).
    ``start`` and ``end`` are overwritten."""
    reach = np.maximum.accumulate(end)
    np.maximum(start[1:], reach[:-1], out=start[1:])  # where each interval's new coverage starts
    del reach
    np.subtract(end, start, out=end)
    np.maximum(end, 0, out=end)  # covered
    return np.add.reduceat(end, heads)


def union_length(group: np.ndarray, start: np.ndarray, end: np.ndarray, groups: int) -> np.ndarray:
    """Total length covered by the union of [start, end) intervals, per group id in ``range(groups)``."""
    out = np.zeros(groups, dtype=np.int64)
    if len(start) == 0:
        return out
    if _sorted_by_group_start(group, start):  # as most callers pass them: no order and no copy of the groups
        g = group
        s, e = start.astype(np.int64), end.astype(np.int64)  # copies: the sweep overwrites them
    else:
        order = group_start_order(group, start)
        g = group[order]
        s = start[order].astype(np.int64, copy=False)
        e = end[order].astype(np.int64, copy=False)
        del order
    heads = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
    s, e = on_one_line(g, s, e, out=True)
    out[g[heads]] = line_union(s, e, heads)
    return out


def _sorted_by_group_start(group: np.ndarray, start: np.ndarray) -> bool:
    """Whether rows are sorted by (group, start). Rows of equal start may come in any order: the union is the
    same."""
    later_group = group[1:] > group[:-1]
    return bool(((group[1:] == group[:-1]) & (start[1:] >= start[:-1]) | later_group).all())


def group_running_max(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting at each new ``group`` (rows sorted by group)."""
    if len(values) == 0:
        return values.copy()
    rank = np.concatenate([[0], np.cumsum(group[1:] != group[:-1])]).astype(np.int64)
    low = int(values.min())
    span = int(values.max()) - low + 1
    if (int(rank[-1]) + 1) * span < KEY_LIMIT:  # groups laid end to end on one line: one accumulate for all
        shifted = rank * span + (values - low)
        return np.maximum.accumulate(shifted) - rank * span + low
    return pd.Series(values).groupby(rank).cummax().to_numpy()


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [start, end) (input sorted by start)."""
    if not len(start):
        return start, end
    reach = np.maximum.accumulate(end)
    new = np.concatenate([[True], start[1:] > reach[:-1]])  # starts after everything before it ended
    heads = np.flatnonzero(new)
    return start[heads], np.maximum.reduceat(end, heads)


def union_pieces(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals in any order as sorted disjoint pieces of positive length (touching
    ones joined): :func:`merge`, sorting first only where the starts are out of order."""
    if (start[1:] < start[:-1]).any():
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    start, end = merge(start, end)
    keep = end > start
    return start[keep], end[keep]


def coverage(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted intervals [starts, ends) lying before each point ``x``."""
    if not len(starts):
        return np.zeros(len(x), dtype=np.int64)
    length = ends - starts
    before = np.concatenate([[0], np.cumsum(length)])
    if len(x) > 8 * len(starts) and _ascending(x):
        # the starts at or before each point, counted from where each start falls among the points: a search per
        # interval, not per point (millions of points against a few hundred intervals: half the time)
        i = np.cumsum(np.bincount(np.searchsorted(x, starts, side="left"), minlength=len(x) + 1)[:-1]) - 1
    else:
        i = np.searchsorted(starts, x, side="right") - 1
    at = np.maximum(i, 0)
    inside = np.minimum(np.maximum(x - starts[at], 0), length[at])  # np.clip, without its overhead
    return np.where(i >= 0, before[at] + inside, 0)


def _ascending(x: np.ndarray) -> bool:
    """``x`` is sorted ascending (and, as floats, ends in a number: NaN sorts last but compares as unordered)."""
    if x.dtype.kind == "f" and len(x) and np.isnan(x[-1]):
        return False
    return not (x[1:] < x[:-1]).any()


def group_union(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of [start, end) per group id as disjoint pieces: (group, start, end), sorted by group then
    start."""
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    base = int(s.min())
    span = int(e.max()) - base + 1
    if (int(g.max()) + 1) * span < KEY_LIMIT:  # groups end to end on one line: one sweep merges them all
        ps, pe = merge(*on_one_line(g, s, e, base=base, span=span))
        pg = ps // span
        return pg, ps - pg * span + base, pe - pg * span + base
    pieces = [(np.full(len(a), k), a, b) for k in np.unique(g) for a, b in [merge(s[g == k], e[g == k])]]
    return tuple(np.concatenate(p) for p in zip(*pieces, strict=True))


def clip_disjoint(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals sorted by (track, start) -> (starts clipped to the end of everything before them on the track,
    which to keep: those not left empty)."""
    if len(track) == 0:
        return start, np.ones(0, dtype=bool)
    reach = group_running_max(track, end)
    before = np.full(len(track), np.iinfo(np.int64).min)
    same = np.r_[False, track[1:] == track[:-1]]
    before[same] = reach[:-1][same[1:]]
    clipped = np.maximum(start, before)
    keep = (end > clipped) | ((end == start) & (start >= before))
    return clipped, keep
