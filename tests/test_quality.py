"""Quality checks speak up on the problems they name, and stay quiet on a clean trace."""

from __future__ import annotations

import copy

from tracebuilder import GPU_PID, STREAM, TraceBuilder, training_step

import profparse


def checks(builder: TraceBuilder, tmp_path) -> dict[str, dict]:
    p = profparse.parse(builder.write(tmp_path / "t.json"))
    return {r["check"]: r for r in p.warnings.to_dict("records")}


def clean() -> TraceBuilder:
    b = TraceBuilder()
    for step in range(2):
        training_step(b, step, step * 100)
    return b


def test_clean_trace_has_no_findings(tmp_path):
    assert checks(clean(), tmp_path) == {}


def test_unlinked_gpu_activity(tmp_path):
    b = clean()
    b.events.append(
        {"ph": "X", "cat": "kernel", "name": "orphan", "pid": GPU_PID, "tid": STREAM, "ts": 150, "dur": 40,
         "args": {"correlation": 999999, "stream": STREAM}}
    )  # fmt: skip
    found = checks(b, tmp_path)
    assert found["gpu_unlinked"]["count"] == 1
    assert 0 < found["gpu_unlinked"]["value"] < 1


def test_overlap_on_one_stream_and_kernel_before_launch(tmp_path):
    b = clean()
    runtime, kernel = b.launch(60, 4, 10, name="early")  # starts at 4 us, launched at 60 us; overlaps gemm_fwd
    found = checks(b, tmp_path)
    assert found["timestamps_backwards"]["count"] == 1
    assert found["stream_overlap"]["count"] >= 1


def test_kernel_outside_profiled_window(tmp_path):
    b = clean()
    b.events.append(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 0, "dur": 300}
    )  # fmt: skip
    b.launch(295, 310, 5, name="late")
    assert checks(b, tmp_path)["outside_window"]["count"] == 1


def test_duplicate_events(tmp_path):
    b = clean()
    b.events.append(copy.deepcopy(b.events[5]))
    assert checks(b, tmp_path)["duplicate_events"]["count"] == 1


def test_training_trace_without_backward(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::mm", 1, 10)
    b.annotation("Optimizer.step#SGD.step", 50, 10)
    found = checks(b, tmp_path)
    assert "backward" in found["missing_stage"]["message"]


def test_share_left_in_other_is_reported(tmp_path):
    b = clean()
    b.op("aten::mystery", 500, 400, tid=777)  # long, outside any step, on an unknown thread
    found = checks(b, tmp_path)
    assert found["other_share_host"]["severity"] == "warning"
    assert found["other_share_host"]["value"] > 0.5
