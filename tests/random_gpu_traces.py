"""Random GPU training traces: several threads and streams, launches, copies, syncs of every kind, NCCL, graphs,
memory events, user marks, odd lengths (zero, negative steps), steps missing, shuffled or out of order, and stray
work outside the steps. Seeded (``random.Random``): a seed is the same trace on every machine."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal
from typing import Any

from tracebuilder import AUTOGRAD, GPU_PID, MAIN, TraceBuilder

STREAMS = (7, 13, 20)
OTHER_THREAD = 999
KINDS = ("forward", "backward", "optimizer", "memcpy", "memset", "sync", "nccl", "memory", "load",
         "gpu_annotation", "user_mark", "graph", "plain")  # fmt: skip
DEVICES = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "AMD Instinct MI300X", "Fake")


def _activity(
    b: TraceBuilder, rng: random.Random, ts: float, tid: int, name: str, stream: int | None = None,
    cat: str = "kernel", launch: str = "cudaLaunchKernel",
) -> None:  # fmt: skip
    """A runtime call and the GPU activity it launches (sometimes starting before the call: clock skew)."""
    b.correlation += 1
    b.span(launch, ts, rng.choice([0.5, 1, 3, 0]), "cuda_runtime", tid, correlation=b.correlation)
    skew = rng.choice([2, 5, 20, 200, -1, 0.5])
    on = stream if stream is not None else rng.choice(STREAMS)
    dur = rng.choice([0, 0.001, 1, 5, 30, 300])
    args = {"correlation": b.correlation, "stream": on, "device": rng.choice([0, 0, 0, 1]), "grid": [8, 1, 1],
            "block": [128, 1, 1]}  # fmt: skip
    b.events.append({"ph": "X", "cat": cat, "name": name, "pid": GPU_PID, "tid": on, "ts": ts + skew, "dur": dur,
                     "args": args})  # fmt: skip


def _sync_event(name: str, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_sync", "name": name, "pid": GPU_PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"cuda_sync_kind": name, "device": 0, **args}}  # fmt: skip


def _sync(b: TraceBuilder, rng: random.Random, ts: float, tid: int) -> None:
    """A stream, device or event synchronisation, or a stream waiting for an event (newer Kineto's cuda_sync)."""
    kind = rng.choice(["stream", "device", "event", "wait"])
    b.correlation += 1
    c = b.correlation
    if kind == "stream":
        on = rng.choice(STREAMS)
        b.span("cudaStreamSynchronize", ts, rng.choice([1, 50, 400]), "cuda_runtime", tid, correlation=c)
        b.events.append(_sync_event("Stream Sync", on, ts + 1, 5, stream=on, correlation=c))
    elif kind == "device":
        b.span("cudaDeviceSynchronize", ts, rng.choice([1, 50, 400]), "cuda_runtime", tid, correlation=c)
    elif kind == "event":
        record = c - rng.choice([1, 2, 5, 1000])  # (1000: a record the trace does not hold)
        b.span("cudaEventSynchronize", ts, rng.choice([1, 50]), "cuda_runtime", tid, correlation=c)
        b.events.append(
            _sync_event("Event Sync", -1, ts + 1, 3, wait_on_stream=rng.choice([7, 13, -1]),
                        wait_on_cuda_event_record_corr_id=record, stream=-1, correlation=c)
        )  # fmt: skip
    else:
        on = rng.choice(STREAMS)
        b.span("cudaEventRecord", ts, 1, "cuda_runtime", tid, correlation=c)
        b.correlation += 1
        b.span("cudaStreamWaitEvent", ts + 2, 1, "cuda_runtime", tid, correlation=b.correlation)
        b.events.append(
            _sync_event("Wait Event", on, ts + 3, 0, stream=on, wait_on_stream=rng.choice(STREAMS),
                        wait_on_cuda_event_record_corr_id=c, correlation=b.correlation)
        )  # fmt: skip


def _segment(b: TraceBuilder, rng: random.Random, kind: str, t: float, tid: int) -> float:
    """One piece of work of ``kind`` at ``t``; its length."""
    length = rng.choice([3, 10, 40, 120])
    if kind == "forward":
        b.py(f"nn.Module: Linear_{rng.randrange(3)}", t, length, tid=tid)
        args = {"Input Dims": [[64, 128], [128, 256]], "Input type": ["float", "float"],
                "Sequence number": rng.randrange(100), "Fwd thread id": 0}  # fmt: skip
        b.op("aten::mm", t + 1, length - 2, tid=tid, **args)
        _activity(
            b, rng, t + 2, tid, rng.choice(["ampere_sgemm_128x64_nn", "sm80_xmma_gemm_bf16", "elementwise_kernel"])
        )
    elif kind == "backward":
        thread = rng.choice([AUTOGRAD, AUTOGRAD, tid])
        args = {"Sequence number": rng.randrange(100), "Fwd thread id": 1}
        b.op("autograd::engine::evaluate_function: MmBackward0", t, length, tid=thread, **args)
        b.op("MmBackward0", t + 0.5, length - 1, tid=thread)
        _activity(b, rng, t + 1, thread, "sm80_xmma_gemm_bf16_bwd")
    elif kind == "optimizer":
        name = rng.choice(["Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad"])
        b.annotation(name, t, length, tid=tid)
        b.op("aten::_foreach_add_", t + 1, length - 2, tid=tid)
        _activity(b, rng, t + 2, tid, "multi_tensor_apply_kernel")
    elif kind == "memcpy":
        b.op("aten::copy_", t, length, tid=tid)
        _activity(b, rng, t + 1, tid, "Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy", launch="cudaMemcpyAsync")
    elif kind == "memset":
        _activity(b, rng, t + 1, tid, "Memset (Device)", cat="gpu_memset", launch="cudaMemsetAsync")
    elif kind == "sync":
        _sync(b, rng, t, tid)
    elif kind == "nccl":
        args = {"Collective name": "allreduce", "In msg nelems": 1024, "Group size": 2, "dtype": "Float"}
        b.op("record_param_comms", t, length, tid=tid, **args)
        _activity(b, rng, t + 1, tid, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=20)
    elif kind == "memory":
        b.memory(t, rng.choice([-4096, 4096, 1 << 20, -(1 << 20)]), rng.choice([0, 8192, 1 << 22]), tid=tid)
    elif kind == "load":
        b.py("transformers/modeling_utils.py(1): from_pretrained", t, length, tid=tid)
        b.op("aten::empty", t + 1, 1, tid=tid)
    elif kind == "gpu_annotation":
        b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "## forward ##", "pid": GPU_PID,
                         "tid": rng.choice(STREAMS), "ts": t, "dur": length, "args": {}})  # fmt: skip
    elif kind == "user_mark":
        name = rng.choice(["## forward ##", "## backward ##", "## optimizer ##", "my_range"])
        b.annotation(name, t, length, tid=tid)
    elif kind == "graph":
        b.graph_launch(t, [("graph_k1", t + 5, 3), ("graph_k2", t + 9, 2)], tid=tid)
    else:
        b.op("aten::add", t, length, tid=tid)
    return length


def random_gpu_trace(seed: int) -> dict[str, Any]:
    """The trace document of ``seed``."""
    rng = random.Random(seed)
    b = TraceBuilder(autograd_thread=rng.random() < 0.9)
    if rng.random() < 0.5:
        b.header["deviceProperties"] = [{"id": 0, "name": rng.choice(DEVICES)}]
    t = rng.choice([0.0, 1e9, 1.7e15])
    numbers = list(range(rng.choice([0, 1, 2, 3, 5])))
    if rng.random() < 0.2:
        rng.shuffle(numbers)
    for n in numbers:
        kinds = [rng.choice(KINDS) for _ in range(rng.randint(0, 8))]
        if rng.random() < 0.6:
            kinds = ["forward"] * rng.randint(0, 3) + ["backward"] * rng.randint(0, 3) + ["optimizer"] + kinds
        tid = MAIN if rng.random() < 0.9 else OTHER_THREAD
        start = t
        for kind in kinds:
            t += _segment(b, rng, kind, t, tid) + rng.choice([0, 0.5, 2, 30])
        dur = t - start + rng.choice([1, 0, -0.5 * (t - start), 50])
        if rng.random() < 0.1:
            dur = 0
        if rng.random() < 0.9:
            b.annotation(f"ProfilerStep#{n}", start, max(dur, 0), tid=tid)
        t += rng.choice([0, 1, 100])
    for kind in [rng.choice(KINDS) for _ in range(rng.randint(0, 4))]:  # stray work, outside the steps
        at = rng.uniform(0, t + 10) if t else rng.uniform(0, 100)
        _segment(b, rng, kind, at, rng.choice([MAIN, AUTOGRAD, OTHER_THREAD]))
    rng.shuffle(b.events)
    return b.document()


def shifted(doc: dict, shift_us: int) -> str:
    """The trace's JSON with every ``ts`` later by ``shift_us``, exactly (decimal text, not float64 sums)."""
    texts: list[str] = []

    def moved(event: dict) -> dict:
        ts = event.get("ts")
        if not isinstance(ts, int | float) or isinstance(ts, bool):
            return event
        texts.append(str(Decimal(repr(ts)) + shift_us))
        return {**event, "ts": f"@ts{len(texts) - 1}@"}

    text = json.dumps({**doc, "traceEvents": [moved(e) for e in doc["traceEvents"]]})
    return re.sub(r'"@ts(\d+)@"', lambda m: texts[int(m.group(1))], text)
