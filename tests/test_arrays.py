"""base/arrays: factorize_rows(sort=True) numbers groups as pandas' sorted MultiIndex factorize does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import parsed

from profparse.base.arrays import factorize_rows, text_order
from profparse.trace.kinds import NULL


def test_factorize_sorted_equals_multiindex_factorize(shared_trace):
    """gpu_time's packed-key grouping numbers groups as a sorted factorize of the (step, gap, device) tuples."""
    p = parsed(shared_trace)
    events, step = p.raw.events, p.attribution.step
    rows = np.flatnonzero(events["kind"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy())
    gap = np.searchsorted(p.attribution.steps["start_ns"].to_numpy(), events["ts_ns"].to_numpy()[rows], "right")
    columns = (step[rows], np.where(step[rows] == NULL, gap, -1), events["device"].to_numpy()[rows])
    group, (first, _, last) = factorize_rows(*columns, sort=True)
    expected, uniques = pd.factorize(pd.MultiIndex.from_arrays(list(columns)), sort=True)
    assert len(uniques) >= 1
    np.testing.assert_array_equal(group, expected)
    np.testing.assert_array_equal(first, uniques.get_level_values(0).to_numpy().astype(np.int64))
    np.testing.assert_array_equal(last, uniques.get_level_values(2).to_numpy().astype(np.int64))


def test_factorize_rows_of_no_rows_keeps_each_columns_type():
    """A trace without GPU activity groups no rows: no pandas version may fail on it (before 3.0 an empty
    MultiIndex cannot be factorized)."""
    step, device = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    group, (steps, devices) = factorize_rows(step, device, sort=True)
    assert len(group) == 0 and steps.dtype == np.int64 and devices.dtype == np.int32


@pytest.mark.parametrize("share", [0.0, 0.01, 0.5])
def test_sparse_columns_are_the_same_with_or_without_from_indices(monkeypatch, share):
    """pandas < 3.1 has no ``SparseArray.from_indices``: the dense constructor gives the identical column."""
    from profparse.trace import table

    rng = np.random.default_rng(0)
    values = np.where(rng.random(10_000) < share, rng.integers(0, 1 << 40, 10_000), NULL).astype(np.int64)
    monkeypatch.setattr(table, "_FROM_INDICES", None)
    dense_built = table.sparse_column(values, NULL)
    assert dense_built.dtype == pd.SparseDtype(np.int64, NULL)
    assert np.array_equal(np.asarray(dense_built.sp_index.indices), np.flatnonzero(values != NULL))
    assert np.array_equal(dense_built.to_numpy(), values)
    if hasattr(pd.arrays.SparseArray, "from_indices"):  # pandas >= 3.1: compare with what it builds
        monkeypatch.setattr(table, "_FROM_INDICES", pd.arrays.SparseArray.from_indices)
        fast = table.sparse_column(values, NULL)
        assert fast.dtype == dense_built.dtype and fast.sp_index.equals(dense_built.sp_index)
        assert np.array_equal(fast.sp_values, dense_built.sp_values)


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(pd.Categorical(["b", "a", "c", "a"], categories=["c", "b", "a", "x"])),  # codes not in text order
        pd.Series(["b", "a", "c", "a"], dtype=object),
        pd.Index(pd.Categorical(["b", "a", "c", "a"])),
    ],
)
def test_text_order_ranks_rows_by_their_text(column):
    """Equal texts rank alike, whatever the categories' order: the tie key of the summary's sorts."""
    assert text_order(column).tolist() == [1, 0, 2, 0]
