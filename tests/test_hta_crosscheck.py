"""Cross-check with HolisticTraceAnalysis, the peer used as a test oracle (needs the ``hta`` extra)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import parsed as cached_parse
from hta_oracle import HTA_MISSING, file_gpu_time_by_kernel_name, hta_gpu_time_by_kernel_name

import profparse

hta = pytest.importorskip("hta", reason=HTA_MISSING)


def profparse_gpu_time_by_name(parsed: profparse.ParsedTrace) -> pd.Series:
    k = parsed.kernels
    return k.groupby(k["name"].astype(str))["dur_ns"].sum().astype("int64").sort_index()


def test_gpu_time_per_kernel_name_agrees_with_hta(shared_trace):
    """HTA without its microsecond rounding: every kernel name within 1% (in fact equal)."""
    ours = profparse_gpu_time_by_name(cached_parse(shared_trace))
    theirs = hta_gpu_time_by_kernel_name(shared_trace, include_last_profiler_step=True, no_rounding=True)
    assert set(theirs.index) <= set(ours.index)
    mine = ours.reindex(theirs.index)
    rel = (mine - theirs).abs() / theirs.where(theirs > 0)
    assert rel.dropna().max() <= 0.01, rel.sort_values().tail()


def test_hta_default_totals_are_lower_only_by_its_rounding(shared_trace):
    """HTA's default parser rounds ts up and ts+dur down to whole microseconds (docs/hta_notes.md).

    The same rounding applied to the raw file reproduces HTA exactly, while profparse equals the raw file.
    """
    parsed = cached_parse(shared_trace)
    ours = profparse_gpu_time_by_name(parsed)
    theirs = hta_gpu_time_by_kernel_name(shared_trace, include_last_profiler_step=True)
    exact = file_gpu_time_by_kernel_name(shared_trace)
    hta_like = file_gpu_time_by_kernel_name(shared_trace, hta_rounding=True)
    assert ours.to_dict() == exact.astype("int64").to_dict()
    assert (theirs.reindex(hta_like.index) == hta_like).all()
    assert ours.sum() >= theirs.sum()
