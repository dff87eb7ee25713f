"""Grouping rows by several integer columns at once: each column's codes packed into one int64 key.

A hash factorize per column and one factorize of the packed key is several times faster than a pandas
MultiIndex, which builds a tuple per row; :func:`grouped` reduces columns over such groups as pandas' named
aggregation does, without its fixed cost per column. And a text column as codes with each distinct text once
(:func:`text_codes`), or as text without pandas 2's fixed-width detour (:func:`as_text`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Packed keys stay below this, so that a product of the columns' widths never overflows an int64.
KEY_LIMIT = 2**62


def text_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A code per row (in order of first appearance) and each code's text, "nan" where missing: a text column
    (categorical or not) read without a Python string per row (``astype(str)`` made one: ~100 MB a column of a
    big trace's critical path)."""
    codes, uniques = pd.factorize(column, use_na_sentinel=False)
    return codes, np.array(["nan" if pd.isna(x) else str(x) for x in uniques], dtype=object)


def as_text(column: pd.Series) -> pd.Series:
    """``column.astype(str)``, the same values on every pandas (missing: "nan" before pandas 3, missing from it), by
    way of Python objects: before pandas 3 a categorical's ``astype(str)`` first makes its categories one
    fixed-width numpy array, 4 bytes per character of the longest name for every name, so three kernel names of
    200 KB made one of 2.8 GB (``report`` peaked at 5.7 GB)."""
    return column.astype(object).astype(str)


def category_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A code per row and each code's text, as :func:`text_codes` gives them but in no particular order: a
    categorical's own codes where no row is missing (no copy: ``text_codes`` makes an int64 per row), else
    :func:`text_codes`."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        if not (codes < 0).any():
            return codes, np.array([str(c) for c in column.cat.categories.tolist()], dtype=object)
    return text_codes(column)


def in_categories(column: pd.Series, values: tuple[str, ...] | list[str]) -> np.ndarray:
    """``column.isin(values).to_numpy()`` for a categorical column: one test per category, then the codes
    (``Series.isin`` costs ~0.3 ms a call on a few rows; a missing value is in none)."""
    wanted = set(values)
    hit = np.zeros(len(column.cat.categories) + 1, dtype=bool)  # the last: code -1, missing
    hit[:-1] = [c in wanted for c in column.cat.categories.tolist()]
    return hit[column.cat.codes.to_numpy()]


def row_positions(wanted: list[np.ndarray], table: list[np.ndarray]) -> np.ndarray:
    """Per row of the key columns ``wanted``, the position of the row of the key columns ``table`` with an equal key,
    -1 where none (``table``'s keys are distinct): a dict of the keys as Python values (a left merge of a few rows
    cost ~3 ms)."""
    at = {key: i for i, key in enumerate(zip(*(np.asarray(c).tolist() for c in table), strict=True))}
    keys = zip(*(np.asarray(c).tolist() for c in wanted), strict=True)
    return np.fromiter((at.get(key, -1) for key in keys), dtype=np.int64, count=len(wanted[0]) if wanted else 0)


def taken(values: np.ndarray, at: np.ndarray, missing: float) -> np.ndarray:
    """``values[at]``, ``missing`` where ``at`` is -1 (a :func:`row_positions` answer: no such row)."""
    return np.where(at >= 0, values[np.maximum(at, 0)] if len(values) else missing, missing)


def text_order(column: pd.Series | pd.Index) -> np.ndarray:
    """A rank per row by its text (equal texts, equal rank; missing as "nan"): the last key of a sort whose ties
    must come out in the same order whatever order the rows came in (a trace's file need not be in time order).
    One comparison per distinct text, not per row."""
    codes, texts = category_codes(pd.Series(column, copy=False))
    rank = np.empty(len(texts), dtype=np.int64)
    rank[np.argsort(texts, kind="stable")] = np.arange(len(texts))
    return rank[codes]


def pack_codes(*columns: np.ndarray, sort: bool = False) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """One int64 key per row, equal exactly for rows with equal tuples of ``columns``, and each column's distinct
    values; None when the key would not fit an int64. ``key = (c0 * n1 + c1) * n2 + c2 ...`` where ``ci`` is the
    code of column ``i``'s value among its ``ni`` distinct values (in order of first appearance; ``sort``: in
    sorted order, so that keys sort as the tuples do). :func:`unpack_codes` gives the tuples back."""
    ranked = [pd.factorize(column, sort=sort) for column in columns]
    if np.prod([float(max(len(uniques), 1)) for _, uniques in ranked]) >= KEY_LIMIT:
        return None
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for codes, uniques in ranked:
        key *= max(len(uniques), 1)
        key += codes
    return key, [np.asarray(uniques) for _, uniques in ranked]


def unpack_codes(keys: np.ndarray, values: list[np.ndarray]) -> list[np.ndarray]:
    """The tuples (one array per column) that :func:`pack_codes` packed into ``keys``."""
    out = []
    for uniques in reversed(values):
        width = max(len(uniques), 1)
        out.append(uniques[keys % width])
        keys = keys // width
    return out[::-1]


def factorize_rows(*columns: np.ndarray, sort: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
    """Group number of each row by its tuple of ``columns`` (in order of first appearance; ``sort``: in sorted
    tuple order), and the tuples of the groups (one array per column). Like
    ``pd.factorize(pd.MultiIndex.from_arrays(columns), sort=sort)``, by :func:`pack_codes` where the key fits."""
    if not len(columns[0]):  # pandas < 3 cannot factorize an empty MultiIndex
        return np.zeros(0, dtype=np.intp), [np.asarray(column)[:0] for column in columns]
    packed = pack_codes(*columns, sort=sort)
    if packed is None:
        group, uniques = pd.factorize(pd.MultiIndex.from_arrays(list(columns)), sort=sort)
        return group, [uniques.get_level_values(i).to_numpy() for i in range(len(columns))]
    key, values = packed
    group, keys = pd.factorize(key, sort=sort)
    return group, unpack_codes(np.asarray(keys), values)


#: The reductions :func:`grouped` makes, by the names ``DataFrameGroupBy.agg`` gives them.
REDUCERS = ("sum", "min", "max", "first", "last", "any", "size")


def grouped(keys: dict[str, np.ndarray], aggs: dict[str, tuple[np.ndarray, str]], sort: bool = True) -> pd.DataFrame:
    """``pd.DataFrame({**keys, ...}).groupby(list(keys), sort=sort).agg(**aggs).reset_index()``: one row per
    distinct tuple of ``keys`` (sorted, or in order of first appearance), each output column of ``aggs`` a
    reduction (:data:`REDUCERS`) of its values over the group's rows in their order. Computed with numpy on the
    rows sorted by group, one ``reduceat`` per column (pandas' named aggregation costs about a millisecond per
    column, most of a small trace's summary); where numpy would not give pandas' answer exactly (no rows, a
    missing key or value, a sum but of int64 or booleans: pandas widens small integers and compensates float sums;
    text but for ``first`` and ``last``), pandas computes it."""
    for _, how in aggs.values():
        if how not in REDUCERS:
            raise ValueError(f"unknown reduction {how!r}")
    columns = [np.asarray(k) for k in keys.values()]
    values = [np.asarray(v) for v, _ in aggs.values()]
    if not _numpy_exact(columns, values, [how for _, how in aggs.values()]):
        frame = pd.DataFrame({**keys, **{f"_{i}": v for i, v in enumerate(values)}})
        named = {name: (f"_{i}", how) for i, (name, (_, how)) in enumerate(aggs.items())}
        return frame.groupby(list(keys), sort=sort).agg(**named).reset_index()
    group, uniques = factorize_rows(*columns, sort=sort)
    order = np.argsort(group, kind="stable")
    in_order = group[order]
    starts = np.flatnonzero(np.concatenate([[True], in_order[1:] != in_order[:-1]]))
    out = dict(zip(keys, uniques, strict=True))
    for name, column, (_, how) in zip(aggs, values, aggs.values(), strict=True):
        out[name] = _reduce(column[order], starts, how)
    return pd.DataFrame(out)


def _numpy_exact(columns: list[np.ndarray], values: list[np.ndarray], reducers: list[str]) -> bool:
    """Whether :func:`grouped`'s numpy path gives exactly pandas' answer for these columns."""
    if not len(columns[0]) or any(_has_missing(c) for c in (*columns, *values)):
        return False
    for v, how in zip(values, reducers, strict=True):
        numeric = v.dtype.kind in "biuf"
        if (how == "sum" and v.dtype not in (np.int64, np.bool_)) or (how in ("min", "max", "any") and not numeric):
            return False
    return True


def _reduce(sorted_values: np.ndarray, starts: np.ndarray, how: str) -> np.ndarray:
    """One reduction of ``sorted_values`` (the rows in group order) over each group (``starts``: its first row)."""
    if how == "size":
        return np.diff(np.append(starts, len(sorted_values))).astype(np.int64)
    if how == "first":
        return sorted_values[starts]
    if how == "last":
        return sorted_values[np.append(starts[1:], len(sorted_values)) - 1]
    if how == "any":
        return np.logical_or.reduceat(sorted_values != 0, starts)
    if how == "sum":  # int64 or booleans (counted)
        return np.add.reduceat(sorted_values, starts, dtype=np.int64)
    return (np.minimum if how == "min" else np.maximum).reduceat(sorted_values, starts)


def _has_missing(values: np.ndarray) -> bool:
    """Whether pandas would see a missing value in ``values`` (NaN, None, NaT)."""
    if values.dtype.kind in "biu":
        return False
    if values.dtype.kind == "f":
        return bool(np.isnan(values).any())
    return bool(pd.isna(values).any())
