"""The step phase model on hand-built traces with known stages, and its invariants on real traces."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_TRACES
from conftest import parsed as cached_parse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracebuilder import TraceBuilder, backward_node

import profparse
from profparse.stages.phases import RUN_STAGES, find_runs, windows

FLOW_ID = [0]


def recorded(b: TraceBuilder, name: str, ts: float, dur: float, tid: int = 100) -> dict:
    """A forward op that recorded autograd history: it starts a ``fwdbwd`` flow."""
    FLOW_ID[0] += 1
    event = b.op(name, ts, dur, tid, **{"Sequence number": FLOW_ID[0]})
    b.events.append({"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": FLOW_ID[0], "pid": 1, "tid": tid, "ts": ts})
    return event


def parse(b: TraceBuilder, tmp_path, **kwargs) -> profparse.ParsedTrace:
    return profparse.parse(b.write(tmp_path / "t.json"), **kwargs)


def decided(p: profparse.ParsedTrace, name: str, nth: int = 0) -> list[str]:
    row = p.events[p.events["name"] == name].iloc[nth]
    return [row["stage"], row["stage_rule"]]


def kernel(p: profparse.ParsedTrace, name: str) -> list[str]:
    row = p.kernels[p.kernels["name"] == name].iloc[0]
    return [row["stage"], row["stage_rule"]]


def engine(b: TraceBuilder, ts: float, dur: float = 10) -> None:
    backward_node(b, "MulBackward0", ts, dur, seq=999)


def test_collectives_take_the_stage_of_their_phase(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.op("record_param_comms", 2, 4)  # input redistribution before the model runs
    b.launch(3, 10, 5, name="all_to_all_input")
    recorded(b, "aten::embedding", 10, 5)
    b.op("nccl:all_gather", 20, 5)  # tensor parallel inside forward, no module frame (no stacks)
    b.launch(21, 30, 8, name="all_gather_kernel")
    recorded(b, "aten::mm", 30, 5)
    engine(b, 50)
    b.annotation("Optimizer.step#SGD.step", 80, 10)
    b.op("gloo:all_reduce", 100, 5)  # after the optimizer: outside every phase
    p = parse(b, tmp_path)
    assert decided(p, "nccl:all_gather") == ["forward", "forward.phase"]
    assert kernel(p, "all_gather_kernel") == ["forward", "forward.phase"]
    assert decided(p, "record_param_comms") == ["other", "other.data.distribution"]
    assert kernel(p, "all_to_all_input") == ["other", "other.data.distribution"]
    assert decided(p, "gloo:all_reduce") == ["other", "other.communication"]


def test_batch_copy_before_forward_is_data_not_forward(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.annotation("## load_batch ##", 1, 8)
    b.op("aten::to", 2, 5)
    b.launch(3, 4, 6, name="Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy")
    b.op("aten::_to_copy", 11, 3)  # a second copy, outside any user range
    b.launch(12, 13, 2, name="Memcpy HtoD (Pinned -> Device)", cat="gpu_memcpy")
    recorded(b, "aten::embedding", 20, 5)
    engine(b, 40)
    p = parse(b, tmp_path)
    assert decided(p, "aten::to") == ["other", "other.data.user_range"]
    assert kernel(p, "Memcpy HtoD (Pageable -> Device)") == ["other", "other.data.user_range"]
    assert decided(p, "aten::_to_copy") == ["other", "other.data.batch_copy"]
    assert kernel(p, "Memcpy HtoD (Pinned -> Device)") == ["other", "other.data.batch_copy"]


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("## metrics ##", "other.metrics.user_range"),
        ("log_loss", "other.metrics.user_range"),
        ("copy_batch_to_gpu", "other.data.user_range"),
        ("DataLoader next", "other.data.user_range"),
    ],
)
def test_user_range_words_after_the_optimizer(tmp_path, name, rule):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    recorded(b, "aten::mm", 5, 5)
    engine(b, 20)
    b.annotation("Optimizer.step#AdamW.step", 40, 10)
    b.annotation(name, 60, 20)
    b.op("aten::mean", 61, 5)
    b.op("aten::item", 90, 2)  # outside the range, after the optimizer: the rest of the step
    p = parse(b, tmp_path)
    assert decided(p, "aten::mean") == ["other", rule]
    assert decided(p, "aten::item") == ["other", "other.step"]


def test_user_words_are_not_read_into_other_names():
    from profparse.stages.rules import RULES

    by_name = {r.name: r for r in RULES}
    data = re.compile(by_name["other.data.user_range"].pattern)
    metrics = re.compile(by_name["other.metrics.user_range"].pattern)
    zero_grad = re.compile(by_name["user_range.zero_grad"].pattern)
    assert data.search("DistributedDataParallel.forward") is None
    assert metrics.search("compute_logits") is None and metrics.search("## catalog ##") is None
    assert zero_grad.search("Optimizer.zero_grad#AdamW.zero_grad") is None  # optimizer.range decides that one
    assert data.search("## load_batch ##") and metrics.search("## log ##") and zero_grad.search("model.zero_grad")


def test_zero_grad_at_the_start_of_the_step(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.annotation("## zero_grad ##", 1, 5)  # model.zero_grad() in a user range: no Optimizer.* range
    b.op("aten::zero_", 2, 2)
    b.annotation("Optimizer.zero_grad#AdamW.zero_grad", 8, 3)
    b.op("aten::copy_", 12, 3)  # the batch, after zero_grad, before forward
    recorded(b, "aten::mm", 20, 5)
    b.op("aten::ones_like", 30, 3)  # the loss-gradient seed
    b.op("aten::fill_", 31, 1)
    b.launch(31.5, 35, 1, name="fill_kernel")
    engine(b, 40)
    b.op("aten::_foreach_norm", 55, 3)  # gradient clipping between backward and the optimizer
    b.annotation("Optimizer.step#AdamW.step", 60, 10)
    p = parse(b, tmp_path)
    assert decided(p, "aten::zero_") == ["optimizer", "user_range.zero_grad"]
    assert decided(p, "aten::copy_") == ["other", "other.data.batch_copy"]
    assert decided(p, "aten::ones_like") == ["backward", "backward.loss_seed"]
    assert decided(p, "aten::fill_") == ["backward", "backward.loss_seed"]
    assert kernel(p, "fill_kernel") == ["backward", "backward.loss_seed"]
    assert decided(p, "aten::_foreach_norm") == ["optimizer", "optimizer.before_step"]
    runs = phase_runs(p)
    assert [RUN_STAGES[s] for s in runs["stage"]] == ["optimizer", "forward", "backward", "optimizer"]


def test_loss_seed_needs_a_backward_right_after(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    recorded(b, "aten::mm", 5, 5)
    b.op("aten::ones_like", 12, 3)  # forward-only step (evaluation): no backward follows
    p = parse(b, tmp_path)
    assert decided(p, "aten::ones_like") == ["forward", "forward.inference"]
    b.annotation("Optimizer.step#SGD.step", 20, 5)  # with an optimizer it is a training step: just other
    assert decided(parse(b, tmp_path), "aten::ones_like") == ["other", "other.step"]


def test_weight_init_before_first_forward_without_stacks_is_load(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 0, 100)  # loading step, no Python frames
    for i, name in enumerate(("aten::empty", "aten::normal_", "aten::uniform_", "aten::arange", "aten::pow")):
        b.op(name, 1 + 10 * i, 5)
    b.op("aten::copy_", 60, 5)
    b.launch(61, 62, 3, name="Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy")
    b.annotation("ProfilerStep#1", 100, 100)
    b.op("aten::zeros_like", 101, 2)  # the first training step, before its forward: not loading
    recorded(b, "aten::mm", 110, 5)
    engine(b, 130)
    b.annotation("Optimizer.step#SGD.step", 160, 10)
    p = parse(b, tmp_path, include_marks=False)
    for name in ("aten::empty", "aten::normal_", "aten::uniform_", "aten::arange", "aten::pow", "aten::copy_"):
        assert decided(p, name) == ["load", "load.before_first_forward"], name
    assert kernel(p, "Memcpy HtoD (Pageable -> Device)") == ["load", "load.before_first_forward"]
    assert decided(p, "aten::zeros_like") == ["other", "other.step"]


def test_setup_without_loading_ops_is_not_load(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 0, 100)
    b.op("aten::zeros", 1, 5)  # e.g. a metric buffer: no weight init, no checkpoint, no copy
    b.annotation("ProfilerStep#1", 100, 100)
    recorded(b, "aten::mm", 110, 5)
    engine(b, 130)
    b.annotation("Optimizer.step#SGD.step", 160, 10)
    assert decided(parse(b, tmp_path), "aten::zeros") == ["other", "other.step"]


def test_no_profiler_step_loading_then_training(tmp_path):
    b = TraceBuilder()
    b.op("aten::empty", 0, 5)  # torch.load + load_state_dict: storages set, parameters copied
    b.op("aten::set_", 6, 2)
    b.op("aten::copy_", 10, 5)
    for k in range(2):
        t = 100 + 100 * k
        recorded(b, "aten::linear", t, 10)
        b.op("aten::zeros", t + 12, 2)
        recorded(b, "aten::relu", t + 15, 3)
        engine(b, t + 30)
        b.annotation("Optimizer.step#Adam.step", t + 60, 10)
    p = parse(b, tmp_path)
    assert list(p.steps["source"].unique()) == ["optimizer_boundaries"]
    for name in ("aten::empty", "aten::set_", "aten::copy_"):
        assert decided(p, name) == ["load", "load.before_first_forward"], name
    zeros = p.events[p.events["name"] == "aten::zeros"]
    assert list(zeros["stage_rule"]) == ["forward.phase"] * 2


def test_no_profiler_step_trace_starting_mid_training_has_no_loading(tmp_path):
    b = TraceBuilder()
    b.op("aten::to", 0, 5)  # the profiler started just before a batch copy: copies alone are no loading
    b.launch(1, 2, 3, name="Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy")
    recorded(b, "aten::mm", 10, 5)
    engine(b, 20)
    b.annotation("Optimizer.step#SGD.step", 40, 10)
    p = parse(b, tmp_path)
    assert decided(p, "aten::to") == ["other", "other.data.batch_copy"]
    assert kernel(p, "Memcpy HtoD (Pageable -> Device)") == ["other", "other.data.batch_copy"]


def test_gradient_accumulation_has_a_phase_per_micro_batch(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 300)
    for m in range(2):
        t = 100 * m
        b.op("aten::to", t + 1, 3)  # this micro-batch's copy
        recorded(b, "aten::mm", t + 10, 5)
        b.op("aten::div", t + 16, 2)  # loss / accumulation steps, no history recorded here
        recorded(b, "aten::add", t + 20, 5)
        b.op("aten::ones_like", t + 30, 2)
        engine(b, t + 40)
    b.annotation("Optimizer.step#AdamW.step", 250, 10)
    p = parse(b, tmp_path)
    ev = p.events
    assert list(ev.loc[ev["name"] == "aten::to", "stage_rule"]) == ["other.data.batch_copy"] * 2
    assert list(ev.loc[ev["name"] == "aten::div", "stage_rule"]) == ["forward.phase"] * 2
    assert list(ev.loc[ev["name"] == "aten::ones_like", "stage_rule"]) == ["backward.loss_seed"] * 2
    runs = phase_runs(p)
    assert [RUN_STAGES[s] for s in runs["stage"]] == ["forward", "backward"] * 2 + ["optimizer"]


def test_recompute_inside_backward_does_not_split_the_phase(tmp_path):
    b = TraceBuilder(autograd_thread=False)  # a CPU run: the engine works on the main thread
    b.annotation("ProfilerStep#1", 0, 200)
    b.py("nn.Module: Model_0", 1, 30)
    recorded(b, "aten::mm", 2, 5)
    b.op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 50, 20)
    b.py("nn.Module: Layer_0", 51, 15)  # the recomputed forward
    b.op("aten::mm", 52, 5)
    b.op("aten::zeros", 75, 2)  # between engine nodes on the main thread
    backward_node(b, "MmBackward0", 80, 10, seq=5, tid=100)
    b.annotation("Optimizer.step#AdamW.step", 150, 10)
    p = parse(b, tmp_path)
    assert decided(p, "aten::mm", 1) == ["backward", "backward.engine"]
    assert decided(p, "aten::zeros") == ["backward", "backward.phase"]
    assert [RUN_STAGES[s] for s in phase_runs(p)["stage"]] == ["forward", "backward", "optimizer"]


def test_a_legacy_user_range_around_the_step_is_not_forward(tmp_path):
    b = TraceBuilder()
    b.span("ProfilerStep#1", 0, 200)  # 2021-style: ProfilerStep and record_function ranges are cpu_op
    b.span("train_step", 1, 150)
    b.op("aten::linear", 2, 10)
    b.op("aten::addmm", 3, 5, **{"Sequence number": 1})
    b.op("aten::zeros", 20, 2)
    b.op("AddmmBackward", 30, 10, tid=999, **{"Sequence number": 1})
    b.span("Optimizer.step#SGD.step", 60, 10)
    b.op("aten::item", 100, 2)
    p = parse(b, tmp_path)
    assert decided(p, "aten::linear") == ["forward", "forward.phase"]  # the operator around evidence is forward
    assert decided(p, "aten::zeros") == ["other", "other.step"]  # not a seed op, between forward and backward
    assert decided(p, "aten::item") == ["other", "other.step"]
    assert decided(p, "train_step") == ["other", "other.step"]


def test_sync_after_a_phase_waits_for_it(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    recorded(b, "aten::mm", 5, 5)
    b.span("cudaDeviceSynchronize", 12, 3, "cuda_runtime")
    engine(b, 30)
    b.span("cudaStreamSynchronize", 45, 3, "cuda_runtime", tid=100)
    b.annotation("Optimizer.step#AdamW.step", 60, 10)
    b.span("hipDeviceSynchronize", 75, 3, "cuda_runtime")
    p = parse(b, tmp_path)
    assert decided(p, "cudaDeviceSynchronize") == ["forward", "forward.sync"]
    assert decided(p, "cudaStreamSynchronize") == ["backward", "backward.sync"]
    assert decided(p, "hipDeviceSynchronize") == ["optimizer", "optimizer.sync"]


def test_sync_after_the_last_step_says_it_waits_for_the_steps_work(tmp_path):
    """A synchronize after the last step (the loop's end, or the profiler's stop) waits for the GPU work the steps
    queued: it is other, by a rule that says so, not unclassified; one right after the optimizer inside the last
    step stays the optimizer's, and one after a step that is not the last is the step's."""
    b = TraceBuilder()
    for step, t0 in ((1, 0), (2, 100)):
        b.annotation(f"ProfilerStep#{step}", t0, 90)
        recorded(b, "aten::mm", t0 + 5, 5)
        engine(b, t0 + 30)
        b.annotation("Optimizer.step#AdamW.step", t0 + 60, 10)
        b.span("cudaStreamSynchronize", t0 + 75, 3, "cuda_runtime")
    b.span("cudaDeviceSynchronize", 195, 89, "cuda_runtime")  # after ProfilerStep#2 ended at 190
    p = parse(b, tmp_path)
    assert decided(p, "cudaStreamSynchronize", 0) == decided(p, "cudaStreamSynchronize", 1)
    assert decided(p, "cudaStreamSynchronize", 1) == ["optimizer", "optimizer.sync"]
    assert decided(p, "cudaDeviceSynchronize") == ["other", "other.sync_after_steps"]


@pytest.mark.skipif(not (SHARED_TRACES / "v100_ns_resolution_5steps.json.gz").exists(), reason="needs ../shared")
def test_the_v100_traces_final_synchronize_is_named():
    """The 2021 V100 trace ends in an 89 ms cudaDeviceSynchronize after ProfilerStep#105: 18.6% of the host wall
    in other, which said only 'unclassified'."""
    p = cached_parse(SHARED_TRACES / "v100_ns_resolution_5steps.json.gz")
    last = p.events[p.events["name"] == "cudaDeviceSynchronize"].sort_values("ts_ns").iloc[-1]
    assert last["dur_ns"] > 80e6 and last["ts_ns"] >= p.steps["end_ns"].max()
    assert (last["stage"], last["stage_rule"]) == ("other", "other.sync_after_steps")


def test_frames_around_the_phases_are_not_gap_events(tmp_path):
    b = TraceBuilder()
    b.py("train.py(10): <module>", 0, 400)  # starts before the first forward and holds every phase
    b.op("aten::normal_", 1, 5)
    b.annotation("ProfilerStep#1", 100, 200)
    b.py("train.py(20): train_step", 101, 150)
    recorded(b, "aten::mm", 110, 5)
    b.op("aten::zeros", 117, 2)
    recorded(b, "aten::cross_entropy_loss", 120, 5)
    engine(b, 140)
    b.annotation("Optimizer.step#SGD.step", 200, 10)
    p = parse(b, tmp_path)
    assert decided(p, "aten::zeros") == ["forward", "forward.phase"]
    assert decided(p, "aten::normal_") == ["load", "load.before_first_forward"]
    assert decided(p, "train.py(10): <module>")[0] == "other"


def test_nothing_in_a_step_defaults_to_forward(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.op("aten::randn", 1, 5)
    b.op("aten::mul", 10, 5)
    b.op("aten::sum", 20, 5)
    p = parse(b, tmp_path)
    ops = p.ops
    assert set(ops["stage"]) == {"other"} and set(ops["stage_rule"]) == {"other.step"}


def test_without_marks_the_same_phases_are_found(tmp_path):
    """A marked step: stripping the marks must give the same stage to every op."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 300)
    b.op("aten::to", 1, 3)
    b.annotation("profparse.stage:forward", 9, 30)
    b.op("aten::arange", 10, 2)  # no history, but inside the model's forward
    recorded(b, "aten::embedding", 13, 5)
    recorded(b, "aten::mm", 20, 5)
    b.op("aten::zeros", 26, 2)
    recorded(b, "aten::cross_entropy_loss", 30, 5)
    b.annotation("profparse.stage:backward", 40, 50)
    b.op("aten::ones_like", 41, 2)
    engine(b, 50)
    b.annotation("profparse.stage:optimizer", 100, 30)
    b.op("aten::_foreach_norm", 101, 3)
    b.annotation("Optimizer.step#AdamW.step", 110, 10)
    b.op("aten::item", 150, 2)
    marked, inferred = parse(b, tmp_path), parse(b, tmp_path, include_marks=False)
    keep = ~marked.ops["name"].astype(str).isin(["aten::to", "aten::item", "aten::arange"])
    assert (marked.ops["stage"][keep].to_numpy() == inferred.ops["stage"][keep].to_numpy()).all()
    # the ops outside every mark are other in the marked trace's truth; inference agrees
    assert decided(inferred, "aten::to")[0] == "other" and decided(inferred, "aten::item")[0] == "other"
    # known limit: an op with no history before the first forward evidence starts the gap, not the phase
    assert decided(inferred, "aten::arange") == ["other", "other.step"]


# -- invariants ------------------------------------------------------------------------------------------------


def phase_runs(p: profparse.ParsedTrace) -> pd.DataFrame:
    """Recompute the phase runs from the trace's own decisions of the evidence rules."""
    from profparse.base.marks import STAGES
    from profparse.stages.attribute import _needs_phases

    events, attribution = p.raw.events, p.attribution
    rules = attribution.rules
    rule = attribution.rule
    is_evidence = np.array([not _needs_phases(r) for r in rules] + [False] * 3)
    stage = np.where(is_evidence[rule], attribution.stage, -1)
    window, _ = windows(events["ts_ns"].to_numpy(), attribution.steps)
    return find_runs(events, p.links, stage, STAGES, attribution.main_thread, window)


def test_every_op_has_one_stage_and_stage_times_add_up(tmp_path):
    b = TraceBuilder()
    for step in range(3):
        t = 300 * step
        b.annotation(f"ProfilerStep#{step}", t, 300)
        b.op("aten::to", t + 1, 3)
        recorded(b, "aten::mm", t + 10, 5)
        b.op("aten::ones_like", t + 30, 2)
        engine(b, t + 40)
        b.annotation("Optimizer.step#AdamW.step", t + 100, 10)
        b.op("aten::item", t + 150, 2)
    p = parse(b, tmp_path)
    ops = p.ops
    assert ops["stage"].notna().all() and ops["stage_rule"].notna().all()
    per_stage = ops.groupby("stage", observed=True)["self_ns"].sum()
    assert per_stage.sum() == ops["self_ns"].sum()
    assert per_stage["other"] == 3 * (3 + 2) * 1000  # the copies and the item() calls
    assert per_stage["backward"] == 3 * (2 + 10) * 1000  # the seed and the engine node


def test_forward_phase_rows_lie_between_forward_evidence(shared_trace):
    """On real traces: an event is forward by phase only when forward evidence comes before and after it."""
    p = cached_parse(shared_trace, include_marks=False)
    events = p.events
    rules = events["stage_rule"].astype(str).to_numpy()
    assert not np.isin(rules, ["forward.step", "forward.main_thread"]).any()
    runs = phase_runs(p)
    forward = runs[runs["stage"] == RUN_STAGES.index("forward")]
    rows = np.flatnonzero((rules == "forward.phase") & p.links.host)
    ts = events["ts_ns"].to_numpy()[rows]
    starts, ends = forward["start_ns"].to_numpy(), forward["end_ns"].to_numpy()
    k = np.searchsorted(starts, ts, side="right") - 1
    assert (k >= 0).all() and (ts < ends[k]).all()


def test_host_work_in_steps_is_forward_only_with_evidence(shared_trace):
    """On real traces, main-thread ops in a step that no evidence places are other, never forward."""
    p = cached_parse(shared_trace, include_marks=False)
    ops = p.ops
    main = p.attribution.main_thread
    on_main = p.links.thread[ops["trace_index"].to_numpy()] == main
    forward = ops[on_main & (ops["stage"] == "forward").to_numpy()]
    allowed = {"forward.module", "forward.autograd_op", "forward.compiled", "forward.phase", "forward.sync"}
    allowed |= {"forward.inference"} if (ops["stage"] == "backward").sum() == 0 else set()
    assert set(forward["stage_rule"].astype(str)) <= allowed


def test_loading_without_stacks_is_found(sample_trace):
    """Point 4 of issue 8: a capture without Python frames still finds its loading (recall of the load mark)."""
    marked = cached_parse(sample_trace)
    if (marked.events["kind"] == "python_function").any():
        pytest.skip("captured with Python stacks (test_sample_traces covers those)")
    truth = marked.ops["stage_rule"].astype(str).to_numpy() == "mark.load"
    if not truth.any():
        pytest.skip("captured without stage marks")
    inferred = cached_parse(sample_trace, include_marks=False).ops
    found = inferred["stage"].astype(str).to_numpy()[truth] == "load"
    weights = marked.ops["self_ns"].to_numpy()[truth]
    assert weights[found].sum() >= 0.99 * weights.sum()
    assert set(inferred["stage_rule"].astype(str)[truth]) <= {"load.before_first_forward", "load.h2d_copy"}


def test_collective_put_inside_forward_of_a_real_trace(tmp_path):
    """v100_ns_resolution_5steps with an all-to-all (op, launch, kernel) between DDP's forward and the loss."""
    import gzip
    import json

    from conftest import SHARED_TRACES

    source = SHARED_TRACES / "v100_ns_resolution_5steps.json.gz"
    if not source.exists():
        pytest.skip("../shared/traces not present")
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    step = next(e for e in events if e.get("name") == "ProfilerStep#101")
    ddp = next(
        e
        for e in events
        if e.get("name") == "DistributedDataParallel.forward" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]
    )
    kernel0 = next(e for e in events if e.get("cat") == "kernel")
    ts = ddp["ts"] + ddp["dur"] + 20  # after the model's forward, before the loss
    thread = {"pid": step["pid"], "tid": step["tid"]}
    corr = 10**9
    events += [
        {"ph": "X", "cat": "cpu_op", "name": "nccl:all_to_all", "ts": ts, "dur": 30, **thread, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts + 5, "dur": 5, **thread,
         "args": {"correlation": corr}},
        {**kernel0, "name": "ncclKernel_AllToAll_inserted", "ts": ts + 40, "dur": 100,
         "args": {**kernel0["args"], "correlation": corr, "External id": corr}},
    ]  # fmt: skip
    path = tmp_path / "with_all_to_all.json"
    path.write_text(json.dumps(doc))
    for include_marks in (True, False):  # with the user's '## forward ##' range and with --no-marks
        p = profparse.parse(path, include_marks=include_marks)
        assert kernel(p, "ncclKernel_AllToAll_inserted")[0] == "forward", include_marks
    assert decided(p, "nccl:all_to_all") == ["forward", "forward.phase"]


SEGMENTS = ("forward", "backward", "optimizer", "copy", "plain", "seed", "comm")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=8), min_size=1, max_size=3))
def test_phase_invariants_on_random_steps(tmp_path, steps):
    """Random steps of evidence and plain ops: every op gets one stage, stage times add up, and forward without
    evidence only ever lies between two forward evidence ops of the same step."""
    b = TraceBuilder()
    t = 0.0
    for number, segments in enumerate(steps):
        b.annotation(f"ProfilerStep#{number}", t, 10 * len(segments) + 1)
        for i, kind in enumerate(segments):
            at = t + 10 * i + 1
            if kind == "forward":
                recorded(b, "aten::mm", at, 5)
            elif kind == "backward":
                engine(b, at, 5)
            elif kind == "optimizer":
                b.annotation("Optimizer.step#SGD.step", at, 5)
            elif kind == "copy":
                b.op("aten::copy_", at, 5)
            elif kind == "seed":
                b.op("aten::ones_like", at, 5)
            elif kind == "comm":
                b.op("record_param_comms", at, 5)
            else:
                b.op("aten::zeros", at, 5)
        t += 10 * len(segments) + 2
    p = parse(b, tmp_path)
    ops = p.ops.sort_values("ts_ns")
    assert ops["stage"].notna().all() and (ops["stage"].astype(str) != "").all()
    assert ops.groupby("stage", observed=True)["self_ns"].sum().sum() == ops["self_ns"].sum()
    forward_evidence = ops["stage_rule"].astype(str) == "forward.autograd_op"
    for step, group in ops.groupby("step"):
        ts = group["ts_ns"].to_numpy()
        evidence = ts[forward_evidence[group.index].to_numpy()]
        by_phase = group["stage_rule"].astype(str).to_numpy() == "forward.phase"
        for when in ts[by_phase]:
            assert (evidence < when).any() and (evidence > when).any(), (step, when)
        seeds = group[group["stage_rule"].astype(str) == "backward.loss_seed"]
        assert set(seeds["name"].astype(str)) <= {"aten::ones_like"}
    inference = (ops["stage"] == "backward").sum() == 0 and (ops["stage"] == "optimizer").sum() == 0
    if not inference:
        assert not (ops["stage_rule"].astype(str) == "forward.inference").any()
