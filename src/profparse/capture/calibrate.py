"""Measure the profiler's own cost where profparse captures (docs/without_profiler.md, "Calibration").

A short fixed micro-loop of ops is timed without the profiler, under it without shapes and with
``record_shapes``, on CPU tensors (ops only) and on the capture's device (ops and their launches): the differences
per op are the cost per recorded op and per runtime call. A few training steps are timed unprofiled too. Both go
into the trace's top-level field ``profparse_calibration`` (and the manifest), so that ``without_profiler`` is
``calibrated`` for this trace. torch is passed in: importing this module does not import it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: ops per micro-loop, loops per setting and round, rounds (the fastest loop counts: the host's jitter only adds)
LOOP_OPS = 400
REPEATS = 5
ROUNDS = 3
CALIBRATION_KEY = "profparse_calibration"  # the same name as profparse.analysis.profiler_cost's


def _loop(torch: Any, x: Any) -> None:
    for _ in range(LOOP_OPS // 2):
        x = torch.add(x, 1.0)
        x = torch.mul(x, 0.5)


def _fastest(run: Callable[[], None], sync: Callable[[], None]) -> float:
    """The fastest of :data:`REPEATS` runs, in ns per op."""
    best = float("inf")
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter_ns()
        run()
        sync()
        best = min(best, time.perf_counter_ns() - t0)
    return best / LOOP_OPS


def _per_op(torch: Any, device: str, activities: list[Any]) -> dict[str, float]:
    """ns per op of the micro-loop on ``device``: unprofiled, profiled, profiled with shapes, each the fastest over
    :data:`ROUNDS` rounds that time all three in turn: a host whose speed changed while one setting was timed
    (another process starting or ending) once made the unprofiled loop slower than the profiled one."""
    x = torch.ones(256, device=device)
    on_cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    _loop(torch, x)  # warm: first-call costs out of the timing
    out = dict.fromkeys(("plain", "profiled", "shapes"), float("inf"))
    for _ in range(ROUNDS):
        out["plain"] = min(out["plain"], _fastest(lambda: _loop(torch, x), sync))
        for name, shapes in (("profiled", False), ("shapes", True)):
            with torch.profiler.profile(activities=activities, record_shapes=shapes):
                _loop(torch, x)
                out[name] = min(out[name], _fastest(lambda: _loop(torch, x), sync))
    return out


def micro_loop(torch: Any, device: str) -> dict[str, Any]:
    """The profiler's cost per event kind (ns): ``op_shapes`` and ``op`` from CPU tensors, ``runtime`` from the
    device's extra cost per op (its launch) where the device is a GPU; kinds not measured are left out (their
    defaults apply)."""
    cpu_activity = [torch.profiler.ProfilerActivity.CPU]
    cpu = _per_op(torch, "cpu", cpu_activity)
    costs = {"op": max(cpu["profiled"] - cpu["plain"], 0.0), "op_shapes": max(cpu["shapes"] - cpu["plain"], 0.0)}
    loops = {"cpu": cpu}
    if device.startswith("cuda"):
        gpu = _per_op(torch, device, [*cpu_activity, torch.profiler.ProfilerActivity.CUDA])
        loops["device"] = gpu
        costs["runtime"] = max((gpu["shapes"] - gpu["plain"]) - costs["op_shapes"], 0.0)
    return {"per_event_ns": {k: round(v, 1) for k, v in costs.items()}, "micro_loop_ns_per_op": loops}


def unprofiled_steps(step: Callable[[], None], sync: Callable[[], None], count: int) -> list[int]:
    """Each of ``count`` steps timed without the profiler (ns), synchronised only after the last: as a loop runs."""
    ends = []
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(count):
        step()
        ends.append(time.perf_counter_ns())
    sync()
    ends[-1] = time.perf_counter_ns()
    return [b - a for a, b in zip([t0, *ends[:-1]], ends, strict=True)]


def add_to_trace(path: Path, calibration: dict[str, Any]) -> None:
    """Add ``calibration`` as the top-level field :data:`CALIBRATION_KEY` of the (uncompressed) JSON trace at
    ``path``: written over its closing brace, without reading the trace."""
    text = json.dumps(calibration, sort_keys=True).encode()
    with open(path, "r+b") as f:
        f.seek(0, 2)
        size = f.tell()
        back = min(size, 4096)
        f.seek(size - back)
        tail = f.read(back)
        brace = tail.rstrip().rfind(b"}")
        if brace < 0:
            raise ValueError(f"{path}: not a JSON object")
        f.seek(size - back + brace)
        f.write(b', "' + CALIBRATION_KEY.encode() + b'": ' + text + b"}\n")
        f.truncate()
