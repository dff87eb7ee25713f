"""Ancestor queries on the host event tree (``links.parent``, ``links.depth``): every walk up the tree is here.

Two ways, by how many rows ask:

- every row at once (``*_ancestor_of_kind``, :func:`has_ancestor_in`, :func:`ancestors_of`): level by level over
  :func:`depth_order`, one vectorised step per level (traces nest 5-60 deep), each row visited once; ~5-10x faster
  than pointer walks from every row, which pass over each row once per level above it;
- a few rows (:func:`nearest_flagged`, :func:`outermost_flagged`, :func:`flagged_on_chain`): a walk up from those
  rows only, one vectorised hop per level, optionally at most ``hops`` rows up each chain.

:func:`through_launch` carries a per-row answer from each launching runtime call to the GPU activity it launched
(GPU rows have no host parents: they follow their launch).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np


def depth_order(depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by depth (stable) and the bounds of each depth: rows of depth d are
    ``order[bounds[d] : bounds[d + 1]]``. The last result is kept for the same (unchanged) array: the analyses ask
    for the order of ``links.depth`` a dozen times."""
    last = _DEPTH_ORDER[0]
    if last is not None and last[0]() is depth and last[1] == len(depth):
        return last[2], last[3]
    top = int(depth.max()) if len(depth) else 0
    keys = depth.astype(np.int16) if 0 <= top < 2**15 and int(depth.min()) >= 0 else depth
    order = np.argsort(keys, kind="stable")  # 16-bit keys: a radix sort
    if len(order) < 1 << 31:  # kept (below) for the whole run: row numbers as int32 take half the memory
        order = order.astype(np.int32)
    bounds = np.searchsorted(depth[order], np.arange(top + 2))
    try:
        _DEPTH_ORDER[0] = (weakref.ref(depth), len(depth), order, bounds)
    except TypeError:  # not an array that takes weak references: not kept
        pass
    return order, bounds


_DEPTH_ORDER: list[Any] = [None]  # (weak reference to the depth array, its length, order, bounds)


# -- every row at once ----------------------------------------------------------------------------------------------


def _levels_down(depth: np.ndarray):
    """The rows of each depth, from the roots' children down (a row's parent is settled before the row)."""
    if not len(depth):
        return
    order, bounds = depth_order(depth)
    for d in range(1, len(bounds) - 1):
        rows = order[bounds[d] : bounds[d + 1]]
        if rows.size:
            yield rows


def innermost_ancestor_of_kind(parent: np.ndarray, depth: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """For every row: the nearest proper ancestor with ``is_kind`` (``-1`` if none). ``depth``: each row's depth
    in the tree of ``parent`` (``links.depth`` for ``links.parent``).

    Level by level from the roots down: a row's answer is its parent if the parent has ``is_kind``, else the
    parent's answer, which the level above has settled."""
    found = np.full(len(parent), -1, dtype=parent.dtype)
    for rows in _levels_down(depth):
        p = parent[rows]
        found[rows] = np.where(is_kind[p], p, found[p])
    return found


def outermost_ancestor_of_kind(parent: np.ndarray, depth: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """For every row: the farthest proper ancestor with ``is_kind`` (``-1`` if none); level by level from the roots
    down, as :func:`innermost_ancestor_of_kind`, keeping the answer the level above found first."""
    found = np.full(len(parent), -1, dtype=parent.dtype)
    for rows in _levels_down(depth):
        p = parent[rows]
        found[rows] = np.where(found[p] >= 0, found[p], np.where(is_kind[p], p, -1))
    return found


def has_ancestor_in(parent: np.ndarray, depth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rows with a proper ancestor in ``mask``: ``innermost_ancestor_of_kind(...) >= 0`` as a boolean sweep, level
    by level from the roots (half the time of the index sweep)."""
    out = np.zeros(len(parent), dtype=bool)
    for rows in _levels_down(depth):
        p = parent[rows]
        out[rows] = mask[p] | out[p]
    return out


def ancestors_of(parent: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every proper ancestor of the rows in ``mask`` (each row is marked once: O(n) plus one pass per level).

    Each level keeps one copy of each row (by a stamp: a row's slot holds the position of one of its copies,
    whichever write landed), 5-10x faster than ``np.unique`` of the level."""
    out = np.zeros(len(parent), dtype=bool)
    stamp = np.empty(len(parent), dtype=np.int32 if len(parent) < 1 << 31 else np.int64)
    frontier = parent[mask]
    while frontier.size:
        frontier = frontier[frontier >= 0]
        frontier = frontier[~out[frontier]]
        position = np.arange(len(frontier), dtype=stamp.dtype)
        stamp[frontier] = position
        frontier = frontier[stamp[frontier] == position]
        out[frontier] = True
        frontier = parent[frontier]
    return out


# -- a few rows -----------------------------------------------------------------------------------------------------


def _chains(parent: np.ndarray, rows: np.ndarray, hops: int | None):
    """Level by level up from ``rows`` (each row itself first): (positions in ``rows`` still walking, the row each
    has reached), at most ``hops`` levels."""
    at = np.asarray(rows, dtype=np.int64)
    live = np.flatnonzero(at >= 0)
    at = at[live]
    level = 0
    while live.size and (hops is None or level < hops):
        yield live, at
        at = parent[at].astype(np.int64)
        keep = at >= 0
        live, at = live[keep], at[keep]
        level += 1


def nearest_flagged(parent: np.ndarray, rows: np.ndarray, flag: np.ndarray, hops: int | None = None) -> np.ndarray:
    """Per row of ``rows`` (``-1``: none): the nearest flagged row at or above it, looking at most ``hops`` rows up
    its chain (itself included) when given."""
    out = np.full(len(rows), -1, dtype=np.int64)
    for live, at in _chains(parent, rows, hops):
        hit = flag[at] & (out[live] < 0)
        out[live[hit]] = at[hit]
    return out


def outermost_flagged(parent: np.ndarray, rows: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per row of ``rows``: the farthest flagged row at or above it (``-1``: none)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    for live, at in _chains(parent, rows, None):
        hit = flag[at]
        out[live[hit]] = at[hit]
    return out


def flagged_on_chain(parent: np.ndarray, rows: np.ndarray, flag: np.ndarray, hops: int | None = None) -> np.ndarray:
    """Per row of the tree: whether it is flagged and at or above one of ``rows`` (at most ``hops`` rows up each
    chain, the row itself included, when given)."""
    out = np.zeros(len(parent), dtype=bool)
    for _, at in _chains(parent, rows, hops):
        out[at[flag[at]]] = True
    return out


def through_launch(values: np.ndarray, launch: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """``values`` (per row: a flag, or a row with ``-1`` for none) with each GPU activity (``gpu``) that has a
    launching call (``launch``) taking that call's value where the call has one (in place; returned)."""
    linked = gpu & (launch >= 0)
    theirs = values[launch[linked].astype(np.int64)]
    has = theirs if values.dtype == bool else theirs >= 0
    values[linked] = np.where(has, theirs, values[linked])
    return values
