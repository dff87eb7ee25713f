"""Ancestor queries (trace/ancestors): the walks from a few rows agree with the level sweeps over every row, and
the per-row definitions (walk up the parents one row at a time), on a random deep tree."""

from __future__ import annotations

import numpy as np

from profparse.trace.ancestors import (
    ancestors_of,
    flagged_on_chain,
    has_ancestor_in,
    innermost_ancestor_of_kind,
    nearest_flagged,
    outermost_ancestor_of_kind,
    outermost_flagged,
    through_launch,
)
from profparse.trace.link import nest


def _chain(parent: np.ndarray, row: int) -> list[int]:
    out = []
    while row >= 0:
        out.append(row)
        row = int(parent[row])
    return out


def _tree(seed: int = 3, n: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.integers(0, 10**6, n))
    ends = starts + rng.integers(1, 10**5, n)
    parent, depth = nest(np.zeros(n, dtype=np.int64), starts, ends, np.arange(n))
    return parent, depth, rng.random(n) < 0.15


def test_every_query_follows_its_definition() -> None:
    parent, depth, flag = _tree()
    n = len(parent)
    assert depth.max() > 5
    chains = [_chain(parent, r) for r in range(n)]
    flagged = [[a for a in c if flag[a]] for c in chains]
    assert nearest_flagged(parent, np.arange(n), flag).tolist() == [f[0] if f else -1 for f in flagged]
    assert outermost_flagged(parent, np.arange(n), flag).tolist() == [f[-1] if f else -1 for f in flagged]
    proper = [[a for a in c[1:] if flag[a]] for c in chains]
    assert innermost_ancestor_of_kind(parent, depth, flag).tolist() == [f[0] if f else -1 for f in proper]
    assert outermost_ancestor_of_kind(parent, depth, flag).tolist() == [f[-1] if f else -1 for f in proper]
    assert has_ancestor_in(parent, depth, flag).tolist() == [bool(f) for f in proper]
    above = {a for r in np.flatnonzero(flag) for a in chains[r][1:]}
    assert np.flatnonzero(ancestors_of(parent, flag)).tolist() == sorted(above)


def test_walks_stop_after_hops_and_skip_missing_rows() -> None:
    parent, _, flag = _tree(seed=5)
    rows = np.array([-1, *range(0, len(parent), 7)])
    near = nearest_flagged(parent, rows, flag, hops=2)
    want = [-1] + [next((a for a in _chain(parent, r)[:2] if flag[a]), -1) for r in rows[1:]]
    assert near.tolist() == want
    marked = flagged_on_chain(parent, rows, flag, hops=3)
    assert np.flatnonzero(marked).tolist() == sorted({a for r in rows[1:] for a in _chain(parent, r)[:3] if flag[a]})


def test_gpu_activity_takes_its_launching_calls_answer() -> None:
    launch = np.array([-1, -1, 0, 1, 1, -1])
    gpu = np.array([False, False, True, True, True, True])
    rows = np.array([7, -1, -1, 4, -1, -1])  # row 4 has its own answer; its launch (row 1) has none: kept
    assert through_launch(rows, launch, gpu).tolist() == [7, -1, 7, 4, -1, -1]
    flags = np.array([True, False, False, True, False, False])
    assert through_launch(flags, launch, gpu).tolist() == [True, False, True, True, False, False]
