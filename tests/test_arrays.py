"""base/arrays: factorize_rows(sort=True) numbers groups as pandas' sorted MultiIndex factorize does."""

from __future__ import annotations

import numpy as np
import pandas as pd
from conftest import parsed

from profparse.base.arrays import factorize_rows
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
