"""base/intervals and base/arrays: the vectorised interval sweeps and packed-key grouping equal plain loops."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from profparse.base import intervals
from profparse.base.arrays import factorize_rows, pack_codes, unpack_codes

INTERVALS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-50, 50), st.integers(0, 30)), min_size=0, max_size=40
)  # (group, start, length)


def arrays(rows: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    group = np.array([g for g, _, _ in rows], dtype=np.int64)
    start = np.array([s for _, s, _ in rows], dtype=np.int64)
    end = start + np.array([d for _, _, d in rows], dtype=np.int64)
    return group, start, end


def covered_points(start: np.ndarray, end: np.ndarray) -> set[int]:
    return {t for s, e in zip(start.tolist(), end.tolist(), strict=True) for t in range(s, e)}


@settings(max_examples=200, deadline=None)
@given(INTERVALS, st.randoms(use_true_random=False))
def test_union_length_of_rows_sorted_by_group_and_start_counts_points_and_keeps_its_inputs(rows, rng):
    """Rows already sorted by (group, start), equal starts in any order (the sweep's fast path): the same union,
    and the caller's arrays untouched."""
    rows = sorted(rows, key=lambda r: (r[0], r[1], rng.random()))
    group, start, end = arrays(rows)
    copies = group.copy(), start.copy(), end.copy()
    lengths = intervals.union_length(group, start, end, 4)
    for g in range(4):
        assert lengths[g] == len(covered_points(start[group == g], end[group == g]))
    assert all(np.array_equal(a, b) for a, b in zip((group, start, end), copies, strict=True))


@settings(max_examples=200, deadline=None)
@given(INTERVALS)
def test_union_length_and_group_union_equal_counting_points(rows):
    group, start, end = arrays(rows)
    lengths = intervals.union_length(group, start, end, 4)
    for g in range(4):
        assert lengths[g] == len(covered_points(start[group == g], end[group == g]))
    if not len(rows):
        return
    pg, ps, pe = intervals.group_union(group, start, end)
    for g in range(4):
        mine = covered_points(ps[pg == g], pe[pg == g])
        assert mine == covered_points(start[group == g], end[group == g])
        assert int((pe - ps)[pg == g].sum()) == len(mine)  # the pieces are disjoint


@settings(max_examples=200, deadline=None)
@given(INTERVALS, st.lists(st.integers(-60, 90), min_size=1, max_size=10))
def test_coverage_counts_the_union_before_each_point(rows, points):
    _, start, end = arrays(rows)
    order = np.argsort(start, kind="stable")
    us, ue = intervals.merge(start[order], end[order])
    x = np.array(points, dtype=np.int64)
    union = covered_points(start, end)
    assert intervals.coverage(us, ue, x).tolist() == [sum(1 for t in union if t < p) for p in points]


@settings(max_examples=200, deadline=None)
@given(INTERVALS, st.lists(st.integers(-60, 90), min_size=1, max_size=300), st.booleans())
def test_coverage_of_many_sorted_points(rows, points, as_float):
    """Many points in order take the search per interval: the same lengths as a point at a time."""
    _, start, end = arrays(rows)
    us, ue = intervals.union_pieces(start, end)
    x = np.sort(np.array(points, dtype=np.float64 if as_float else np.int64))
    union = covered_points(start, end)
    got = intervals.coverage(us.astype(x.dtype), ue.astype(x.dtype), x)
    assert got.tolist() == [sum(1 for t in union if t < p) for p in x.tolist()]


@settings(max_examples=200, deadline=None)
@given(INTERVALS)
def test_clip_disjoint_and_running_max_follow_each_track(rows):
    group, start, end = arrays(rows)
    order = intervals.group_start_order(group, start)
    assert order.tolist() == np.lexsort((start, group)).tolist()
    group, start, end = group[order], start[order], end[order]
    reach = intervals.group_running_max(group, end)
    clipped, keep = intervals.clip_disjoint(group, start, end)
    for i in range(len(rows)):
        before = [end[j] for j in range(i) if group[j] == group[i]]
        assert reach[i] == max([*before, end[i]])
        limit = max(before, default=np.iinfo(np.int64).min)
        assert clipped[i] == max(start[i], limit)
        assert keep[i] == (end[i] > clipped[i] or (end[i] == start[i] and start[i] >= limit))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 2), st.integers(-5, 5)), min_size=1, max_size=30))
def test_factorize_rows_equals_a_multiindex_factorize(rows):
    columns = [np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)]
    for sort in (False, True):
        group, values = factorize_rows(*columns, sort=sort)
        expected, uniques = pd.factorize(pd.MultiIndex.from_arrays(columns), sort=sort)
        assert group.tolist() == expected.tolist()
        for i, v in enumerate(values):
            assert v.tolist() == uniques.get_level_values(i).tolist()
    key, distinct = pack_codes(*columns)
    assert [c.tolist() for c in unpack_codes(key, distinct)] == [c.tolist() for c in columns]
