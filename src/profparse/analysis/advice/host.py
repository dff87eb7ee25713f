"""Findings about the host: waiting for data, work between steps, synchronisations, allocator calls."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.analysis.advice.build import from_path, ms, share
from profparse.analysis.advice.context import AdviceContext, user_frame
from profparse.analysis.advice.finding import Finding
from profparse.analysis.critical_path import blocking_calls
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask

SINGLE_PROCESS_LOADER = re.compile(r"_SingleProcessDataLoaderIter")
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
ALLOCATOR_CALL = re.compile(r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|MallocAsync|FreeAsync)$|^cuMem(Alloc|Free)")
LAUNCH_CALL = re.compile(r"Launch")
_HOST_BOUNDS = ("python", "cpu_op", "launch", "sync_wait")


def data_loading(ctx: AdviceContext) -> list[Finding]:
    """The host waits for the next batch on the path (segments bound ``data``)."""
    segments = (ctx.path["bound"] == "data").to_numpy()
    single = bool((ctx.names(SINGLE_PROCESS_LOADER) & ctx.in_steps()).any())
    where = " in the main process (DataLoader num_workers=0)" if single else ""
    return from_path(
        ctx,
        "data_loading",
        segments,
        "high",
        "the step waits {saving} ({share} of the step) for its next batch" + where,
        {"single_process_loader": single},
    )


def between_steps(ctx: AdviceContext) -> list[Finding]:
    """Host work of stage ``other`` on the path that is not data loading: logging, metrics, checkpoints."""
    path = ctx.path
    if not path["stage"].isin(("forward", "backward", "optimizer")).any():
        return []  # not a training step: nothing is "between" stages
    segments = (path["stage"] == "other").to_numpy() & path["bound"].isin(_HOST_BOUNDS).to_numpy()
    links = ctx.parsed.links
    parent = links.parent.astype(np.int64)
    step_rows = ctx.names(PROFILER_STEP)
    top_level = np.zeros(len(parent), dtype=bool)
    has = parent >= 0
    top_level[has] = step_rows[parent[has]]
    owner = ctx.owner(top_level)
    rows = ctx.segment_rows
    key = np.where(rows >= 0, owner[np.maximum(rows, 0)], -1)
    return from_path(
        ctx,
        "between_steps",
        segments,
        "medium",
        "{saving} per step ({share}) of host work outside forward, backward and the optimizer is on the critical path",
        key=key,
    )


def sync_in_step(ctx: AdviceContext) -> list[Finding]:
    """Blocking calls inside the step (other than the allocator's): each makes the host wait for the GPU, so the
    host work after it cannot overlap the GPU work before it. Removing the sync saves, per call, the smaller of
    the two: the wait, and the host time from its return to the next GPU activity (the GPU idles meanwhile)."""
    events = ctx.events
    blocking, inferred = blocking_calls(events, ctx.parsed.links)
    # a launch "waits" when the launch queue is full: the host is ahead of the GPU, which is no sync
    blocking &= ~(inferred & ctx.names(LAUNCH_CALL))
    calls = np.flatnonzero(blocking & ctx.in_steps() & ~ctx.names(ALLOCATOR_CALL))
    if not len(calls):
        return []
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    gpu = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    starts = np.sort(ts[gpu])
    step_end = ctx.steps.set_index("step")["end_ns"]
    call_step = ctx.parsed.attribution.step[calls]
    nxt = np.searchsorted(starts, end[calls])
    next_start = np.where(nxt < len(starts), starts[np.minimum(nxt, len(starts) - 1)], np.iinfo(np.int64).max)
    next_start = np.minimum(next_start, step_end.reindex(call_step).to_numpy())
    saving = np.minimum(end[calls] - ts[calls], np.maximum(next_start - end[calls], 0))
    per_step = pd.Series(saving, index=call_step).groupby(level=0).sum().reindex(ctx.steps["step"], fill_value=0)
    mean = float(per_step.mean())
    if mean <= 0:
        return []
    enclosing = ctx.parsed.links.enclosing_op.astype(np.int64)[calls]
    names = events["name"].astype(str).to_numpy()
    label = np.where(enclosing >= 0, names[np.maximum(enclosing, 0)], names[calls])
    top = pd.Series(saving, index=label).groupby(level=0).sum().nlargest(5) / len(ctx.steps) / 1e6
    count = len(calls) / len(ctx.steps)
    evidence = {
        "syncs_per_step": round(count, 1),
        "inferred_from_timing": bool(inferred[calls].any()),
        "wait_ms_per_step": round(float((end[calls] - ts[calls]).sum()) / len(ctx.steps) / 1e6, 3),
        "top_events": [{"name": n, "ms_per_step": round(v, 3)} for n, v in top.items()],
        "frames": _top_frames(ctx, calls),
    }
    steps = [int(s) for s, v in per_step.items() if v > 0]
    text = (
        f"{count:,.0f} device synchronisations per step; the host work after them could overlap the GPU:"
        f" {ms(mean)} per step ({share(mean, ctx.step_ns)})"
    )
    stage = ",".join(pd.Series(saving, index=ctx.stage_of(calls)).groupby(level=0).sum().sort_values().index[::-1])
    return [Finding("sync_in_step", stage, steps, mean, ctx.step_ns, "medium", text, evidence)]


def allocator_churn(ctx: AdviceContext) -> list[Finding]:
    """Device allocator calls (cudaMalloc/cudaFree, hipMalloc/hipFree) on the path, with what they wait for."""
    runtime = kind_mask(ctx.events, {"cuda_runtime", "cuda_driver"})
    calls = runtime & ctx.names(ALLOCATOR_CALL)
    if not (calls & ctx.in_steps()).any():
        return []
    segments = ctx.segments_of(ctx.under(calls))
    count = int((calls & ctx.in_steps()).sum())
    per_step = count / max(len(ctx.steps), 1)
    return from_path(
        ctx,
        "allocator_churn",
        segments,
        "medium",
        f"{per_step:,.0f} device allocator calls per step; {{saving}} per step ({{share}}) of them is on the critical"
        " path",
        {"calls_per_step": round(per_step, 1)},
    )


def _top_frames(ctx: AdviceContext, rows: np.ndarray, n: int = 5) -> list[str]:
    frames = user_frame(ctx, rows)
    if not frames:
        return []
    counts: dict[str, int] = {}
    for frame in frames:
        counts[frame] = counts.get(frame, 0) + 1
    return [f for f, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:n]]
