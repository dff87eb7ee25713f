"""Findings about the host: waiting for data, work between steps, synchronisations, allocator calls."""

from __future__ import annotations

import re

import numpy as np

from profparse.analysis.advice.build import from_path
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.analysis.advice.kinds import detector
from profparse.analysis.advice.waits import ALLOCATOR_CALL
from profparse.base.arrays import in_categories
from profparse.stages.attribute import STEP_NAME
from profparse.trace.link import kind_mask

SINGLE_PROCESS_LOADER = re.compile(r"_SingleProcessDataLoaderIter")
#: With worker processes, ``__next__`` also receives the batch: each tensor's shared memory is passed over a socket
#: by the worker's sharer thread, a round trip to the worker process that takes up to ~10 ms on a loaded machine.
#: A wait is a slow loader, not that hand-over, from 5% of the step and 10 ms, or from a quarter of a short step.
WORKER_HANDOVER_SHARE = 0.05
WORKER_HANDOVER_NS = 10_000_000
WORKER_WAIT_SHARE = 0.25


def worker_wait_threshold_ns(step_ns: float) -> float:
    """The per-step wait from which a loader with worker processes is reported (below it: the hand-over)."""
    return min(max(WORKER_HANDOVER_SHARE * step_ns, WORKER_HANDOVER_NS), WORKER_WAIT_SHARE * step_ns)


_HOST_BOUNDS = ("python", "cpu_op", "launch", "sync_wait")


@detector
def data_loading(ctx: AdviceContext) -> list[Finding]:
    """The host waits for the next batch on the path (segments bound ``data``)."""
    segments = (ctx.path["bound"] == "data").to_numpy()
    single = bool((ctx.names(SINGLE_PROCESS_LOADER) & ctx.in_steps()).any())
    where = " in the main process (DataLoader num_workers=0)" if single else ""
    if not single and ctx.per_step(segments).mean() < worker_wait_threshold_ns(ctx.step_ns):
        return []  # taking a batch from worker processes costs a little: not worth a finding
    return from_path(
        ctx,
        "data_loading",
        segments,
        "high",
        "the step waits {saving} ({share} of the step) for its next batch" + where,
        {"single_process_loader": single},
    )


@detector
def between_steps(ctx: AdviceContext) -> list[Finding]:
    """Host work of stage ``other`` on the path that is not data loading: logging, metrics, checkpoints."""
    path = ctx.path
    if not in_categories(path["stage"], ("forward", "backward", "optimizer")).any():
        return []  # not a training step: nothing is "between" stages
    segments = in_categories(path["stage"], ("other",)) & in_categories(path["bound"], _HOST_BOUNDS)
    rows = ctx.segment_rows
    key = np.full(len(rows), -1, dtype=np.int64)
    key[segments] = ctx.below(rows[segments], ctx.names(STEP_NAME))
    return from_path(
        ctx,
        "between_steps",
        segments,
        "medium",
        "{saving} per step ({share}) of host work outside forward, backward and the optimizer is on the critical path",
        key=key,
    )


@detector
def allocator_churn(ctx: AdviceContext) -> list[Finding]:
    """Device allocator calls (cudaMalloc/cudaFree, hipMalloc/hipFree) on the path, with what they wait for."""
    runtime = kind_mask(ctx.events, {"cuda_runtime", "cuda_driver"})
    calls = runtime & ctx.names(ALLOCATOR_CALL)
    if not (calls & ctx.in_steps()).any():
        return []
    segments = ctx.segments_of(ctx.under(calls))
    count = int((calls & ctx.in_steps()).sum())
    per_step = count / max(len(ctx.steps), 1)
    found = from_path(
        ctx,
        "allocator_churn",
        segments,
        "medium",
        f"{per_step:,.0f} device allocator calls per step; {{saving}} per step ({{share}}) of them is on the critical"
        " path",
        {"calls_per_step": round(per_step, 1)},
    )
    rows = np.flatnonzero(calls & ctx.in_steps())
    ts = ctx.events["ts_ns"].to_numpy()[rows]
    spans = np.stack([ts, ts + ctx.events["dur_ns"].to_numpy()[rows]], axis=1)
    for finding in found:  # the fix: no such call at all, neither its wait nor its own time (on the path or not);
        what = finding.what_if  # the spans hold the path's host segments under the calls
        finding.what_if = WhatIf(spans, 1.0, what.gpu_rows, what.gpu_factor, rows)
    return found
