"""The critical path (analysis/critical_path.py): on hand-built traces whose longest path is known it finds that
path, segment by segment; on every sample and shared trace its segments tile each step window exactly; the
pointer-doubling chain walk equals a plain walk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import profparse
from profparse.analysis.critical_path import blocking_calls, chains, dependency_graph, path_table
from profparse.tables.parsed import ParsedTrace
from tests.tracebuilder import AUTOGRAD, GPU_PID, MAIN, STREAM, TraceBuilder, backward_node, forward_op, training_step

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
US = 1000


def _parse(b: TraceBuilder, tmp_path: Path, name: str = "t.json") -> ParsedTrace:
    return profparse.load(b.write(tmp_path / name), cache=False)


def _path(parsed: ParsedTrace) -> pd.DataFrame:
    return parsed.table("critical_path")


def _segments(parsed: ParsedTrace) -> list[tuple[str, float, float]]:
    """(bound, start us, end us) of each segment, times from the first step's start."""
    path = _path(parsed)
    t0 = int(parsed.steps["start_ns"].iloc[0])
    return [
        (str(b), (s - t0) / US, (e - t0) / US)
        for b, s, e in zip(path["bound"], path["start_ns"], path["end_ns"], strict=True)
    ]


def _sync(b: TraceBuilder, name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
    b.correlation += 1
    return b.span(name, ts, dur, "cuda_runtime", tid, correlation=b.correlation)


def _on_stream(gpu: dict, stream: int) -> dict:
    gpu["tid"] = stream
    gpu["args"]["stream"] = stream
    return gpu


def test_gpu_compute_bound(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 10)
    b.launch(12, 15, 885, name="gemm")
    _sync(b, "cudaDeviceSynchronize", 30, 875)
    assert _segments(_parse(b, tmp_path)) == [
        ("python", 0, 10),
        ("cpu_op", 10, 12),
        ("launch", 12, 13),
        ("launch", 13, 15),  # launch latency: the stream was idle
        ("gpu_compute", 15, 900),
        ("sync_wait", 900, 905),
        ("python", 905, 1000),
    ]


def test_epoch_timestamps_and_many_threads(tmp_path) -> None:
    """Timestamps as real traces have them (~1.7e18 ns) and a dozen host threads: the (thread, time) keys fit."""
    t0 = 1_712_195_495_502_094.0  # us
    b = TraceBuilder()
    for tid in range(300, 312):  # listed first: the main thread gets the last dense thread number
        b.op("aten::add", t0 + 5, 900, tid=tid)
    b.annotation("ProfilerStep#1", t0, 1000)
    b.op("aten::mm", t0 + 10, 10)
    b.launch(t0 + 12, t0 + 15, 885, name="gemm")
    _sync(b, "cudaDeviceSynchronize", t0 + 30, 875)
    parsed = _parse(b, tmp_path)
    pieces = dependency_graph(parsed.raw.events, parsed.links, parsed.attribution).pieces
    assert (np.diff(pieces.thread) >= 0).all() and len(np.unique(pieces.thread)) == 13  # one run per thread
    assert _segments(parsed) == [
        ("python", 0, 10),
        ("cpu_op", 10, 12),
        ("launch", 12, 13),
        ("launch", 13, 15),
        ("gpu_compute", 15, 900),
        ("sync_wait", 900, 905),
        ("python", 905, 1000),
    ]


def test_host_launch_bound_small_kernels(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 600)
    for i in range(10):
        t = 10 + 50 * i
        b.op("aten::add", t, 40)
        b.launch(t + 30, t + 32, 2, name="add_kernel")
    _sync(b, "cudaDeviceSynchronize", 520, 10)  # the GPU was done long before: no wait
    path = _path(_parse(b, tmp_path))
    ms = path.assign(us=(path["end_ns"] - path["start_ns"]) / US).groupby("bound", observed=True)["us"].sum()
    assert set(ms.index) == {"python", "cpu_op", "launch", "sync_wait"}
    assert ms["launch"] == 10 and ms["cpu_op"] == 390 and ms["sync_wait"] == 10 and ms["python"] == 190


def test_communication_bound(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("c10d::allreduce_", 10, 5)
    b.launch(12, 20, 780, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    _sync(b, "cudaStreamSynchronize", 100, 702)
    segments = _segments(_parse(b, tmp_path))
    assert ("gpu_comm", 13 + 7, 800) in segments
    assert segments[-2:] == [("sync_wait", 800, 802), ("python", 802, 1000)]


def test_a_stream_sync_waits_for_its_own_stream(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 10)
    b.launch(12, 15, 585, name="gemm")  # stream 7: ends at 600
    b.op("aten::add", 30, 10)
    _on_stream(b.launch(32, 40, 565, name="side")[1], 8)  # stream 8: ends at 605, inside the sync too
    call = _sync(b, "cudaStreamSynchronize", 100, 510)
    sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": GPU_PID, "tid": STREAM, "ts": 608}
    b.events.append({**sync, "dur": 1, "args": {"correlation": call["args"]["correlation"], "stream": STREAM}})
    segments = _segments(_parse(b, tmp_path))
    assert ("gpu_compute", 15, 600) in segments and ("sync_wait", 600, 610) in segments
    assert not any(start == 40 for _, start, _ in segments)  # not the other stream's kernel


def _blocking_copy_trace(with_sync_events: bool) -> TraceBuilder:
    """A copy call that blocks until a long kernel ends: named by a cuda_sync event, or by nothing (inferred)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 10)
    b.launch(12, 15, 585, name="gemm")
    b.op("aten::copy_", 100, 510)
    call = _sync(b, "cudaMemcpyAsync", 110, 495)  # returns 5 us after the kernel, no memcpy recorded
    if with_sync_events:
        sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": GPU_PID, "tid": STREAM, "ts": 599}
        b.events.append({**sync, "dur": 1, "args": {"correlation": call["args"]["correlation"], "stream": STREAM}})
    return b


def test_sync_in_the_step_with_and_without_sync_events(tmp_path) -> None:
    known = _parse(_blocking_copy_trace(True), tmp_path, "known.json")
    inferred = _parse(_blocking_copy_trace(False), tmp_path, "inferred.json")
    expected = [
        ("python", 0, 10),
        ("cpu_op", 10, 12),
        ("launch", 12, 13),
        ("launch", 13, 15),
        ("gpu_compute", 15, 600),
        ("sync_wait", 600, 605),
        ("cpu_op", 605, 610),
        ("python", 610, 1000),
    ]
    assert _segments(known) == expected
    assert _segments(inferred) == expected
    call = known.raw.events["name"].astype(str).to_numpy() == "cudaMemcpyAsync"
    assert blocking_calls(known.raw.events, known.links)[0][call].all()
    assert not blocking_calls(known.raw.events, known.links)[1].any()  # sync events: nothing inferred
    inferred_call = inferred.raw.events["name"].astype(str).to_numpy() == "cudaMemcpyAsync"
    assert blocking_calls(inferred.raw.events, inferred.links)[1][inferred_call].all()


def test_data_bound(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, 600)
    b.op("aten::stack", 100, 400)
    b.op("aten::mm", 700, 50)
    path = _path(_parse(b, tmp_path))
    data = path[path["bound"] == "data"]
    assert (data["end_ns"] - data["start_ns"]).sum() == 600 * US
    assert data["start_ns"].min() - path["start_ns"].min() == 5 * US


def test_two_streams_joined_by_an_event_wait(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 5)
    b.launch(12, 20, 480, name="gemm")  # stream 7: [20, 500]
    _sync(b, "cudaEventRecord", 16, 1)
    _sync(b, "cudaStreamWaitEvent", 18, 1)
    b.op("aten::add", 25, 10)
    _, kernel = b.launch(30, 503, 287, name="add_on_side_stream")  # stream 8 idle, waits for the gemm
    _on_stream(kernel, 8)
    _sync(b, "cudaDeviceSynchronize", 40, 760)
    assert _segments(_parse(b, tmp_path)) == [
        ("python", 0, 10),
        ("cpu_op", 10, 12),
        ("launch", 12, 13),
        ("launch", 13, 20),
        ("gpu_compute", 20, 500),
        ("gpu_idle", 500, 503),  # the other stream's wait
        ("gpu_compute", 503, 790),
        ("sync_wait", 790, 800),
        ("python", 800, 1000),
    ]


def test_backward_thread_joined_to_the_main_thread(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    forward_op(b, "aten::mm", 10, 80, seq=1)
    backward_node(b, "MmBackward0", 110, 90, seq=1)  # autograd thread [110, 200]
    backward_node(b, "AddBackward0", 210, 270, seq=2)  # [210, 480]
    b.op("aten::zero_", 600, 50)
    path = _path(parsed := _parse(b, tmp_path))
    events = parsed.raw.events
    tid = events.set_index("trace_index")["tid"]
    t0 = int(parsed.steps["start_ns"].iloc[0])
    mid = path[(path["start_ns"] >= t0 + 110 * US) & (path["end_ns"] <= t0 + 480 * US)]
    assert (mid["end_ns"] - mid["start_ns"]).sum() == 370 * US  # all of [110, 480] lies on the autograd thread
    named = mid[mid["trace_index"] != -(2**63)]
    assert (tid.loc[named["trace_index"]] == AUTOGRAD).all()
    assert mid["name"].astype(str).eq("(untraced host time)").any()  # the engine's own gap [200, 210]
    assert (mid["stage"] == "backward").all()
    before = path[path["end_ns"] <= t0 + 110 * US]
    assert tid.loc[before.loc[before["trace_index"] >= 0, "trace_index"]].eq(MAIN).all()


def test_graph_launch_is_the_launch_of_each_kernel(tmp_path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.correlation += 1
    corr = b.correlation
    b.span("cudaGraphLaunch", 10, 5, "cuda_runtime", correlation=corr)
    for name, ts, dur in (("k1", 20, 80), ("k2", 100, 200), ("k3", 300, 300)):
        args = {"correlation": corr, "stream": STREAM, "device": 0}
        kernel = {"ph": "X", "cat": "kernel", "name": name, "pid": GPU_PID, "tid": STREAM, "ts": ts, "dur": dur}
        b.events.append({**kernel, "args": args})
    _sync(b, "cudaDeviceSynchronize", 20, 585)
    assert _segments(_parse(b, tmp_path)) == [
        ("python", 0, 10),
        ("launch", 10, 15),
        ("launch", 15, 20),
        ("gpu_compute", 20, 100),
        ("gpu_compute", 100, 300),
        ("gpu_compute", 300, 600),
        ("sync_wait", 600, 605),
        ("python", 605, 1000),
    ]


def test_chains_equal_a_plain_walk() -> None:
    rng = np.random.default_rng(7)
    n = 2000
    pred = np.where(rng.random(n) < 0.05, -1, np.maximum(np.arange(n) - rng.integers(1, 30, n), -1))
    heads = np.concatenate([[0, 1, 2], rng.choice(n, 40, replace=False)])  # node 0 (a root) on some chains
    members, owner = chains(pred, heads)
    for k, head in enumerate(heads):
        walk, node = [], int(head)
        while node >= 0:
            walk.append(node)
            node = int(pred[node])
        assert members[owner == k].tolist() == walk


def _random_trace(seed: int) -> TraceBuilder:
    """Three steps of random host ops, launches (some kernels starting before their launch returns: clock skew),
    syncs, autograd-thread ops, Python frames, graph launches and collectives without a launch record."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        length = float(rng.integers(200, 2000))
        b.annotation(f"ProfilerStep#{step}", t, length)
        u = t + 1
        while u < t + length - 20:
            kind, d = int(rng.integers(0, 6)), float(rng.integers(1, 40))
            if kind == 0:
                b.op("aten::add", u, d)
                _, gpu = b.launch(u + 0.5, u + 1 + float(rng.integers(-3, 200)), float(rng.integers(0, 300)))
                if rng.random() < 0.3:
                    _on_stream(gpu, 8)
            elif kind == 1:
                d *= 5
                _sync(b, "cudaStreamSynchronize", u, d)
            elif kind == 2:
                b.op("AddBackward0", u, d, tid=AUTOGRAD)
            elif kind == 3:
                b.py("python_fn", u, d)
            elif kind == 4:
                graph = _sync(b, "cudaGraphLaunch", u, 2)
                args = {"correlation": graph["args"]["correlation"], "stream": STREAM, "device": 0}
                for j in range(3):
                    kernel = {"ph": "X", "cat": "kernel", "name": "g", "pid": GPU_PID, "tid": STREAM, "dur": 10}
                    b.events.append({**kernel, "ts": u + 3 + 10 * j, "args": args})
            else:
                comm = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_x", "pid": GPU_PID, "tid": 9, "ts": u}
                b.events.append({**comm, "dur": d * 3, "args": {"stream": 9, "device": 0}})
            u += d + float(rng.integers(0, 10))
        t += length + float(rng.integers(0, 50))
    return b


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segments_tile_every_step_of_random_traces(tmp_path, seed: int) -> None:
    parsed = _parse(_random_trace(seed), tmp_path)
    path = _path(parsed)
    assert len(parsed.steps) == 3
    for step, start, end in parsed.steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        s = path.loc[path["step"] == step, "start_ns"].to_numpy()
        e = path.loc[path["step"] == step, "end_ns"].to_numpy()
        assert s[0] == start and e[-1] == end and (s[1:] == e[:-1]).all() and (e > s).all()
    assert {"gpu_compute", "cpu_op", "launch"} <= set(path["bound"].astype(str))


@pytest.mark.parametrize("later_steps", [(1, 2), ()])
@pytest.mark.parametrize("thread_before", [False, True])
@pytest.mark.parametrize("dur", [0, None, "missing"])
def test_a_zero_length_step_at_the_trace_start_has_an_empty_path(
    tmp_path, dur, thread_before: bool, later_steps: tuple[int, ...]
) -> None:
    """A ProfilerStep#0 of no length where the trace begins (its dur 0, null or missing): no piece of the main
    thread ends by its end. Its chain's head was the thread before's last piece (or none), and ``summarize``
    exited 70 ("repeats may not contain negative values"); where it is the only step, every chain is empty, and
    every verb exited 70 (an index into no segment). Its path is empty; the later steps still tile theirs."""
    from profparse.outputs.summary import render_summary

    b = TraceBuilder()
    if thread_before:  # a thread numbered before the main one
        b.op("aten::empty", 0, 5, tid=MAIN - 1)
    step0 = b.annotation("ProfilerStep#0", 0, 0)
    if dur is None:
        step0["dur"] = None
    elif dur == "missing":
        del step0["dur"]
    t = 10.0
    for step in later_steps:
        t = training_step(b, step, t)
    b.op("aten::add", t + 5, 10)  # work after the steps (the only work, with no later step)
    b.launch(t + 6, t + 8, 4, name="add_kernel")
    parsed = _parse(b, tmp_path)
    path = _path(parsed)
    assert 0 not in set(path["step"]) and len(parsed.steps) == 1 + len(later_steps)
    assert ("critical path" in render_summary(parsed)) == bool(later_steps)  # (no section for no path)
    for step, start, end in parsed.steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        segments = path[path["step"] == step]
        s, e = segments["start_ns"].to_numpy(), segments["end_ns"].to_numpy()
        assert (e - s).sum() == end - start and (s[1:] == e[:-1]).all(), step


@pytest.mark.parametrize("seed", [0, 1])
def test_edges_checked_in_blocks_give_the_table_of_one_block(tmp_path, seed: int, monkeypatch) -> None:
    """The graph's edges are checked a block of nodes at a time (bounded temporaries on big traces): blocks of a
    few nodes, so that edges cross blocks, give the same table as one block holding every node."""
    from profparse.analysis import critical_path as module

    parsed = _parse(_random_trace(seed), tmp_path)
    events, links, attribution = parsed.raw.events, parsed.links, parsed.attribution
    monkeypatch.setattr(module, "EDGE_BLOCK", 1 << 40)
    whole = path_table(events, links, attribution)
    monkeypatch.setattr(module, "EDGE_BLOCK", 3)
    pd.testing.assert_frame_equal(path_table(events, links, attribution), whole)
    nodes = dependency_graph(events, links, attribution).nodes
    assert nodes.pred.dtype == np.int32 and nodes.row.dtype == np.int32  # node and event numbers narrowed
    assert len(whole) > 10


def _traces() -> list[Path]:
    found = sorted((REPO / "sample_traces").rglob("*.json.gz"))
    if SHARED.is_dir():
        found += sorted(SHARED.rglob("*.json.gz"))
    return found


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_segments_tile_every_step_window(trace: Path) -> None:
    parsed = profparse.load(trace)
    path = path_table(parsed.raw.events, parsed.links, parsed.attribution)
    assert (path["end_ns"] > path["start_ns"]).all()
    for step, start, end in parsed.steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        segments = path[path["step"] == step]
        s, e = segments["start_ns"].to_numpy(), segments["end_ns"].to_numpy()
        assert len(s) and s[0] == start and e[-1] == end, step
        assert (s[1:] == e[:-1]).all(), step  # no gap, no overlap
        assert (e - s).sum() == end - start
    assert set(path["step"]) <= set(parsed.steps["step"])


def test_a_check_says_when_blocking_calls_were_inferred(tmp_path) -> None:
    inferred = _parse(_blocking_copy_trace(False), tmp_path, "inferred.json").warnings.set_index("check")
    assert inferred.loc["critical_path_inferred_sync", "count"] == 1
    assert inferred.loc["critical_path_inferred_sync", "value"] == 495 * US
    known = _parse(_blocking_copy_trace(True), tmp_path, "known.json").warnings
    assert "critical_path_inferred_sync" not in set(known["check"])


def test_summary_section_adds_up_to_the_steps(tmp_path) -> None:
    from profparse.outputs.summary import render, summary_data

    b = TraceBuilder()
    for step, t0 in ((1, 0), (2, 1000)):
        b.annotation(f"ProfilerStep#{step}", t0, 1000)
        b.op("aten::mm", t0 + 10, 10)
        b.launch(t0 + 12, t0 + 15, 885 - step, name="gemm")
        _sync(b, "cudaDeviceSynchronize", t0 + 30, 875)
    data = summary_data(_parse(b, tmp_path))["critical_path"]
    assert data["steps"] == 2
    assert sum(r["total_ns"] for r in data["per_stage"]) == 2000 * US
    bounds: dict[str, int] = {}
    for r in data["per_stage"]:
        assert sum(r["bounds"].values()) == r["total_ns"]
        for bound, ns in r["bounds"].items():
            bounds[bound] = bounds.get(bound, 0) + ns
    assert bounds["gpu_compute"] == (884 + 883) * US
    longest = data["longest"]
    assert [(r["name"], r["step"], r["ns"]) for r in longest[:2]] == [("gemm", 1, 884 * US), ("gemm", 2, 883 * US)]
    assert [r["ns"] for r in longest] == sorted((r["ns"] for r in longest), reverse=True)
    text = render({**summary_data(_parse(b, tmp_path)), "critical_path": data})
    assert "What bounds each step" in text and "Longest events on the critical path" in text


SLEEP_S = 0.1  # well above the step-to-step noise of a loaded 2-core machine (tens of ms)


@pytest.fixture(scope="module")
def sleep_capture(tmp_path_factory) -> tuple[ParsedTrace, list[int], list[int]]:
    """A tiny CPU training loop, 6 profiled steps: odd steps sleep ``SLEEP_S`` on the main thread inside the
    forward mark; all along a background thread sleeps (a logger waiting: off the path, and unrecorded by torch).
    Returns the trace, the ns each main-thread sleep took (a loaded machine wakes a sleeper late) and the ns each
    step's forward took, as measured around it."""
    torch = pytest.importorskip("torch")
    import threading
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    from profparse.capture.advice_pairs import one_intra_op_thread  # a loaded machine's pool delays ops

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    running = threading.Event()
    running.set()

    def log_in_background() -> None:
        while running.is_set():
            time.sleep(SLEEP_S / 10)

    model(x).sum().backward()  # the first call's one-off work (lazy init, the allocator) outside the steps
    optimizer.step()
    optimizer.zero_grad()
    slept: list[int] = []
    forward_ns: list[int] = []
    logger = threading.Thread(target=log_in_background)
    logger.start()
    try:
        with one_intra_op_thread(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(6):
                forward_start = time.perf_counter_ns()
                with record_function("profparse.stage:forward"):
                    loss = model(x).sum()
                    if step % 2:
                        start = time.perf_counter_ns()
                        time.sleep(SLEEP_S)
                        slept.append(time.perf_counter_ns() - start)
                forward_ns.append(time.perf_counter_ns() - forward_start)
                with record_function("profparse.stage:backward"):
                    loss.backward()
                with record_function("profparse.stage:optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
                prof.step()
    finally:
        running.clear()
        logger.join()
    path = tmp_path_factory.mktemp("sleep") / "sleep.json"
    prof.export_chrome_trace(str(path))
    return profparse.load(path, cache=False), slept, forward_ns


def _per_step(parsed: ParsedTrace, stage: str | None = None) -> tuple[pd.Series, pd.Series]:
    """Time on the path per step (of ``stage``, else all), for the steps that slept and those that did not."""
    path = _path(parsed)
    if stage is not None:
        path = path[path["stage"] == stage]
    per_step = (path["end_ns"] - path["start_ns"]).groupby(path["step"]).sum().sort_index()
    steps = per_step.index.to_numpy()
    odd = (steps - steps.min()) % 2 == 1  # the capture's odd steps slept (whatever the first step's number)
    return per_step[odd], per_step[~odd]


def test_a_sleep_on_the_main_thread_grows_its_stage_on_the_path(sleep_capture) -> None:
    parsed, sleeps_ns, forward_ns = sleep_capture
    slept, awake = _per_step(parsed, "forward")
    assert len(slept) == 3 and len(awake) == 3
    # Each step against its own forward's work as measured around it (the forward minus the sleep): other steps
    # are no baseline on a loaded machine, which stretches one step by tens of ms.
    own_work = np.array(forward_ns) - np.array([0, sleeps_ns[0], 0, sleeps_ns[1], 0, sleeps_ns[2]])
    on_path = pd.concat([slept, awake]).sort_index().to_numpy()
    added = on_path - own_work
    assert added[1::2] == pytest.approx(sleeps_ns, rel=0.1), (on_path.tolist(), forward_ns, sleeps_ns)
    assert abs(added[0::2]).max() < 0.05 * SLEEP_S * 1e9, (on_path.tolist(), forward_ns)


def test_a_sleep_off_the_path_adds_nothing(sleep_capture) -> None:
    parsed, _, _ = sleep_capture
    _, awake = _per_step(parsed)  # the background thread slept all through these steps
    assert awake.median() < 0.5 * SLEEP_S * 1e9  # a sleep that leaked onto the path would add all of SLEEP_S
    windows = parsed.steps
    path = _path(parsed)
    assert (path["end_ns"] - path["start_ns"]).sum() == (windows["end_ns"] - windows["start_ns"]).sum()


HOST_BOUNDS = {"python", "cpu_op", "launch", "sync_wait", "data"}


@pytest.mark.skipif(not (SHARED / "critical_path").is_dir(), reason="needs ../shared/traces")
def test_host_share_agrees_with_hta_on_a_trace_with_sync_events(tmp_path) -> None:
    """HTA 0.6 (networkx, cuda_sync edges) on its own event-sync test trace: the host-bound share of the step
    agrees within 10 points (HTA: 98.1% cpu_bound; docs/critical_path.md compares the other traces)."""
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    trace = SHARED / "critical_path" / "a100_event_sync.json.gz"
    (tmp_path / "hta").mkdir()
    (tmp_path / "hta" / "rank-0.json.gz").write_bytes(trace.read_bytes())
    graph, ok = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path / "hta")).critical_path_analysis(
        rank=0, annotation="ProfilerStep", instance_id=0
    )
    assert ok
    hta_share = graph.summary().get("cpu_bound", 0.0)
    path = _path(profparse.load(trace, cache=False))
    ns = path["end_ns"] - path["start_ns"]
    share = 100 * ns[path["bound"].astype(str).isin(HOST_BOUNDS)].sum() / ns.sum()
    assert abs(share - hta_share) <= 10


@pytest.fixture(scope="module")
def thread_sleep_capture(tmp_path_factory) -> tuple[ParsedTrace, int, list[int]]:
    """Four CPU steps whose forward keeps the main thread busy ``1.5 * SLEEP_S`` (a time-bound loop of matmuls,
    so the steps last alike whatever the load): step 1 also starts (before its forward) a thread that runs a matmul and
    sleeps ``SLEEP_S`` inside a ``record_function`` range (a logger: off the path); step 2 sleeps ``SLEEP_S`` on
    the main thread instead; steps 0 and 3 do neither. ``profile_all_threads`` makes torch record that thread.
    Returns the trace, the ns the main thread's sleep took (a loaded machine wakes a sleeper late) and the ns each
    step's forward took on the main thread, as measured around it (a loaded machine stretches any step)."""
    torch = pytest.importorskip("torch")
    import threading
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    from profparse.capture.advice_pairs import one_intra_op_thread  # a loaded machine's pool delays ops

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(x, x.T)

    def log_in_background() -> None:
        with record_function("background log"):
            total = torch.mm(x, x.T).sum()
            time.sleep(SLEEP_S)
            float(total)

    torch.mm(x, x.T)  # the first calls' one-off work outside the steps (step 0 is part of the baseline)
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    forward_ns: list[int] = []
    with one_intra_op_thread(), profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        for step, sleeper in enumerate(["none", "background", "main", "none"]):
            logger = threading.Thread(target=log_in_background) if sleeper == "background" else None
            with record_function(f"ProfilerStep#{step}"):
                if logger is not None:  # before the forward: a start waits for the thread to run (ms when loaded)
                    logger.start()
                forward_start = time.perf_counter_ns()
                with record_function("profparse.stage:forward"):
                    busy(1.5 * SLEEP_S)
                    if sleeper == "main":
                        start = time.perf_counter_ns()
                        time.sleep(SLEEP_S)
                        slept_ns = time.perf_counter_ns() - start
                    loss = model(x).sum()
                forward_ns.append(time.perf_counter_ns() - forward_start)
                with record_function("profparse.stage:backward"):
                    loss.backward()
                with record_function("profparse.stage:optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
            if logger is not None:
                logger.join()
    path = tmp_path_factory.mktemp("thread_sleep") / "thread_sleep.json"
    prof.export_chrome_trace(str(path))
    return profparse.load(path, cache=False), slept_ns, forward_ns


def test_a_recorded_sleep_on_a_background_thread_adds_nothing_to_the_path(thread_sleep_capture) -> None:
    parsed, slept_ns, forward_ns = thread_sleep_capture
    events = parsed.raw.events
    logged = events[events["name"] == "background log"]
    assert len(logged) == 1, "torch recorded no background thread"
    log = logged.iloc[0]
    main_tid = events[events["name"] == "ProfilerStep#1"]["tid"].iloc[0]
    assert log["tid"] != main_tid and log["dur_ns"] >= SLEEP_S * 1e9
    on_thread = events[(events["tid"] == log["tid"]) & (events["name"] == "aten::mm")]
    assert len(on_thread) == 1  # its torch op is in the trace too
    step1 = parsed.steps.set_index("step").loc[1]
    assert step1["start_ns"] <= log["ts_ns"] <= step1["end_ns"]  # the range starts inside step 1
    path = _path(parsed)
    assert not (path["trace_index"] == log["trace_index"]).any()
    forward = path[path["stage"] == "forward"]
    per_step = (forward["end_ns"] - forward["start_ns"]).groupby(forward["step"]).sum().sort_index()
    # Each step against its own main-thread forward as measured (not against other steps: a loaded 2-core machine
    # stretches one step by tens of ms): the background sleep adds nothing (a leak would add up to SLEEP_S), the
    # main one adds what it slept.
    own_work = pd.Series(forward_ns, index=per_step.index) - pd.Series([0, 0, slept_ns, 0], index=per_step.index)
    added = per_step - own_work
    assert abs(added[[0, 1, 3]]).max() < 0.05 * SLEEP_S * 1e9, (per_step.tolist(), forward_ns)
    assert added[2] == pytest.approx(slept_ns, rel=0.1), (per_step.tolist(), forward_ns, slept_ns)


# -- newer Kineto's cuda_sync args: which stream (and which event record) a wait is for ----------------------------


def _cuda_sync(b: TraceBuilder, name: str, call: dict, stream: int, on: int, record: dict, args: bool) -> None:
    """A ``cuda_sync`` event for ``call``; with ``args``, the ``wait_on_*`` args newer Kineto writes."""
    extra = {"wait_on_stream": on, "wait_on_cuda_event_record_corr_id": record["args"]["correlation"]} if args else {}
    b.events.append(
        {"ph": "X", "cat": "cuda_sync", "name": name, "pid": GPU_PID, "tid": stream, "ts": call["ts"], "dur": 1,
         "args": {"correlation": call["args"]["correlation"], "stream": stream, "device": 0, **extra}}
    )  # fmt: skip


def _stream_wait_trace(args: bool) -> TraceBuilder:
    """Stream 9's kernel waits (cudaStreamWaitEvent) for the event recorded after stream 7's gemm [20, 480]; stream
    8's kernel, launched after the record, ends at 495: closer to the waiter's start (500), so timing picks it."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.launch(12, 20, 460, name="gemm")
    record = _sync(b, "cudaEventRecord", 14, 1)
    _on_stream(b.launch(16, 30, 465, name="unrelated")[1], 8)
    wait = _sync(b, "cudaStreamWaitEvent", 18, 1)
    _cuda_sync(b, "Stream Wait Event", wait, 9, STREAM, record, args)
    _on_stream(b.launch(30, 500, 287, name="waiter")[1], 9)
    _sync(b, "cudaDeviceSynchronize", 40, 760)
    return b


def test_a_stream_wait_event_follows_its_args_not_the_closest_end(tmp_path) -> None:
    guessed = _path(_parse(_stream_wait_trace(args=False), tmp_path, "guess.json"))
    assert "unrelated" in set(guessed["name"].astype(str))  # the timing guess: the wrong stream
    parsed = _parse(_stream_wait_trace(args=True), tmp_path, "args.json")
    assert int(parsed.raw.events["wait_on_stream"].max()) == STREAM
    assert _segments(parsed)[-6:] == [
        ("launch", 13, 20),
        ("gpu_compute", 20, 480),
        ("gpu_idle", 480, 500),  # the waiter's wait for the recorded event
        ("gpu_compute", 500, 787),
        ("sync_wait", 787, 800),
        ("python", 800, 1000),
    ]


def _event_sync_trace(args: bool) -> TraceBuilder:
    """cudaEventSynchronize [100, 605] waits for the event recorded after stream 7's gemm (ends 600); stream 8's
    kernel, launched after the record, ends at 603 inside the call: the last end, which timing picks."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.launch(12, 20, 580, name="gemm")
    record = _sync(b, "cudaEventRecord", 14, 1)
    _on_stream(b.launch(30, 40, 563, name="unrelated")[1], 8)
    call = _sync(b, "cudaEventSynchronize", 100, 505)
    _cuda_sync(b, "Event Sync", call, -1, STREAM, record, args)
    return b


def test_an_event_sync_follows_its_args_not_the_last_end(tmp_path) -> None:
    guessed = _segments(_parse(_event_sync_trace(args=False), tmp_path, "guess.json"))
    assert ("gpu_compute", 40, 603) in guessed and ("sync_wait", 603, 605) in guessed
    segments = _segments(_parse(_event_sync_trace(args=True), tmp_path, "args.json"))
    assert segments[-3:] == [("gpu_compute", 20, 600), ("sync_wait", 600, 605), ("python", 605, 1000)]


def test_blocking_calls_are_worked_out_once_per_event_table(tmp_path, monkeypatch) -> None:
    import profparse.analysis.critical_path as cp

    parsed = _parse(_blocking_copy_trace(False), tmp_path, "inferred.json")
    events, links = parsed.raw.events, parsed.links
    made = []
    work = cp._blocking_calls
    monkeypatch.setattr(cp, "_blocking_calls", lambda e, lk: made.append(e) or work(e, lk))
    first = blocking_calls(events, links)
    first[0][:] = False  # a caller's own copy: the next caller still gets the answer
    again = blocking_calls(events, links)
    assert len(made) == 1 and again[1].any() and np.array_equal(again[0] & again[1], again[1])
    assert [m.tolist() for m in again] == [m.tolist() for m in work(events, links)]
    other = events.copy()  # another table (same rows): worked out for it
    assert [m.tolist() for m in blocking_calls(other, links)] == [m.tolist() for m in again] and len(made) == 2
