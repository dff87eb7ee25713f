"""Integration on real GPU traces from ../shared/traces (skipped where that folder is absent)."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from conftest import parsed

import profparse
from profparse.outputs.parquet import read_parquet, write_parquet

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def file_gpu_events(path) -> pd.DataFrame:
    """GPU activity straight from the file with the standard library (the ground truth)."""
    with gzip.open(path) as f:
        doc = json.load(f)
    rows = [
        (e["name"], round(e["dur"] * 1000))
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    ]
    return pd.DataFrame(rows, columns=["name", "dur_ns"])


def test_every_gpu_event_gets_a_stage_and_sums_are_exact(shared_trace):
    p = parsed(shared_trace)
    truth = file_gpu_events(shared_trace)
    kernels = p.kernels
    assert len(kernels) == len(truth)
    assert kernels["stage"].notna().all()
    summary = p.stage_summary
    totals = summary[summary["scope"] == "total"]
    assert int(totals["gpu_time_ns"].sum()) == int(truth["dur_ns"].sum())
    per_step = summary[summary["scope"] != "total"]
    assert int(per_step["gpu_time_ns"].sum()) == int(truth["dur_ns"].sum())


def test_every_gpu_event_is_linked_to_its_launch(shared_trace):
    kernels = parsed(shared_trace).kernels
    assert kernels["launch_trace_index"].notna().all()
    assert (kernels["stage_rule"] != "other.gpu_unlinked").all()


def test_backward_and_optimizer_gpu_time_are_found(shared_trace):
    totals = parsed(shared_trace).stage_summary.query("scope == 'total'").set_index("stage")
    assert totals.loc["forward", "gpu_time_ns"] > 0
    assert totals.loc["backward", "gpu_time_ns"] > 0
    assert totals.loc["optimizer", "gpu_time_ns"] > 0


def test_host_nesting_is_consistent(shared_trace):
    events = parsed(shared_trace).events
    child = events[events["parent_trace_index"].notna()]
    parent = events.set_index("trace_index").loc[child["parent_trace_index"].astype("int64")]
    assert (parent["ts_ns"].to_numpy() <= child["ts_ns"].to_numpy()).all()
    assert ((parent["ts_ns"] + parent["dur_ns"]).to_numpy() >= (child["ts_ns"] + child["dur_ns"]).to_numpy()).all()
    assert (parent["tid"].to_numpy() == child["tid"].to_numpy()).all()
    assert (events["self_ns"] >= 0).all()


def test_parquet_round_trip(shared_trace, tmp_path):
    p = parsed(shared_trace)
    out = write_parquet(p, tmp_path / "out")
    tables = read_parquet(out)
    assert set(tables) >= {"events", "kernels", "ops", "stage_summary", "steps", "warnings"}
    assert len(tables["events"]) == len(p.events)
    pd.testing.assert_series_equal(tables["kernels"]["dur_ns"], p.kernels["dur_ns"].astype("Int64"), check_names=False)
    assert tables["events"]["stage"].astype(str).tolist() == p.events["stage"].astype(str).tolist()


@pytest.mark.parametrize("fmt", ["text", "json", "csv", "markdown"])
def test_summarize_formats(shared_trace, fmt):
    text = profparse.summarize(str(shared_trace), fmt=fmt)
    assert "backward" in text and "optimizer" in text
    if fmt == "json":
        data = json.loads(text)
        assert {r["stage"] for r in data["totals"]} == set(profparse.STAGES)
