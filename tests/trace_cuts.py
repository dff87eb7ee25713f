"""Cut a real trace so that it starts mid-step, as a profiler started late records it (for tests)."""

from __future__ import annotations

import re
from typing import Any

COLLECTIVE_KERNEL = re.compile(r"(?i)nccl|rccl|msccl")
GPU_CATEGORIES = {"kernel", "Kernel"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}


def collective_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The collective kernels of ``doc`` whose launching runtime call is in it, in GPU start order."""
    events = doc["traceEvents"]
    calls = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in RUNTIME_CATEGORIES and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }
    kernels = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and COLLECTIVE_KERNEL.search(str(e.get("name")))
    ]
    return sorted((k for k in kernels if k.get("args", {}).get("correlation") in calls), key=lambda k: float(k["ts"]))


def cut_at_collective(doc: dict[str, Any], index: int) -> tuple[dict[str, Any], float]:
    """``doc`` as if the profiler had started between the launch of its ``index``-th collective kernel (in GPU start
    order) and the kernel's start: every event that starts before that time is dropped (metadata stays), so the
    kernel and every kernel queued before it keep running with no launch call and no ``record_param_comms`` in the
    file. Returns the cut document and the cut time (us)."""
    events = doc["traceEvents"]
    kernel = collective_kernels(doc)[index]
    correlation = kernel["args"]["correlation"]
    launch = next(
        e for e in events if e.get("cat") in RUNTIME_CATEGORIES and e.get("args", {}).get("correlation") == correlation
    )
    start, run = float(launch["ts"]), float(kernel["ts"])
    assert start < run, "the kernel starts before its launch"
    cut = start + min(1.0, (run - start) / 2)  # just after the launch call began
    kept = [e for e in events if e.get("ph") == "M" or "ts" not in e or float(e["ts"]) >= cut]
    return {**doc, "traceEvents": kept}, cut


def one_collective_name(doc: dict[str, Any], name: str = "ncclKernel_SendRecv") -> dict[str, Any]:
    """``doc`` with every collective kernel renamed ``name``: as point-to-point NCCL (``SendRecv``) or RCCL
    (``ncclDevKernel_Generic``) traces show them, so that names alone cannot tell one collective from another."""
    events = [
        {**e, "name": name} if e.get("cat") in GPU_CATEGORIES and COLLECTIVE_KERNEL.search(str(e.get("name"))) else e
        for e in doc["traceEvents"]
    ]
    return {**doc, "traceEvents": events}
