"""conftest.assert_same_frame: its quick path passes only identical frames; anything else is assert_frame_equal's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import assert_same_frame


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ts": np.arange(5, dtype=np.int64),
            "dur": [1.0, np.nan, 3.0, 4.0, 5.0],
            "name": pd.Categorical(["a", "b", "a", "c", "b"], categories=["a", "b", "c"]),
        }
    )


def test_identical_frames_pass() -> None:
    assert_same_frame(_frame(), _frame())


@pytest.mark.parametrize(
    "change",
    [
        lambda f: f.assign(ts=f["ts"] + 1),  # a value
        lambda f: f.assign(ts=f["ts"].astype(np.int32)),  # a dtype
        lambda f: f.assign(name=f["name"].cat.reorder_categories(["c", "b", "a"])),  # categories' order
        lambda f: f[["dur", "ts", "name"]],  # the columns' order
        lambda f: f.set_axis(np.arange(1, 6)),  # the index
    ],
)
def test_any_difference_fails_as_assert_frame_equal_does(change) -> None:
    with pytest.raises(AssertionError):
        assert_same_frame(_frame(), change(_frame()))


def test_options_still_apply_where_the_frames_differ() -> None:
    close = _frame().assign(dur=_frame()["dur"] * (1 + 1e-9))
    assert_same_frame(_frame(), close)  # assert_frame_equal's default tolerance
    with pytest.raises(AssertionError):
        assert_same_frame(_frame(), close, check_exact=True)
