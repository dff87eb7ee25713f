"""Linking (trace/link): the level sweep for the innermost ancestor of a kind equals walking up the parents, and
first_row_of equals the pandas lookup."""

from __future__ import annotations

import numpy as np
import pandas as pd
from conftest import parsed


def _nearest_ancestor_walk(parent: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """The definition, one row at a time: walk up the parents until one has the kind."""
    out = np.full(len(parent), -1, dtype=np.int64)
    for row in range(len(parent)):
        p = parent[row]
        while p >= 0 and not is_kind[p]:
            p = parent[p]
        out[row] = p
    return out


def test_innermost_ancestor_level_sweep_equals_walking_up(shared_trace):
    """The level-by-level sweep gives each row's nearest ancestor of a kind, as walking up its parents does, on
    a real trace's tree (cpu ops, and a random sparse mask) and on a random deep tree."""
    from profparse.trace.ancestors import depth_order, innermost_ancestor_of_kind
    from profparse.trace.link import kind_mask, nest

    p = parsed(shared_trace)
    rng = np.random.default_rng(7)
    for mask in (kind_mask(p.raw.events, {"cpu_op"}), rng.random(len(p.raw.events)) < 0.01):
        got = innermost_ancestor_of_kind(p.links.parent, p.links.depth, mask)
        assert (got == _nearest_ancestor_walk(p.links.parent, mask)).all()
    # a random forest 200 deep on one thread: intervals nested by construction
    n = 3000
    starts = np.sort(rng.integers(0, 10**6, n))
    ends = starts + rng.integers(1, 10**5, n)
    parent, depth = nest(np.zeros(n, dtype=np.int64), starts, ends, np.arange(n))
    assert depth.max() > 5
    mask = rng.random(n) < 0.2
    assert (innermost_ancestor_of_kind(parent, depth, mask) == _nearest_ancestor_walk(parent, mask)).all()
    # the kept depth order is for that array only: a new array of the same length gets its own
    order, _ = depth_order(depth)
    other = depth[::-1].copy()
    order2, bounds2 = depth_order(other)
    assert (np.diff(other[order2]) >= 0).all() and not np.array_equal(order, order2)
    assert bounds2[-1] == n


def test_first_row_of_equals_the_pandas_lookup() -> None:
    """The first row of each key (repeated keys, keys never asked for, asked keys that are absent, empty inputs)
    is what pandas' ``duplicated`` (keep first) + ``reindex`` gave before."""
    from profparse.trace.link import first_row_of

    rng = np.random.default_rng(7)
    for n_rows, n_wanted in ((0, 5), (5, 0), (1, 3), (2_000, 3_000)):
        keys = rng.integers(0, 300, n_rows)
        rows = np.sort(rng.choice(10 * max(n_rows, 1), n_rows, replace=False))
        wanted = rng.integers(-5, 320, n_wanted)
        by_key = pd.Series(rows, index=keys)
        by_key = by_key[~by_key.index.duplicated(keep="first")]
        expected = by_key.reindex(wanted).fillna(-1).to_numpy().astype(np.int64)
        assert np.array_equal(first_row_of(keys, rows, wanted), expected)
    assert first_row_of(np.array([4, 4, 9]), np.array([10, 11, 12]), np.array([4, 9, 5])).tolist() == [10, 12, -1]


def test_events_of_one_span_nest_by_kind_not_by_file_order(tmp_path) -> None:
    """Two host events with the same start and end on a thread: the step range holds a user range, a user range
    a Python frame, a frame an op, an op a runtime call, in either order of the file; of one kind, the file's
    order decides (the first holds the second)."""
    import json

    import profparse

    spans = [  # (name, cat), outermost first
        ("ProfilerStep#1", "user_annotation"),
        ("Optimizer.zero_grad#SGD.zero_grad", "user_annotation"),
        ("train.py(10): step", "python_function"),
        ("aten::zero_", "cpu_op"),
        ("cudaMemsetAsync", "cuda_runtime"),
    ]
    base = {"ph": "X", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "args": {}}
    for listed in (spans, spans[::-1], [spans[2], spans[0], spans[4], spans[1], spans[3]]):
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"traceEvents": [{**base, "name": n, "cat": c} for n, c in listed]}))
        p = profparse.load(path, cache=False)
        names = p.raw.events["name"].astype(str).tolist()
        parent = {names[i]: names[j] if j >= 0 else None for i, j in enumerate(p.links.parent.tolist())}
        assert [parent[n] for n, _ in spans] == [None] + [n for n, _ in spans[:-1]], listed
    same = [("aten::a", "cpu_op"), ("aten::b", "cpu_op")]
    for first, second in (same, same[::-1]):
        path.write_text(json.dumps({"traceEvents": [{**base, "name": n, "cat": c} for n, c in (first, second)]}))
        p = profparse.load(path, cache=False)
        names = p.raw.events["name"].astype(str).tolist()
        assert names[p.links.parent[names.index(second[0])]] == first[0]
