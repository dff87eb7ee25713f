"""GPU activity replayed by a CUDA / HIP graph launch (profparse.stages.graph_launch, analysis.levels' graph count)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from conftest import parsed
from tracebuilder import AUTOGRAD, TraceBuilder, backward_node, forward_op

import profparse

GRAPH_RULES = ("gpu.graph_capture", "gpu.graph_sequence", "gpu.graph_launch", "gpu.graph_launch_op")
# the kernels of a step: (name, stage) in launch order, names shared across stages so that a name alone cannot tell
STEP_KERNELS = [
    ("gemm", "forward"),
    ("relu", "forward"),
    ("gemm", "forward"),
    ("relu_bwd", "backward"),
    ("gemm", "backward"),
    ("gemm", "backward"),
    ("adam", "optimizer"),
]


def runtime_call(b: TraceBuilder, name: str, ts: float) -> dict:
    b.correlation += 1
    return b.span(name, ts, 1.0, "cuda_runtime", correlation=b.correlation)


def staged_ranges(b: TraceBuilder, t0: float, launch) -> None:
    """Forward (an nn.Module), backward (the autograd thread) and optimizer ranges from ``t0`` (70 us), each
    launching its kernels of STEP_KERNELS through ``launch(ts, name, tid)``."""
    b.py("nn.Module: Block_0", t0, 20)
    b.op("autograd::engine::evaluate_function: MmBackward0", t0 + 22, 26, tid=AUTOGRAD)
    b.annotation("Optimizer.step#AdamW.step", t0 + 50, 18)
    starts = {"forward": t0 + 1, "backward": t0 + 23, "optimizer": t0 + 51}
    for i, (name, stage) in enumerate(STEP_KERNELS):
        ts = starts[stage] + 6 * sum(s == stage for _, s in STEP_KERNELS[:i])
        b.op(f"aten::op{i}", ts, 5, tid=AUTOGRAD if stage == "backward" else 100)
        launch(ts + 1, name, AUTOGRAD if stage == "backward" else 100)


def replay(b: TraceBuilder, step: int, t0: float, kernels: list[str], within: str | None = None) -> None:
    """A step of 100 us whose work is one graph launch replaying ``kernels`` (5 us each, 1 us apart)."""
    b.annotation(f"ProfilerStep#{step}", t0, 100)
    if within:  # a Python frame (nn.Module) or a user range (Optimizer.step)
        b.span(within, t0 + 1, 10, "python_function" if within.startswith("nn.Module") else "user_annotation")
    b.graph_launch(t0 + 2, [(name, t0 + 10 + 6 * i, 5) for i, name in enumerate(kernels)])


def rows(p: profparse.ParsedTrace) -> pd.DataFrame:
    k = p.kernels.sort_values("ts_ns", kind="stable")
    return k.assign(stage=k["stage"].astype(str), stage_rule=k["stage_rule"].astype(str))


def test_capture_gives_each_replayed_kernel_its_captured_stage(tmp_path):
    b = TraceBuilder()
    runtime_call(b, "cudaStreamBeginCapture", 0)
    staged_ranges(b, 2, lambda ts, name, tid: b.captured_launch(ts, tid=tid))  # the whole step, captured
    runtime_call(b, "cudaStreamEndCapture", 75)
    runtime_call(b, "cudaStreamBeginCapture", 80)  # a second, smaller graph: two forward launches
    b.py("nn.Module: Head_0", 82, 10)
    b.captured_launch(83)
    b.captured_launch(86)
    runtime_call(b, "cudaStreamEndCapture", 95)
    names = [name for name, _ in STEP_KERNELS]
    replay(b, 1, 100, names)
    replay(b, 2, 200, names)
    replay(b, 3, 300, ["gemm", "relu"])
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = rows(p)
    assert (k["stage_rule"] == "gpu.graph_capture").all()
    stages = [stage for _, stage in STEP_KERNELS]
    assert list(k["stage"]) == stages * 2 + ["forward"] * 2
    assert list(k["step"]) == [1] * 7 + [2] * 7 + [3] * 2  # the replay's step, not the capture's (outside steps)


def test_unclassified_capture_launches_are_no_evidence(tmp_path):
    b = TraceBuilder()
    runtime_call(b, "cudaStreamBeginCapture", 0)
    b.captured_launch(3, tid=300)  # a side thread nothing stages
    runtime_call(b, "cudaStreamEndCapture", 10)
    replay(b, 1, 100, ["gemm"], within="nn.Module: Block_0")
    k = rows(profparse.parse(b.write(tmp_path / "t.json")))
    assert list(k["stage_rule"]) == ["gpu.graph_launch_op"] and list(k["stage"]) == ["forward"]


def eager_step(b: TraceBuilder, step: int, t0: float) -> None:
    b.annotation(f"ProfilerStep#{step}", t0, 100)
    staged_ranges(b, t0 + 1, lambda ts, name, tid: b.launch(ts, ts + 2, 1, tid=tid, name=name))


def test_without_capture_replayed_kernels_match_eager_steps(tmp_path):
    b = TraceBuilder()
    eager_step(b, 1, 0)
    replay(b, 2, 100, [name for name, _ in STEP_KERNELS])
    eager_step(b, 3, 200)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = rows(p)
    graph = k[k["step"] == 2]
    assert (graph["stage_rule"] == "gpu.graph_sequence").all()
    assert list(graph["stage"]) == [stage for _, stage in STEP_KERNELS]
    eager = k[k["step"] != 2]
    assert not eager["stage_rule"].isin(GRAPH_RULES).any()
    assert list(eager["stage"]) == [stage for _, stage in STEP_KERNELS] * 2


def test_no_evidence_keeps_the_launch_calls_stage(tmp_path):
    b = TraceBuilder()
    replay(b, 1, 0, ["gemm", "mystery", "relu"], within="nn.Module: Block_0")
    replay(b, 2, 100, ["gemm", "mystery", "relu"], within="Optimizer.step#AdamW.step")
    k = rows(profparse.parse(b.write(tmp_path / "t.json")))
    # replays never match each other; the module / Optimizer.step around each launch is positive evidence
    assert (k["stage_rule"] == "gpu.graph_launch_op").all()
    assert list(k["stage"]) == ["forward"] * 3 + ["optimizer"] * 3


# a torch.compile(mode="reduce-overhead") step: eager warm-up (step 1), then one graph per stage (steps 2, 3) whose
# names, matched alone or two at a time, point at the other stage: the copies of the forward graph are only in the
# warm-up's backward, the backward graph's "gemm copy" only at the warm-up's forward -> backward seam
WARM_UP = {"forward": ["gemm", "gelu", "gemm"], "backward": ["copy", "gelu_bwd", "copy"], "optimizer": ["adam"]}
GRAPHS = {"forward": ["copy", "gemm", "gelu", "copy", "gemm"], "backward": ["gelu_bwd", "gemm", "copy", "gemm"]}


def compiled_step(b: TraceBuilder, step: int, t0: float, graphs: bool) -> list[str]:
    """A compiled training step from ``t0`` (100 us): ``CompiledFunction`` (recorded autograd history) launching the
    forward kernels, the engine's ``CompiledFunctionBackward`` launching the backward ones, an eager optimizer.
    Returns the stage of each kernel in GPU order."""
    b.annotation(f"ProfilerStep#{step}", t0, 100)
    forward_op(b, "CompiledFunction", t0 + 1, 20, seq=step)
    backward_node(b, "CompiledFunctionBackward", t0 + 30, 30, seq=step)
    b.annotation("Optimizer.step#AdamW.step", t0 + 70, 20)
    stages, gpu = [], t0 + 2
    for stage, at, tid in (("forward", t0 + 2, 100), ("backward", t0 + 31, AUTOGRAD)):
        names = GRAPHS[stage] if graphs else WARM_UP[stage]
        if graphs:
            b.graph_launch(at, [(name, gpu + 3 * i, 2) for i, name in enumerate(names)], tid=tid)
        else:
            for i, name in enumerate(names):
                b.launch(at + i, gpu + 3 * i, 2, tid=tid, name=name)
        stages += [stage] * len(names)
        gpu += 3 * len(names) + 25
    b.launch(t0 + 71, t0 + 75, 2, name="adam")
    return [*stages, "optimizer"]


def test_compiled_graph_per_stage_keeps_its_launch_ops_stage(tmp_path):
    b = TraceBuilder()
    truth = [stage for step in (1, 2, 3) for stage in compiled_step(b, step, 100 * step, graphs=step > 1)]
    k = rows(profparse.parse(b.write(tmp_path / "t.json")))
    assert list(k["stage"]) == truth
    graph = k[k["step"] > 1]
    assert list(graph["stage_rule"]) == ["gpu.graph_launch_op"] * 9 + ["optimizer.range"] + (
        ["gpu.graph_launch_op"] * 9 + ["optimizer.range"]
    )


def test_whole_step_graph_in_a_compiled_function_still_matches_eager_steps(tmp_path):
    """A whole step captured as one graph spans stages: the CompiledFunction around its launch does not decide."""
    b = TraceBuilder()
    eager_step(b, 1, 0)
    b.annotation("ProfilerStep#2", 100, 100)
    forward_op(b, "CompiledFunction", 101, 5, seq=9)
    backward_node(b, "CompiledFunctionBackward", 150, 5, seq=9)
    b.graph_launch(102, [(name, 110 + 6 * i, 5) for i, (name, _) in enumerate(STEP_KERNELS)])
    eager_step(b, 3, 200)
    k = rows(profparse.parse(b.write(tmp_path / "t.json")))
    graph = k[k["step"] == 2]
    assert (graph["stage_rule"] == "gpu.graph_sequence").all()
    assert list(graph["stage"]) == [stage for _, stage in STEP_KERNELS]


def test_hip_graph_launch_is_a_graph_launch(tmp_path):
    b = TraceBuilder()
    eager_step(b, 1, 0)
    b.annotation("ProfilerStep#2", 100, 100)
    b.graph_launch(102, [(name, 110 + 6 * i, 5) for i, (name, _) in enumerate(STEP_KERNELS)], name="hipGraphLaunch")
    k = rows(profparse.parse(b.write(tmp_path / "t.json")))
    assert (k.loc[k["step"] == 2, "stage_rule"] == "gpu.graph_sequence").all()


def test_levels_count_graph_kernels_apart_from_launch_latency(tmp_path):
    b = TraceBuilder()
    eager_step(b, 1, 0)
    replay(b, 2, 100, [name for name, _ in STEP_KERNELS])
    p = profparse.parse(b.write(tmp_path / "t.json"))
    levels = p.stage_levels
    steps = (
        levels[levels["scope"] == "step"]
        .groupby("step")[["device_count", "graph_kernel_count", "launch_latency_count"]]
        .sum()
    )
    assert steps.loc[1].to_dict() == {"device_count": 7, "graph_kernel_count": 0, "launch_latency_count": 7}
    assert steps.loc[2].to_dict() == {"device_count": 7, "graph_kernel_count": 7, "launch_latency_count": 0}
    total = levels[levels["scope"] == "total"].set_index(levels.loc[levels["scope"] == "total", "stage"].astype(str))
    assert total["graph_kernel_count"].to_dict() == {"load": 0, "forward": 3, "backward": 3, "optimizer": 1, "other": 0}
    eager = p.kernels[p.kernels["step"] == 1]
    assert eager["launch_latency_ns"].max() == 2000  # eager kernels start 2 us after their launch
    forward = total.loc["forward"]
    assert forward["launch_latency_max_ns"] == 2000  # the replay's 8-38 us "latencies" are not in the figures
    assert p.kernels.loc[p.kernels["step"] == 2, "launch_latency_ns"].isna().all()


# -- real traces, one step rewritten as a single graph launch -------------------------------------------------------


def as_one_graph_launch(doc: dict, full: profparse.ParsedTrace, step: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """``doc`` with the linked GPU activity of ``step`` replayed by one graph launch: the step's first launch call
    renamed ``cudaGraphLaunch`` (``hipGraphLaunch`` on ROCm), every such activity pointed at its correlation id, the
    other launch calls and their flows dropped. Returns the document, the original index of each kept event and the
    original indexes of the rewritten activity."""
    events = doc["traceEvents"]
    k = full.kernels
    chosen = k[(k["step"] == step) & k["launch_trace_index"].notna()]
    calls = chosen["launch_trace_index"].astype(np.int64).to_numpy()
    first = int(calls[np.argmin(full.events.set_index("trace_index").loc[calls, "ts_ns"].to_numpy())])
    call = dict(events[first])
    call["name"] = ("hip" if call["name"].startswith("hip") else "cuda") + "GraphLaunch"
    correlation = call["args"]["correlation"]
    dropped = set(calls.tolist()) - {first}
    lost = {events[i]["args"]["correlation"] for i in dropped}
    activity = chosen["trace_index"].to_numpy()
    new_events = list(events)
    new_events[first] = call
    for i in activity:
        new_events[i] = {**events[i], "args": {**events[i]["args"], "correlation": correlation}}
    kept = [
        i
        for i, e in enumerate(new_events)
        if i not in dropped and not (e.get("ph") in ("s", "f") and e.get("id") in lost)
    ]
    return {**doc, "traceEvents": [new_events[i] for i in kept]}, np.array(kept, dtype=np.int64), activity


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    cache = {}

    def get(trace):
        if trace not in cache:
            full = parsed(trace)
            counts = full.kernels.groupby("step").size()
            step = int(counts.index[len(counts) // 2]) if len(counts) else None
            with gzip.open(trace) as f:
                doc, kept, activity = as_one_graph_launch(json.load(f), full, step)
            path = tmp_path_factory.mktemp("graph") / trace.name
            with gzip.open(path, "wt") as f:
                json.dump(doc, f)
            cache[trace] = (full, profparse.parse(path), kept, activity, step, len(counts))
        return cache[trace]

    return get


def test_shared_trace_step_replayed_as_a_graph(shared_trace, rewritten):
    full, graph, kept, activity, step, steps_with_kernels = rewritten(shared_trace)
    g = graph.kernels.assign(original=kept[graph.kernels["trace_index"].to_numpy()]).set_index("original")
    f = full.kernels.set_index("trace_index")
    common = g.index.to_numpy()
    assert set(activity) <= set(common) and len(g) == len(f)  # no GPU activity lost by the rewrite
    replayed, others = g.loc[activity], g.drop(index=activity)
    truth = f.loc[activity]
    agree = replayed["stage"].astype(str).to_numpy() == truth["stage"].astype(str).to_numpy()
    share = replayed.loc[agree, "dur_ns"].sum() / max(replayed["dur_ns"].sum(), 1)
    rules = replayed["stage_rule"].astype(str).value_counts().to_dict()
    print(f"\n{shared_trace.name}: step {step}, {len(activity)} activities on one graph launch; {rules}; "
          f"stage agreement {share:.2%} of their GPU time")  # fmt: skip
    assert replayed["stage_rule"].astype(str).isin(GRAPH_RULES).all()
    assert (replayed["step"].to_numpy() == step).all()
    if steps_with_kernels >= 2:  # eager steps to match against: the original stages come back
        assert share >= 0.95
    else:  # the launch call's stage
        assert replayed["stage_rule"].isin(["gpu.graph_launch", "gpu.graph_launch_op"]).all()
    # the rest of the trace is untouched
    assert (others["stage"].astype(str) == f.loc[others.index, "stage"].astype(str)).all()
    levels = graph.stage_levels
    at_step = levels[(levels["scope"] == "step") & (levels["step"] == step)]
    assert at_step["graph_kernel_count"].sum() == len(activity)
    total = levels[levels["scope"] == "total"]
    before = full.stage_levels[full.stage_levels["scope"] == "total"]
    assert total["launch_latency_count"].sum() == before["launch_latency_count"].sum() - len(activity)
    assert total["device_count"].sum() == before["device_count"].sum()


def with_step_captured(
    doc: dict, original: np.ndarray, full: profparse.ParsedTrace, step: int
) -> tuple[dict, np.ndarray]:
    """``doc`` (whose events have the indexes ``original`` in ``full``'s trace) with ``step``'s launches recorded
    inside a stream capture: its GPU activity dropped (a capture runs nothing), a ``cudaStreamBeginCapture`` /
    ``cudaStreamEndCapture`` pair around the step on the launching thread. Returns the document and, per kept event,
    its index in ``full``'s trace."""
    events = doc["traceEvents"]
    k = full.kernels
    chosen = k.loc[(k["step"] == step) & k["launch_trace_index"].notna(), "trace_index"].to_numpy()
    # calls that ran nothing even eagerly (some cudaMemsetAsync) would be graph nodes without a replay: dropped
    e = full.events
    window = full.steps.set_index("step").loc[step]
    idle = e.loc[
        e["kind"].isin(["cuda_runtime", "cuda_driver"])
        & e["name"].astype(str).str.contains(r"(?i)launch\w*kernel|memcpy|memset")
        & ~e["trace_index"].isin(k["launch_trace_index"].dropna())
        & e["ts_ns"].between(window["start_ns"], window["end_ns"]),
        "trace_index",
    ].to_numpy()
    gone = set(np.searchsorted(original, np.concatenate([chosen, idle])).tolist())
    main = full.events.set_index("trace_index").loc[int(k["launch_trace_index"].dropna().iloc[0])]
    marks = [
        {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": int(main["pid"]), "tid": int(main["tid"]),
         "ts": at / 1000, "dur": 0.5, "args": {"correlation": 9_000_000 + i}}
        for i, (name, at) in enumerate(
            (("cudaStreamBeginCapture", window["start_ns"] - 1000), ("cudaStreamEndCapture", window["end_ns"]))
        )
    ]  # fmt: skip
    kept = [i for i in range(len(events)) if i not in gone]
    return {**doc, "traceEvents": [events[i] for i in kept] + marks}, original[kept]


def test_shared_trace_replay_of_a_captured_step(shared_trace, tmp_path):
    full = parsed(shared_trace)
    counts = full.kernels[full.kernels["launch_trace_index"].notna()].groupby("step").size()
    if len(counts) < 2 or counts.iloc[-2] != counts.iloc[-1]:
        pytest.skip("needs two steps with the same GPU work")
    captured, replayed = int(counts.index[-2]), int(counts.index[-1])
    with gzip.open(shared_trace) as f:
        doc, kept, activity = as_one_graph_launch(json.load(f), full, replayed)
    doc, kept = with_step_captured(doc, kept, full, captured)
    path = tmp_path / shared_trace.name
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    graph = profparse.parse(path)
    g = graph.kernels
    g = g.assign(original=kept[g["trace_index"].to_numpy()]).set_index("original").loc[activity]
    truth = full.kernels.set_index("trace_index").loc[activity]
    agree = g["stage"].astype(str).to_numpy() == truth["stage"].astype(str).to_numpy()
    share = g.loc[agree, "dur_ns"].sum() / g["dur_ns"].sum()
    rules = g["stage_rule"].astype(str).value_counts().to_dict()
    print(f"\n{shared_trace.name}: step {captured} captured, step {replayed} replayed; {rules}; agreement {share:.2%}")
    assert (g["stage_rule"] == "gpu.graph_capture").all()
    assert share >= 0.95
