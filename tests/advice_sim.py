"""A tiny CUDA-semantics simulator that writes Kineto traces: the host runs ops one after another, each launch
queues its kernel on one stream (it starts when the launch is done and the stream is free), a synchronize makes
the host wait for the stream. A training program written against it gives a trace whose step times follow from
the program, so the same program with a fix applied gives the ground truth a finding's saving is checked against.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from profparse.analysis.profiler_cost import CALIBRATION_KEY
from profparse.analysis.replay import OVERHEAD_KINDS
from tests.tracebuilder import AUTOGRAD, GPU_PID, MAIN, STREAM, TraceBuilder

LAUNCH_US = 1.0  # a cudaLaunchKernel's own time
SYNC_RETURN_US = 1.0  # a synchronize returns this long after the GPU is done


class Sim:
    """Host clock ``t`` and stream clock ``g`` (us); the events go to a :class:`TraceBuilder`."""

    def __init__(self, device: str = "NVIDIA A100-SXM4-80GB") -> None:  # noqa: D107
        self.b = TraceBuilder()
        self.b.header["deviceProperties"] = [{"id": 0, "name": device}]
        # no profiler ran: its measured cost per recorded event is nothing (docs/without_profiler.md)
        self.b.header[CALIBRATION_KEY] = {"per_event_ns": dict.fromkeys(OVERHEAD_KINDS, 0)}
        self.t = 0.0
        self.free: dict[int, float] = {STREAM: 0.0}  # each stream's clock
        self.tid = MAIN

    @property
    def g(self) -> float:
        """When every stream is done."""
        return max(self.free.values())

    def op(
        self,
        name: str,
        host_us: float,
        kernel_us: float = 0.0,
        kernel: str = "k",
        stream: int = STREAM,
        after: int | None = None,
        **args: object,
    ) -> None:
        """An op taking ``host_us`` on the host; if ``kernel_us``, it launches a kernel on ``stream`` at its end,
        which waits for the work queued on stream ``after`` (an event wait) when given."""
        self.b.op(name, self.t, host_us + (LAUNCH_US if kernel_us else 0), self.tid, **args)
        self.t += host_us
        if kernel_us:
            start = max(self.t + LAUNCH_US + 1, self.free.get(stream, 0.0))
            if after is not None:
                start = max(start, self.free[after])
            _, gpu = self.b.launch(self.t, start, kernel_us, self.tid, name=kernel)
            gpu["tid"] = stream
            gpu["args"]["stream"] = stream
            self.free[stream] = start + kernel_us
            self.t += LAUNCH_US

    def graph(self, kernels_us: list[float], kernel: str = "k") -> None:
        """One cudaGraphLaunch replaying ``kernels_us`` back to back."""
        start = max(self.t + LAUNCH_US + 1, self.free[STREAM])
        replay = []
        for dur in kernels_us:
            replay.append((kernel, start, dur))
            start += dur
        self.b.graph_launch(self.t, replay, self.tid)
        self.free[STREAM] = start
        self.t += LAUNCH_US

    def runtime(self, name: str, host_us: float) -> None:
        """A runtime call that does not wait for the GPU (e.g. cudaMalloc)."""
        self.b.correlation += 1
        self.b.span(name, self.t, host_us, "cuda_runtime", self.tid, correlation=self.b.correlation)
        self.t += host_us

    def sync(self, name: str = "cudaDeviceSynchronize", op: str | None = None, own_us: float = 0.0) -> None:
        """A call that waits for the stream (inside ``op`` when given, e.g. ``aten::item``), then works ``own_us``
        on its own (a free that unmaps its memory)."""
        end = max(self.t + 1, self.g + SYNC_RETURN_US) + own_us
        if op:
            self.b.op(op, self.t, end - self.t + 1, self.tid)
        self.b.correlation += 1
        self.b.span(name, self.t, end - self.t, "cuda_runtime", self.tid, correlation=self.b.correlation)
        self.t = end + (1 if op else 0)

    def copy(self, kind: str, us: float) -> None:
        """A host-to-device copy: pageable copies block the host until done; pinned ones are queued."""
        self.b.op("aten::copy_", self.t, 2, self.tid)
        self.b.correlation += 1
        start = max(self.t + 1, self.free[STREAM])
        blocking = kind == "Pageable"
        call_end = start + us + SYNC_RETURN_US if blocking else self.t + LAUNCH_US
        call = self.b.span("cudaMemcpyAsync", self.t, call_end - self.t, "cuda_runtime", self.tid)
        call["args"]["correlation"] = self.b.correlation
        self.b.events.append(
            {"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy HtoD ({kind} -> Device)", "pid": GPU_PID,
             "tid": STREAM, "ts": start, "dur": us,
             "args": {"correlation": self.b.correlation, "stream": STREAM, "device": 0, "bytes": int(us * 10_000)}}
        )  # fmt: skip
        self.free[STREAM] = start + us
        self.t = call_end

    def step(self, n: int, forward: Callable[[Sim], None], backward: Callable[[Sim], None],
             optimizer: Callable[[Sim], None], before: Callable[[Sim], None] | None = None) -> float:  # fmt: skip
        """One training step: ``before`` (data, logging), forward under an nn.Module, backward on the autograd
        thread, the optimizer range; the step ends when the GPU is done. Returns the step's duration."""
        t0 = self.t
        step = self.b.annotation(f"ProfilerStep#{n}", t0, 0)
        self.t += 2
        if before:
            before(self)
        module = self.b.py("nn.Module: Net_0", self.t, 0)
        f0 = self.t
        forward(self)
        module["dur"] = self.t - f0
        self.t += 2
        self.tid = AUTOGRAD
        node = self.b.op("autograd::engine::evaluate_function: MmBackward0", self.t, 0, tid=AUTOGRAD)
        b0 = self.t
        backward(self)
        node["dur"] = self.t - b0
        self.tid = MAIN
        self.t += 2
        opt = self.b.annotation("Optimizer.step#AdamW.step", self.t, 0)
        o0 = self.t
        optimizer(self)
        opt["dur"] = self.t - o0
        self.sync()
        self.t += 2
        step["dur"] = self.t - t0
        return step["dur"]

    def write(self, path: Path) -> Path:
        return self.b.write(path)


A100 = "NVIDIA A100-SXM4-80GB"


def run(
    path: Path, steps: int, forward: Callable[[Sim], None], backward: Callable[[Sim], None],
    optimizer: Callable[[Sim], None], before: Callable[[Sim], None] | None = None, device: str = A100,
) -> tuple[Path, float]:  # fmt: skip
    """Simulate ``steps`` steps; returns the trace and the mean duration (us) of the steps after the first."""
    sim = Sim(device)
    durations = [sim.step(n, forward, backward, optimizer, before) for n in range(1, steps + 1)]
    return sim.write(path), sum(durations[1:]) / (steps - 1)
