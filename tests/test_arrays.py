"""base/arrays: factorize_rows(sort=True) numbers groups as pandas' sorted MultiIndex factorize does; grouped
reduces as pandas' named aggregation does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import parsed

import profparse.base.arrays as arrays
from profparse.base.arrays import REDUCERS, factorize_rows, grouped, text_order
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


def _random_columns(rng: np.random.Generator, rows: int, text: bool) -> tuple[dict, dict]:
    keys = {"a": rng.integers(-2, 3, rows), "b": rng.integers(0, 2, rows).astype(bool)}
    if text:
        keys["c"] = np.array([f"k{i}" for i in rng.integers(0, 3, rows)], dtype=object)
    values = {
        "i": rng.integers(-(2**40), 2**40, rows),
        "f": rng.random(rows),
        "b": rng.integers(0, 2, rows).astype(bool),
        "u": rng.integers(0, 5, rows).astype(np.int32),
        "t": np.array([f"v{i}" for i in rng.integers(0, 4, rows)], dtype=object),
    }
    return keys, values


@pytest.mark.parametrize("seed", range(40))
def test_grouped_equals_pandas_named_aggregation(seed, monkeypatch):
    """Every reduction of integers, booleans, floats and text, by integer, boolean and text keys, sorted or in
    order of first appearance: the same frame (values, dtypes, row order) as pandas gives; and the numpy path is
    the one taken (sums but of int64 and booleans go to pandas, so only without them)."""
    rng = np.random.default_rng(seed)
    keys, values = _random_columns(rng, int(rng.integers(1, 40)), text=seed % 3 == 0)
    aggs = {
        f"{name}_{how}": (column, how)
        for name, column in values.items()
        for how in REDUCERS
        if (name != "t" or how in ("first", "last", "size")) and not (name in ("f", "u") and how == "sum")
    }
    reduced = []
    real = arrays._reduce
    monkeypatch.setattr(arrays, "_reduce", lambda *a: reduced.append(a[2]) or real(*a))
    for sort in (True, False):
        frame = pd.DataFrame({**keys, **{f"_{name}": column for name, (column, _) in aggs.items()}})
        named = {name: (f"_{name}", how) for name, (_, how) in aggs.items()}
        expected = frame.groupby(list(keys), sort=sort).agg(**named).reset_index()
        pd.testing.assert_frame_equal(grouped(keys, aggs, sort=sort), expected, check_exact=True)
    assert len(reduced) == 2 * len(aggs)


@pytest.mark.parametrize(
    "case", ["no rows", "missing value", "missing key", "float sum", "small integer sum", "text minimum"]
)
def test_grouped_leaves_what_numpy_would_answer_differently_to_pandas(case, monkeypatch):
    """No rows, a NaN or None (pandas skips them), a float sum (pandas compensates), an int8 sum (pandas widens
    it), the minimum of text: pandas' own answer."""
    keys, values = _random_columns(np.random.default_rng(7), 30, text=True)
    aggs = {"i": (values["i"], "sum"), "f": (values["f"], "min"), "t": (values["t"], "first")}
    if case == "no rows":
        keys = {k: v[:0] for k, v in keys.items()}
        aggs = {name: (column[:0], how) for name, (column, how) in aggs.items()}
    elif case == "missing value":
        values["f"][3] = np.nan
        values["t"][4] = None
    elif case == "missing key":
        keys["c"][5] = None
    elif case == "float sum":
        aggs["f"] = (values["f"], "sum")
    elif case == "small integer sum":
        aggs["i"] = (values["i"].astype(np.int8), "sum")
    else:
        aggs["t"] = (values["t"], "min")
    monkeypatch.setattr(arrays, "_reduce", lambda *a: pytest.fail("numpy path taken"))
    frame = pd.DataFrame({**keys, **{f"_{name}": column for name, (column, _) in aggs.items()}})
    expected = frame.groupby(list(keys), sort=True).agg(**{n: (f"_{n}", h) for n, (_, h) in aggs.items()})
    pd.testing.assert_frame_equal(grouped(keys, aggs), expected.reset_index(), check_exact=True)


def test_grouped_refuses_an_unknown_reduction():
    with pytest.raises(ValueError, match="unknown reduction 'median'"):
        grouped({"a": np.arange(3)}, {"m": (np.arange(3), "median")})


@pytest.mark.parametrize("seed", range(8))
def test_in_categories_equals_series_isin(seed):
    """Random categorical columns (missing values, unused categories, none at all) and value lists (some not
    among the categories, empty): the same mask as ``Series.isin``."""
    rng = np.random.default_rng(seed)
    categories = [f"c{i}" for i in range(int(rng.integers(0, 6)))]
    rows = int(rng.integers(0, 40))
    column = pd.Series(pd.Categorical(rng.choice([*categories, None], rows), categories=categories))
    for values in ([], ["c0"], ["c1", "zz"], categories[::2], ["zz"]):
        expected = column.isin(values).to_numpy()
        got = arrays.in_categories(column, tuple(values))
        assert got.dtype == bool and (got == expected).all()


@pytest.mark.parametrize("seed", range(6))
def test_row_positions_finds_each_key_as_a_left_merge_does(seed):
    """Keys of text, NULL steps and small codes, some absent from the table, in any order: each row's position in
    the table, or -1, as a left merge on the same keys pairs them."""
    rng = np.random.default_rng(seed)
    scopes, steps = np.array(["step", "outside_steps", "total"], dtype=object), np.array([NULL, 0, 1, 7])
    table = pd.DataFrame(
        {"scope": rng.choice(scopes, 30), "step": rng.choice(steps, 30), "code": rng.integers(0, 5, 30)}
    )
    table = table.drop_duplicates().sample(frac=1, random_state=seed).reset_index(drop=True)
    rows = pd.DataFrame(
        {"scope": rng.choice(scopes, 25), "step": rng.choice(steps, 25), "code": rng.integers(0, 6, 25)}
    )
    keys = ["scope", "step", "code"]
    got = arrays.row_positions([rows[c].to_numpy() for c in keys], [table[c].to_numpy() for c in keys])
    merged = rows.merge(table.reset_index(names="position"), on=keys, how="left", sort=False)
    assert got.tolist() == merged["position"].fillna(-1).astype(int).tolist()
    values = rng.integers(0, 100, len(table))
    merged = rows.merge(table.assign(value=values), on=keys, how="left", sort=False)
    assert arrays.taken(values, got, -5).tolist() == merged["value"].fillna(-5).astype(int).tolist()
    assert (got == -1).any() and (got >= 0).any()
    assert len(arrays.row_positions([np.array([])] * 3, [table[c].to_numpy() for c in keys])) == 0
