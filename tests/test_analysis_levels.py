"""The stage x level matrix on a hand-built trace and on real GPU traces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder, training_step

import profparse
from profparse.outputs.summary import render_summary

US = 1000


def build(tmp_path) -> profparse.ParsedTrace:
    b = TraceBuilder()
    training_step(b, 1, 0)
    b.py("torch/_refs/__init__.py(1149): _ref", 10, 2)  # Python inside aten::linear (2-17 us)
    b.span("cudaDeviceSynchronize", 25, 2, "cuda_runtime")  # forward, outside the module
    return profparse.parse(b.write(tmp_path / "t.json"))


def totals(p: profparse.ParsedTrace) -> pd.DataFrame:
    levels = p.stage_levels
    return levels[levels["scope"] == "total"].set_index("stage")


def test_levels_by_hand(tmp_path):
    t = totals(build(tmp_path))
    forward, backward, optimizer = t.loc["forward"], t.loc["backward"], t.loc["optimizer"]
    assert forward["python_ns"] == 5 * US  # nn.Module: Linear_0 (20 us) minus aten::linear (15 us)
    assert forward["op_ns"] == 14 * US and forward["op_python_ns"] == 2 * US  # 15 - 1 launch; 2 of them Python
    assert forward["runtime_ns"] == 3 * US and forward["sync_ns"] == 2 * US
    assert forward["device_ns"] == 10 * US and forward["device_count"] == 1
    assert backward["op_ns"] == (5 + 24) * US and backward["runtime_ns"] == 1 * US
    assert backward["device_ns"] == 20 * US and backward["python_ns"] == 0
    assert optimizer["op_ns"] == 9 * US and optimizer["device_ns"] == 5 * US
    assert forward["launch_latency_p50_ns"] == 2 * US and backward["launch_latency_max_ns"] == 3 * US
    assert t.loc["load", "launch_latency_count"] == 0 and pd.isna(t.loc["load", "launch_latency_p50_ns"])


def test_launch_latency_percentiles(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.py("nn.Module: Linear_0", 1, 900)
    latencies = [2, 4, 6, 8, 100]
    for i, lat in enumerate(latencies):
        b.op("aten::mm", 10 + 100 * i, 50)
        b.launch(11 + 100 * i, 11 + 100 * i + lat, 1)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    f = totals(p).loc["forward"]
    assert f["launch_latency_count"] == 5
    for q, column in ((50, "p50"), (90, "p90"), (99, "p99"), (100, "max")):
        assert f[f"launch_latency_{column}_ns"] == round(np.percentile(latencies, q) * US), column
    assert f["launch_latency_mean_ns"] == np.mean(latencies) * US


def test_rows_match_stage_summary(tmp_path):
    p = build(tmp_path)
    levels, summary = p.stage_levels, p.stage_summary
    pd.testing.assert_frame_equal(
        levels[["scope", "step", "stage"]].reset_index(drop=True), summary[["scope", "step", "stage"]]
    )
    assert (levels["device_idle_ns"].to_numpy() == summary["gpu_idle_ns"].to_numpy()).all()


def test_cpu_trace_has_no_device_columns_in_summary(sample_trace):
    p = parsed_once(sample_trace)
    t = totals(p)
    assert (t["device_ns"] == 0).all() and (t["launch_latency_count"] == 0).all()
    assert t.loc["forward", "op_ns"] > 0 and t.loc["backward", "op_ns"] > 0
    text = render_summary(p)
    headers = text.split("Levels per stage")[1].splitlines()[1].split()
    assert headers[:3] == ["stage", "python", "ops"]
    assert not {"runtime", "device", "idle"} & set(headers)
    # every line fits 100 columns except the header, which names the trace (as long as the user's path is)
    assert max(len(line) for line in text.splitlines() if str(sample_trace) not in line) <= 100


def test_gpu_traces(shared_trace):
    p = parsed_once(shared_trace)
    levels = p.stage_levels
    summary = p.stage_summary
    # device execution per stage (and per step) is the stage summary's GPU time, computed independently
    assert (levels["device_ns"].to_numpy() == summary["gpu_time_ns"].to_numpy()).all()
    assert (levels["op_ns"] - levels["op_python_ns"] == summary["host_op_ns"]).all()
    t = totals(p)
    assert t["runtime_ns"].sum() > 0
    launched = t[t["launch_latency_count"] > 0]
    assert len(launched) > 0
    for column in ("p50", "p90", "p99"):
        assert (launched[f"launch_latency_{column}_ns"] <= launched["launch_latency_max_ns"]).all()
    kernels = p.kernels
    assert t["launch_latency_count"].sum() == kernels["launch_latency_ns"].notna().sum()
    text = render_summary(p)
    assert "Launch latency" in text
    assert max(len(line) for line in text.split("Levels per stage")[1].splitlines()) <= 100


@pytest.mark.parametrize("fmt", ["markdown", "json"])
def test_other_formats_carry_levels(tmp_path, fmt):
    text = render_summary(build(tmp_path), fmt)
    assert "python" in text and "launch_latency" in text if fmt == "json" else "Levels per stage" in text
