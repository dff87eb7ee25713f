"""Build small Kineto-style traces by hand for unit tests."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAIN = 100
AUTOGRAD = 200
PID = 1
GPU_PID = 0
STREAM = 7


class TraceBuilder:
    """Append events with microsecond times; ``write`` saves a trace file."""

    def __init__(self, autograd_thread: bool = True) -> None:
        self.events: list[dict[str, Any]] = [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": PID,
                "tid": MAIN,
                "args": {"name": "thread 100 (pt_main_thread)"},
            },
            {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
        ]
        if autograd_thread:
            self.events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": PID,
                    "tid": AUTOGRAD,
                    "args": {"name": "thread 200 (pt_autograd_0)"},
                }
            )
        self.correlation = 1000
        self.header: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Fake GPU"}]}

    def span(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = MAIN, **args: Any) -> dict:
        event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}
        self.events.append(event)
        return event

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN, **args: Any) -> dict:
        return self.span(name, ts, dur, "cpu_op", tid, **args)

    def annotation(self, name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
        return self.span(name, ts, dur, "user_annotation", tid)

    def py(self, name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
        return self.span(name, ts, dur, "python_function", tid)

    def launch(
        self,
        ts: float,
        kernel_ts: float,
        kernel_dur: float,
        tid: int = MAIN,
        name: str = "k",
        cat: str = "kernel",
        **kernel_args: Any,
    ) -> tuple[dict, dict]:
        """A cudaLaunchKernel at ``ts`` (1 us long) and the GPU activity it launches."""
        self.correlation += 1
        runtime = self.span("cudaLaunchKernel", ts, 1.0, "cuda_runtime", tid, correlation=self.correlation)
        gpu = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": GPU_PID,
            "tid": STREAM,
            "ts": kernel_ts,
            "dur": kernel_dur,
            "args": {"correlation": self.correlation, "stream": STREAM, "device": 0, **kernel_args},
        }
        self.events.append(gpu)
        return runtime, gpu

    def graph_launch(
        self, ts: float, kernels: list[tuple[str, float, float]], tid: int = MAIN, name: str = "cudaGraphLaunch"
    ) -> tuple[dict, list[dict]]:
        """A graph launch at ``ts`` (1 us long) and the kernels it replays, ``(name, ts, dur)`` each, all under the
        launch's one correlation id (as CUDA / HIP graphs record them)."""
        self.correlation += 1
        runtime = self.span(name, ts, 1.0, "cuda_runtime", tid, correlation=self.correlation)
        replayed = [
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": GPU_PID, "tid": STREAM, "ts": start, "dur": dur,
             "args": {"correlation": self.correlation, "stream": STREAM, "device": 0}}
            for kernel, start, dur in kernels
        ]  # fmt: skip
        self.events.extend(replayed)
        return runtime, replayed

    def captured_launch(self, ts: float, tid: int = MAIN) -> dict:
        """A cudaLaunchKernel made while a stream is captured: recorded on the host, nothing runs on the GPU."""
        self.correlation += 1
        return self.span("cudaLaunchKernel", ts, 1.0, "cuda_runtime", tid, correlation=self.correlation)

    def memory(self, ts: float, nbytes: int, total: int, tid: int = MAIN) -> dict:
        event = {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": PID,
            "tid": tid,
            "ts": ts,
            "args": {
                "Bytes": nbytes,
                "Total Allocated": total,
                "Total Reserved": total,
                "Device Type": 1,
                "Device Id": 0,
                "Addr": 1234,
            },
        }
        self.events.append(event)
        return event

    def document(self) -> dict[str, Any]:
        return {**self.header, "traceEvents": self.events, "traceName": "built-by-tests"}

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        text = json.dumps(self.document(), indent=1).encode()
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text))
        else:
            path.write_bytes(text)
        return path


def training_step(b: TraceBuilder, step: int, t0: float) -> float:
    """One realistic step: forward (module, op, kernel), backward on the autograd thread, optimizer; returns end."""
    b.annotation(f"ProfilerStep#{step}", t0, 100)
    b.py("nn.Module: Linear_0", t0 + 1, 20)
    b.op("aten::linear", t0 + 2, 15)
    b.launch(t0 + 3, t0 + 5, 10, name="gemm_fwd")
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 30, 30, tid=AUTOGRAD)
    b.op("AddmmBackward0", t0 + 31, 25, tid=AUTOGRAD)
    b.launch(t0 + 32, t0 + 35, 20, tid=AUTOGRAD, name="gemm_bwd")
    b.annotation("Optimizer.step#AdamW.step", t0 + 70, 20)
    b.op("aten::_foreach_add_", t0 + 71, 10)
    b.launch(t0 + 72, t0 + 75, 5, name="adam_kernel")
    return t0 + 100


# -- helpers for the analysis tests (tests/test_analysis_*.py) -------------------------------------------------------


def forward_op(b: TraceBuilder, name: str, ts: float, dur: float, seq: int, tid: int = MAIN) -> dict:
    """A forward op that recorded autograd history: ``Sequence number`` = ``seq``, ``Fwd thread id`` = 0."""
    return b.op(name, ts, dur, tid, **{"Sequence number": seq, "Fwd thread id": 0})


def backward_node(b: TraceBuilder, node: str, ts: float, dur: float, seq: int, tid: int = AUTOGRAD) -> dict:
    """An autograd node as the engine records it: the ``evaluate_function`` wrapper around the node op."""
    args = {"Sequence number": seq, "Fwd thread id": 1}
    wrapper = b.op(f"autograd::engine::evaluate_function: {node}", ts, dur, tid, **args)
    b.op(node, ts + 0.5, dur - 1, tid, **args)
    return wrapper


def memory_event(
    b: TraceBuilder,
    ts: float,
    nbytes: int,
    total: int | None,
    *,
    reserved: int | None = None,
    device_type: int = 1,
    device_id: int = 0,
    tid: int = MAIN,
) -> dict:
    """A ``[memory]`` event; ``total`` None leaves out ``Total Allocated`` (as legacy traces do)."""
    event = b.memory(ts, nbytes, total or 0, tid)
    args = event["args"]
    args["Device Type"], args["Device Id"] = device_type, device_id
    args["Total Reserved"] = reserved if reserved is not None else (total or 0)
    if total is None:
        del args["Total Allocated"], args["Total Reserved"]
    return event


def complete_events(text: bytes) -> Iterator[dict[str, Any]]:
    """The events of a (possibly cut) document that are complete in ``text``, by the standard json module."""
    decoder = json.JSONDecoder()
    body = text[text.index(b'"traceEvents": [') + 16 :].decode()
    pos = 0
    while True:
        while pos < len(body) and body[pos] in " \n,":
            pos += 1
        try:
            event, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError:
            return
        yield event


def slow_rank_folder(folder: Path) -> Path:
    """Four ranks that take a few seconds to parse with -j 2. Their contents differ (by trailing blank lines), so
    the parsed-trace cache cannot answer one rank from another's entry and make the run short."""
    folder.mkdir()
    b = TraceBuilder()
    t = 0.0
    for step in range(3000):
        t = training_step(b, step, t)
    b.write(folder / "rank0.json")
    text = (folder / "rank0.json").read_bytes()
    for r in range(1, 4):
        (folder / f"rank{r}.json").write_bytes(text + b"\n" * r)
    return folder


def step_begun_before_its_frame(path: str | Path, steps: int = 2) -> Path:
    """``steps`` (1 or 2) steps whose stages sit under a Python frame that ``ProfilerStep#1`` began before and
    outlives it (the loop's own function, entered after ``prof.step()``): step 1's range overlaps its stages
    without holding them. Step 1: forward 30-330 us, optimizer 650-950 us; step 2 the same from 1020 us."""
    b = TraceBuilder()
    b.py("train.py(10): <module>", 0, 2000)
    b.annotation("ProfilerStep#1", 10, 1000)
    b.py("train.py(20): loop", 20, 1900)
    for step, t in ((1, 30), (2, 1020))[:steps]:
        if step == 2:
            b.annotation("ProfilerStep#2", 1015, 900)
        b.py("nn.Module: Linear_0", t, 300)
        b.op("aten::linear", t + 1, 290, **{"Sequence number": step})
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 310, 300, tid=AUTOGRAD)
        b.annotation("Optimizer.step#AdamW.step", t + 620, 300)
        b.op("aten::_foreach_add_", t + 621, 290)
    return b.write(path)


def gpu_work_before_first_step(path: str | Path) -> Path:
    """Steps 1-3 and, before the first, 50 us of a kernel whose launch is not in the trace (it was still running
    when the trace began): GPU work of a step 0 with no host range in the trace."""
    b = TraceBuilder()
    t = 100.0
    for step in (1, 2, 3):
        t = training_step(b, step, t)
    b.events.append({"ph": "X", "cat": "kernel", "name": "adam_kernel", "pid": GPU_PID, "tid": STREAM, "ts": 40.0,
                     "dur": 50.0, "args": {"correlation": 5, "stream": STREAM, "device": 0}})  # fmt: skip
    return b.write(path)
