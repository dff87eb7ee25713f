"""Grouping rows by several integer columns at once: each column's codes packed into one int64 key.

A hash factorize per column and one factorize of the packed key is several times faster than a pandas
MultiIndex, which builds a tuple per row. And a text column as codes with each distinct text once
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
            return codes, np.array([str(c) for c in column.cat.categories], dtype=object)
    return text_codes(column)


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
