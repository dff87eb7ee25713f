"""The stage x level matrix on a hand-built trace and on real GPU traces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import parsed as parsed_once
from tracebuilder import AUTOGRAD, MAIN, PID, TraceBuilder, training_step

import profparse
from profparse.base.marks import STAGES
from profparse.outputs.summary import render_summary
from profparse.tables.host_time import host_segments, working_threads
from profparse.trace.kinds import NULL

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
    # ops' wall share: at most their CPU time (two threads running ops of one stage at once count once)
    assert (levels["op_ns"] - levels["op_python_ns"] <= summary["host_op_ns"]).all()
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


NULL_STEP = NULL

# -- honest levels: waiting threads, a main thread waiting on the engine, steps capped --------------------------------

MONITOR = 300


def waiting_trace(tmp_path) -> profparse.ParsedTrace:
    """Two steps (0-100, 100-200 us). Main: forward module 1-21 (op 2-17 with a launch 3-4 and Python 10-12, a
    sync 18-20), ``_engine_run_backward`` 25-70 around ``run_backward`` 26-69 (waiting for the autograd thread),
    optimizer range 75-95 (op 76-86, a lock wait 87-90); step 2: an op 120-130. Autograd thread: a node 30-60
    (child 31-56 with a launch 32-33) and a node 96-110 that crosses into step 2. A tqdm monitor thread that only
    waits, 0-300."""
    b = TraceBuilder()
    b.events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": MONITOR, "args": {"name": "monitor"}})
    b.annotation("ProfilerStep#1", 0, 100)
    b.annotation("ProfilerStep#2", 100, 100)
    b.py("nn.Module: Linear_0", 1, 20)
    b.op("aten::linear", 2, 15)
    b.launch(3, 5, 4, name="gemm")
    b.py("torch/_refs/__init__.py(1149): _ref", 10, 2)
    b.span("cudaStreamSynchronize", 18, 2, "cuda_runtime")
    b.py("torch/autograd/graph.py(825): _engine_run_backward", 25, 45)
    b.py("<built-in method run_backward of torch._C._EngineBase object at 0x7f00>", 26, 43)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 30, 30, tid=AUTOGRAD)
    b.op("AddmmBackward0", 31, 25, tid=AUTOGRAD)
    b.launch(32, 40, 10, tid=AUTOGRAD, name="gemm_bwd")
    b.op("autograd::engine::evaluate_function: MmBackward0", 96, 14, tid=AUTOGRAD)
    b.annotation("Optimizer.step#AdamW.step", 75, 20)
    b.op("aten::_foreach_add_", 76, 10)
    b.py("<method 'acquire' of '_thread.lock' objects>", 87, 3)
    b.op("aten::mm", 120, 10)
    b.py("threading.py(1002): _bootstrap", 0, 300, tid=MONITOR)
    b.py("tqdm/_monitor.py(69): run", 1, 298, tid=MONITOR)
    b.py("threading.py(331): wait", 2, 296, tid=MONITOR)
    return profparse.parse(b.write(tmp_path / "w.json"))


STAGE_OF = {  # the stage of each host event, fixed here so the test does not depend on the stage rules
    "nn.Module: Linear_0": "forward", "aten::linear": "forward", "cudaLaunchKernel": None, "_ref": "forward",
    "cudaStreamSynchronize": "forward", "_engine_run_backward": "backward", "run_backward": "backward",
    "Backward0": "backward", "Optimizer": "optimizer", "_foreach_add_": "optimizer", "acquire": "optimizer",
    "aten::mm": "forward", "ProfilerStep": "other",
}  # fmt: skip


def with_stages(p: profparse.ParsedTrace, monitor_stage: str) -> profparse.ParsedTrace:
    """``p`` with host stages from :data:`STAGE_OF` (launches: their parent's), the monitor thread in
    ``monitor_stage``."""
    events, links = p.raw.events, p.links
    stage = p.attribution.stage.copy()
    names = events["name"].astype(str).to_numpy()
    tids = events["tid"].to_numpy()
    for row in np.flatnonzero(links.host):
        if tids[row] == MONITOR:
            stage[row] = STAGES.index(monitor_stage)
            continue
        hit = [s for part, s in STAGE_OF.items() if part in names[row] and s is not None]
        if hit:
            stage[row] = STAGES.index(hit[0])
    for row in np.flatnonzero(links.host & (names == "cudaLaunchKernel")):
        stage[row] = stage[links.parent[row]]
    for row in np.flatnonzero(links.launch >= 0):
        stage[row] = stage[links.launch[row]]
    attribution = dataclasses.replace(p.attribution, stage=stage)
    return profparse.ParsedTrace(raw=p.raw, links=links, attribution=attribution)


@pytest.mark.parametrize("monitor_stage", ["other", "forward"])
def test_honest_levels_by_hand(tmp_path, monitor_stage):
    p = with_stages(waiting_trace(tmp_path), monitor_stage)
    levels = p.table("stage_levels").set_index(["scope", "step", "stage"])  # internal: NULL step for totals
    summary = p.table("stage_summary").set_index(["scope", "step", "stage"])

    def row(step, stage):
        return levels.loc[("step", step, stage)], summary.loc[("step", step, stage), "host_wall_ns"]

    forward, wall = row(1, "forward")
    assert wall == 20 * US  # the module, 1-21 (the monitor thread adds nothing, whatever its stage)
    assert forward["python_ns"] == 3 * US  # module self time: 1-2, 17-18, 20-21
    assert forward["op_ns"] == (12 + 2) * US and forward["op_python_ns"] == 2 * US  # aten::linear self + _ref
    assert forward["runtime_ns"] == (1 + 2) * US and forward["sync_ns"] == 2 * US  # launch, cudaStreamSynchronize
    assert forward["wait_ns"] == 0
    backward, wall = row(1, "backward")
    assert wall == (45 + 4) * US  # main 25-70 (autograd 30-60 inside it) and 96-100, capped at the step's end
    assert backward["op_ns"] == (5 + 24 + 4) * US  # node self 30-31, 56-60; child self 31-32, 33-56; 96-100
    assert backward["runtime_ns"] == 1 * US  # the launch 32-33 (the main thread waits meanwhile)
    assert backward["wait_ns"] == (45 - 30) * US  # main waiting while the autograd thread does nothing
    assert backward["python_ns"] == 0
    optimizer, wall = row(1, "optimizer")
    assert wall == 20 * US
    assert (optimizer["op_ns"], optimizer["wait_ns"], optimizer["python_ns"]) == (10 * US, 3 * US, 7 * US)
    assert row(2, "backward")[1] == 10 * US  # the rest of the node that crossed into step 2
    assert row(2, "forward")[1] == 10 * US
    totals = summary.xs("total", level="scope")
    assert totals.loc[(NULL_STEP, "other"), "host_wall_ns"] == 0  # ProfilerStep ranges hold several stages
    assert totals.loc[(NULL_STEP, "backward"), "host_wall_ns"] == 59 * US
    host_levels = levels.xs("total", level="scope")
    assert host_levels["python_ns"].sum() == (3 + 7) * US  # no Python from the monitor thread


def host_levels_add_up(p: profparse.ParsedTrace) -> None:
    levels, summary = p.table("stage_levels"), p.table("stage_summary")
    wall = summary["host_wall_ns"].to_numpy()
    parts = (levels["python_ns"] + levels["op_ns"] + levels["runtime_ns"] + levels["wait_ns"]).to_numpy()
    assert (parts == wall).all()
    for column in ("python_ns", "op_ns", "op_python_ns", "runtime_ns", "sync_ns", "wait_ns"):
        assert (levels[column] >= 0).all(), column
    assert (levels["op_python_ns"] <= levels["op_ns"]).all() and (levels["sync_ns"] <= levels["runtime_ns"]).all()
    rows = summary[summary["scope"] != "total"].groupby("stage", observed=False)["host_wall_ns"].sum()
    total = summary[summary["scope"] == "total"].set_index("stage")["host_wall_ns"]
    assert (rows == total).all()
    steps = p.steps.set_index("step")
    per_step = summary[summary["scope"] == "step"]
    window = (steps["end_ns"] - steps["start_ns"]).reindex(per_step["step"].to_numpy()).to_numpy()
    assert (per_step["host_wall_ns"].to_numpy() <= window).all()  # capped at the step window


def test_host_levels_add_up_by_hand(tmp_path):
    host_levels_add_up(waiting_trace(tmp_path))
    host_levels_add_up(with_stages(waiting_trace(tmp_path), "forward"))
    host_levels_add_up(build(tmp_path))


def test_host_levels_add_up_on_sample_traces(sample_trace):
    p = parsed_once(sample_trace)
    host_levels_add_up(p)
    t = totals(p)
    assert (
        t.loc["other", "python_ns"]
        <= p.stage_summary.query("scope == 'total' and stage == 'other'")["host_wall_ns"].iloc[0]
    )


def test_host_levels_add_up_on_shared_traces(shared_trace):
    host_levels_add_up(parsed_once(shared_trace))


def test_waiting_only_threads_create_no_stage_time(tmp_path):
    p = waiting_trace(tmp_path)  # the stage rules decide here
    flags = working_threads(p.raw.events, p.links, p.attribution.stage)
    threads = p.links.threads
    monitor = int(np.flatnonzero(threads["tid"].to_numpy() == MONITOR)[0])
    main = int(np.flatnonzero(threads["tid"].to_numpy() == MAIN)[0])
    assert not flags[monitor] and flags[main]
    seg = host_segments(p.raw.events, p.links, p.attribution)
    assert seg.end.max() <= 200 * US  # nothing from the monitor's 0-300 us


def test_engine_running_inline_is_not_waiting(tmp_path):
    """On CPU the engine runs backward on the calling thread: ``run_backward`` holds the nodes, so its own time is
    Python, not waiting; an absolute-path ``threading.py`` wait on the main thread is waiting."""
    b = TraceBuilder(autograd_thread=False)
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::mm", 1, 9)
    b.py("<built-in method run_backward of torch._C._EngineBase object at 0x7f00>", 20, 40)
    b.op("autograd::engine::evaluate_function: MmBackward0", 25, 30)
    b.py("/usr/lib/python3.11/threading.py(331): wait", 70, 10)
    p = profparse.parse(b.write(tmp_path / "cpu.json"))
    stage = p.attribution.stage.copy()
    names = p.raw.events["name"].astype(str).to_numpy()
    for part, name in (("aten::mm", "forward"), ("run_backward", "backward"), ("MmBackward0", "backward"),
                       ("threading", "other")):  # fmt: skip
        stage[np.char.find(names.astype(str), part) >= 0] = STAGES.index(name)
    p = profparse.ParsedTrace(raw=p.raw, links=p.links, attribution=dataclasses.replace(p.attribution, stage=stage))
    levels = p.table("stage_levels").set_index(["scope", "stage"]).loc["total"]
    assert levels.loc["backward", "python_ns"] == 10 * US and levels.loc["backward", "wait_ns"] == 0
    assert levels.loc["backward", "op_ns"] == 30 * US
    assert levels.loc["other", "wait_ns"] == 10 * US and levels.loc["other", "python_ns"] == 0
    host_levels_add_up(p)
