"""Memory per stage from [memory] events: hand-built traces, sample captures and real traces."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from conftest import SAMPLE_TRACES
from conftest import parsed as parsed_once
from tracebuilder import AUTOGRAD, TraceBuilder, memory_event, training_step

import profparse
from profparse.outputs.parquet import read_parquet, write_parquet
from profparse.outputs.summary import render_summary


def build(tmp_path, totals: bool = True) -> profparse.ParsedTrace:
    b = TraceBuilder()
    training_step(b, 1, 0)  # forward op 2-17 us, backward node 31-56 us (autograd thread), optimizer op 71-81 us
    t = (lambda v: v) if totals else (lambda v: None)
    memory_event(b, 3, 100, t(1100), reserved=2048)
    memory_event(b, 4, 50, t(1150), reserved=4096)
    memory_event(b, 10, -100, t(1050), reserved=4096)
    memory_event(b, 32, 200, t(1250), tid=AUTOGRAD)
    memory_event(b, 40, -150, t(1100), tid=AUTOGRAD)
    memory_event(b, 72, -10, t(1090))
    memory_event(b, 5, 64, t(64), device_type=0, device_id=-1)  # host memory, forward
    return profparse.parse(b.write(tmp_path / "t.json"))


def by_stage(p: profparse.ParsedTrace, scope: str = "total") -> pd.DataFrame:
    m = p.memory_by_stage
    m = m[m["scope"] == scope]
    return m.set_index([m["device"].astype(str), m["stage"].astype(str)])


def test_timeline(tmp_path):
    t = build(tmp_path).memory
    assert list(t["device"].astype(str)) == ["cpu"] + ["cuda:0"] * 6
    cuda = t[t["device"] == "cuda:0"]
    assert list(cuda["stage"].astype(str)) == ["forward"] * 3 + ["backward"] * 2 + ["optimizer"]
    assert list(cuda["allocated_bytes"]) == [1100, 1150, 1050, 1250, 1100, 1090]
    assert list(cuda["bytes"]) == [100, 50, -100, 200, -150, -10]
    assert (cuda["step"] == 1).all() and not t["relative"].any()
    assert cuda["op_name"].iloc[0] == "aten::linear" and cuda["ts_ns"].is_monotonic_increasing


def test_per_stage_by_hand(tmp_path):
    s = by_stage(build(tmp_path))
    f, b, o = s.loc[("cuda:0", "forward")], s.loc[("cuda:0", "backward")], s.loc[("cuda:0", "optimizer")]
    assert (f["start_allocated_bytes"], f["end_allocated_bytes"], f["peak_allocated_bytes"]) == (1000, 1050, 1150)
    assert (f["alloc_bytes"], f["freed_bytes"], f["alloc_count"], f["free_count"]) == (150, 100, 2, 1)
    assert f["peak_reserved_bytes"] == 4096
    assert (b["start_allocated_bytes"], b["end_allocated_bytes"], b["peak_allocated_bytes"]) == (1050, 1100, 1250)
    # a stage that only frees: its peak is where it started
    assert (o["start_allocated_bytes"], o["end_allocated_bytes"], o["peak_allocated_bytes"]) == (1100, 1090, 1100)
    assert s.loc[("cpu", "forward"), "peak_allocated_bytes"] == 64
    steps = by_stage(build(tmp_path), "step")
    assert (steps.loc[("cuda:0", "forward"), "step"] == 1) and len(steps) == len(s)


def test_legacy_without_totals_is_relative(tmp_path):
    p = build(tmp_path, totals=False)
    cuda = p.memory[p.memory["device"] == "cuda:0"]
    assert list(cuda["allocated_bytes"]) == [100, 150, 50, 250, 100, 90] and cuda["relative"].all()
    s = by_stage(p)
    assert s.loc[("cuda:0", "backward"), "peak_allocated_bytes"] == 250 and s["relative"].all()
    assert s["peak_reserved_bytes"].isna().all()
    assert "relative to its first event" in render_summary(p)


def test_no_memory_events(tmp_path):
    b = TraceBuilder()
    training_step(b, 1, 0)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert p.memory.empty and p.memory_by_stage.empty
    assert "Memory per stage" not in render_summary(p)


def test_parquet_holds_the_analysis_tables(tmp_path):
    p = build(tmp_path)
    out = read_parquet(write_parquet(p, tmp_path / "out"))
    for name in ("load_breakdown", "stage_levels", "modules", "memory", "memory_by_stage"):
        assert name in out, name
    pd.testing.assert_frame_equal(
        out["memory_by_stage"].drop(columns=["stage", "device"]),
        p.memory_by_stage.drop(columns=["stage", "device"]),
        check_dtype=False,
    )
    assert "substage" in out["events"].columns and "substage_rule" in out["events"].columns
    assert len(out["stage_levels"]) == len(p.stage_levels)


def test_peak_bounds_on_real_traces(sample_trace):
    p = parsed_once(sample_trace)
    m = p.memory_by_stage
    assert len(m) > 0
    assert (m["peak_allocated_bytes"] >= m["start_allocated_bytes"]).all()
    assert (m["peak_allocated_bytes"] >= m["end_allocated_bytes"]).all()
    events = (p.events["kind"] == "memory").sum()
    assert len(p.memory) == events
    total = m[m["scope"] == "total"]
    assert total["alloc_count"].sum() + total["free_count"].sum() <= events
    assert set(total["stage"].astype(str)) >= {"forward", "backward", "optimizer"}


def _raw_memory_events(path) -> list[dict]:
    """The ``[memory]`` instants of a trace file, read with the standard library (ground truth for the parser)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if isinstance(e, dict) and e.get("name") == "[memory]" and e.get("ph") == "i"]


def test_shared_traces_memory(shared_trace):
    p = parsed_once(shared_trace)
    m = p.memory_by_stage
    raw = _raw_memory_events(shared_trace)
    assert len(p.memory) == (p.events["kind"] == "memory").sum() == len(raw)
    # a memory table and a summary section exactly when the trace has [memory] events
    assert m.empty == (not raw)
    assert ("Memory per stage" in render_summary(p)) == bool(raw)
    if not raw:
        assert p.memory.empty
    else:
        assert (m["peak_allocated_bytes"] >= m[["start_allocated_bytes", "end_allocated_bytes"]].max(axis=1)).all()
        has_totals = any("Total Allocated" in (e.get("args") or {}) for e in raw)
        assert bool(m["relative"].all()) == (not has_totals)  # levels are relative only without allocator totals
        total = m[m["scope"] == "total"]
        assert total["alloc_count"].sum() + total["free_count"].sum() <= len(raw)
        gpu = any((e.get("args") or {}).get("Device Type") == 1 for e in raw)
        assert any(d.startswith("cuda") for d in m["device"].astype(str)) == gpu


def test_reserve_only_events_are_not_counted_as_allocated(tmp_path):
    b = TraceBuilder()
    training_step(b, 1, 0)  # forward op 2-17 us
    host = {"device_type": 0, "device_id": -1}
    memory_event(b, 3, 8, 8, reserved=0, **host)
    memory_event(b, 4, 16, 24, reserved=0, **host)
    memory_event(b, 5, 1_000_000, 24, reserved=1_000_000, **host)  # a pool reserved: Total Allocated unchanged
    memory_event(b, 6, -8, 16, reserved=0, **host)
    memory_event(b, 7, 32, 48, reserved=0, **host)
    trace = profparse.parse(b.write(tmp_path / "t.json"))
    m = trace.memory_by_stage
    row = m[(m["scope"] == "total") & (m["stage"] == "forward")].iloc[0]
    assert (row["start_allocated_bytes"], row["end_allocated_bytes"], row["peak_allocated_bytes"]) == (0, 48, 48)
    assert (row["alloc_bytes"], row["freed_bytes"], row["alloc_count"], row["free_count"]) == (56, 8, 3, 1)
    assert row["peak_reserved_bytes"] == 1_000_000
    assert list(trace.memory["bytes"]) == [8, 16, 1_000_000, -8, 32]  # the timeline keeps every event as read
    text = render_summary(trace)
    assert "reserve-only events count in reserved peak" in text


def test_sample_capture_load_row_adds_up():
    path = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not in this clone")
    m = parsed_once(path).memory_by_stage
    load = m[(m["scope"] == "total") & (m["stage"] == "load")].iloc[0]
    assert load["start_allocated_bytes"] + load["alloc_bytes"] - load["freed_bytes"] == load["end_allocated_bytes"]
    assert load["alloc_bytes"] <= load["peak_allocated_bytes"] - load["start_allocated_bytes"] + load["freed_bytes"]
    assert load["peak_reserved_bytes"] > load["peak_allocated_bytes"]  # the reserved pool is still shown
