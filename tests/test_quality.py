"""Quality checks speak up on the problems they name, and stay quiet on a clean trace."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from conftest import parsed
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
    found = checks(clean(), tmp_path)
    assert found.pop("profiler_cost_uncalibrated")["severity"] == "info"  # not captured by profparse
    assert found == {}


def test_unlinked_gpu_activity(tmp_path):
    b = clean()
    b.events.append(
        {"ph": "X", "cat": "kernel", "name": "orphan", "pid": GPU_PID, "tid": STREAM, "ts": 150, "dur": 40,
         "args": {"correlation": 999999, "stream": STREAM}}
    )  # fmt: skip
    found = checks(b, tmp_path)
    assert found["gpu_unlinked"]["count"] == 1
    assert 0 < found["gpu_unlinked"]["value"] < 1
    assert found["gpu_unlinked"]["message"].startswith("1 GPU event (0.")  # one event, its time in ms


def test_overlap_on_one_stream_and_kernel_before_launch(tmp_path):
    b = clean()
    runtime, kernel = b.launch(60, 4, 10, name="early")  # starts at 4 us, launched at 60 us; overlaps gemm_fwd
    found = checks(b, tmp_path)
    assert found["timestamps_backwards"]["count"] == 1
    assert found["stream_overlap"]["count"] >= 1
    assert found["stream_overlap"]["severity"] == "warning"  # microseconds of a 10 us kernel: timestamps to distrust


def test_a_sliver_of_stream_overlap_is_information_not_a_warning(tmp_path):
    """Programmatic dependent launch (Hopper's cuBLAS split-K reduce) starts a kernel ~0.1 us before the one it
    follows ends: 0.1 us against 2 ms of GPU time is information; 3 us is a warning (clocks to distrust)."""
    for gap_us, severity in ((-0.1, "info"), (-3.0, "warning")):
        b = TraceBuilder()
        b.annotation("ProfilerStep#1", 0, 3000)
        b.launch(10, 20, 1000, name="nvjet_sm90_tst_96x64_64x8_4x2_h_bz_splitK")
        b.launch(15, 1020 + gap_us, 1000, name="cublasLt::splitKreduce_kernel")
        found = checks(b, tmp_path)
        assert found["stream_overlap"]["severity"] == severity
        assert found["stream_overlap"]["value"] == pytest.approx(-gap_us * 1000)
        assert ("programmatic dependent launch" in found["stream_overlap"]["message"]) == (severity == "info")


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


def test_events_that_differ_only_in_args_are_not_duplicates(tmp_path):
    b = clean()
    shapes = b.op("aten::add", 150, 5, **{"Input Dims": [[2, 2]]})
    twin = copy.deepcopy(shapes)
    twin["args"]["Input Dims"] = [[4, 4]]  # an arg the tables do not keep
    b.events.append(twin)
    other_id = copy.deepcopy(shapes)
    other_id["args"]["External id"] = 77  # an arg the tables keep
    b.events.append(other_id)
    assert "duplicate_events" not in checks(b, tmp_path)
    b.events.append(copy.deepcopy(twin))  # now one event really is there twice
    found = checks(b, tmp_path)
    assert found["duplicate_events"]["count"] == 1


def test_gpu_devices_without_device_properties(tmp_path):
    from profparse.analysis.quality import gpu_devices
    from profparse.outputs.summary import render_summary

    b = clean()
    del b.header["deviceProperties"]
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert gpu_devices(p) == ["GPU 0"]
    assert "no GPU" not in render_summary(p).splitlines()[1]
    cpu = TraceBuilder()
    del cpu.header["deviceProperties"]
    cpu.annotation("ProfilerStep#1", 0, 10)
    cpu.op("aten::mm", 1, 5)
    p = profparse.parse(cpu.write(tmp_path / "cpu.json"))
    assert gpu_devices(p) == []
    assert render_summary(p).splitlines()[1].endswith("no GPU")
    with_names = profparse.parse(clean().write(tmp_path / "named.json"))
    assert gpu_devices(with_names) == ["Fake GPU"]


def test_gpu_devices_are_those_that_ran_gpu_work(tmp_path):
    """Kineto lists every device of the machine in ``deviceProperties`` (8 on each shared trace, one used): the
    header names the device the trace's GPU work ran on, not "8 x A100" for one rank of a node."""
    from profparse.analysis.quality import gpu_devices
    from profparse.outputs.summary import render_summary

    b = clean()
    b.header["deviceProperties"] = [{"id": i, "name": f"GPU model {i}"} for i in range(4)]
    for event in b.events:
        if event.get("cat") == "kernel":
            event["args"]["device"] = 2
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert gpu_devices(p) == ["GPU model 2"]
    assert json.loads(render_summary(p, fmt="json"))["devices"] == ["GPU model 2"]
    cpu = TraceBuilder()  # no GPU work: the machine's devices, as listed
    cpu.header["deviceProperties"] = [{"id": i, "name": "GPU model"} for i in range(2)]
    cpu.annotation("ProfilerStep#1", 0, 10)
    cpu.op("aten::mm", 1, 5)
    assert gpu_devices(profparse.parse(cpu.write(tmp_path / "cpu.json"))) == ["GPU model", "GPU model"]


@pytest.mark.parametrize("backend", ["cuda", "xpu", "mtia", "privateuse1"])
@pytest.mark.parametrize("layer", ["runtime", "driver"])
def test_runtime_categories_of_other_backends_link(tmp_path, backend, layer):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.annotation("Optimizer.step#SGD.step", 10, 20)
    b.op("aten::_foreach_add_", 11, 10)
    runtime, kernel = b.launch(12, 15, 5, name="sgd_kernel")
    runtime["cat"] = f"{backend}_{layer}"
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = p.kernels.iloc[0]
    assert k["launch_name"] == "cudaLaunchKernel" and k["launch_op_name"] == "aten::_foreach_add_"
    assert k["stage"] == "optimizer"
    assert "gpu_unlinked" not in {r["check"] for r in p.warnings.to_dict("records")}


def test_byte_units_are_binary_and_say_so():
    from profparse.base.formats import bytes_text, total_bytes_text

    assert total_bytes_text(3 << 20) == "3.0 MiB" and total_bytes_text(5 << 30) == "5.0 GiB"
    assert bytes_text(-(2 << 10)) == "-2.0 KiB" and bytes_text(1536 << 20) == "1.5 GiB"


def test_repeated_hash_marks_exactly_the_repeated_rows(shared_trace):
    """quality's sort-then-lookup of repeated row hashes marks the rows that another row equals, as a DataFrame
    duplicated() over those columns does (rows listed twice stand in for duplicated events)."""
    from profparse.analysis import quality

    events = parsed(shared_trace).raw.events
    rows = np.flatnonzero((events["kind"] != "metadata").to_numpy())
    rows = np.sort(np.concatenate([rows, rows[::97]]))
    columns = [c for c in events.columns if c != "trace_index"]
    expected = events.iloc[rows][columns].duplicated(keep=False).to_numpy()
    assert expected.any() and not expected.all()
    np.testing.assert_array_equal(quality._repeated_hash(events, rows, columns), expected)
    unique = np.flatnonzero((events["kind"] != "metadata").to_numpy())
    np.testing.assert_array_equal(
        quality._repeated_hash(events, unique, columns),
        events.iloc[unique][columns].duplicated(keep=False).to_numpy(),
    )
