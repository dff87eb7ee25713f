"""Findings about calls that make the host wait for the GPU: synchronisations and pageable copies.

A blocking call serialises the host and the GPU: the host work after it cannot start until the GPU work before it
is done, and the GPU idles while that host work runs up to the next launch. Without the wait the two overlap, so
the saving per call is the smaller of the wait and the host time from the call's return to the next GPU activity
(cut at the step's end). The bandwidth a pinned copy gains over a pageable one is not counted.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.analysis.advice.build import material_steps, ms, share
from profparse.analysis.advice.context import AdviceContext, user_frame
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.analysis.advice.kinds import detector
from profparse.analysis.critical_path import blocking_calls
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask

ALLOCATOR_CALL = re.compile(r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|MallocAsync|FreeAsync)$|^cuMem(Alloc|Free)")
PAGEABLE_H2D = re.compile(r"HtoD.*Pageable|Pageable.*Device")
DEVICE_COPY = re.compile(r"DtoD|Device -> Device")
TOP = 5


def overlap_saving(ctx: AdviceContext, calls: np.ndarray) -> np.ndarray:
    """Per blocking call: the smaller of its wait and the host time from its return to the next GPU activity."""
    events = ctx.events
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    starts = np.sort(ts[kind_mask(events, GPU_ACTIVITY_KINDS)], kind="stable")  # timsort: nearly sorted
    starts = np.append(starts, np.iinfo(np.int64).max)  # no activity after a call (or none at all: host-only capture)
    next_start = starts[np.searchsorted(starts, end[calls])]
    step_end = ctx.steps.set_index("step")["end_ns"].reindex(ctx.parsed.attribution.step[calls]).to_numpy()
    next_start = np.minimum(next_start, step_end)
    return np.minimum(end[calls] - ts[calls], np.maximum(next_start - end[calls], 0))


def pageable_copy_calls(ctx: AdviceContext) -> np.ndarray:
    """Rows of the runtime calls that launched a host-to-device copy from pageable memory."""
    copies = np.flatnonzero(ctx.names(PAGEABLE_H2D) & kind_mask(ctx.events, {"gpu_memcpy"}))
    calls = ctx.parsed.links.launch.astype(np.int64)[copies]
    return np.unique(calls[calls >= 0])


@detector
def sync_in_step(ctx: AdviceContext) -> list[Finding]:
    """Synchronisations inside the step (not the allocator's, not pageable copies': those have their kinds)."""
    blocking, inferred = blocking_calls(ctx.events, ctx.parsed.links)
    # A call inferred from timing alone may only have waited for a full launch queue (the host ahead of the GPU,
    # which is no sync), and a device-to-device copy that returned after its copy ended is no sync either.
    blocking &= ~inferred & ~ctx.names(ALLOCATOR_CALL)
    blocking[pageable_copy_calls(ctx)] = False
    blocking[_device_copy_calls(ctx)] = False
    calls = np.flatnonzero(blocking & ctx.in_steps())
    return _finding(
        ctx,
        "sync_in_step",
        calls,
        (
            "{count} device synchronisation per step; the host work after it could overlap the GPU: {saving} per"
            " step ({share})",
            "{count} device synchronisations per step; the host work after them could overlap the GPU: {saving} per"
            " step ({share})",
        ),
        {},
    )


def _device_copy_calls(ctx: AdviceContext) -> np.ndarray:
    copies = np.flatnonzero(ctx.names(DEVICE_COPY) & kind_mask(ctx.events, {"gpu_memcpy"}))
    calls = ctx.parsed.links.launch.astype(np.int64)[copies]
    return np.unique(calls[calls >= 0])


@detector
def unpinned_copy(ctx: AdviceContext) -> list[Finding]:
    """Pageable host-to-device copies: their calls block the host until the copy is done."""
    calls = pageable_copy_calls(ctx)
    calls = calls[ctx.in_steps()[calls]]
    return _finding(
        ctx,
        "unpinned_copy",
        calls,
        (
            "{count} host-to-device copy per step from pageable memory blocks the host; with pinned memory and"
            " non_blocking=True the host work after it could overlap: {saving} per step ({share})",
            "{count} host-to-device copies per step from pageable memory block the host; with pinned memory and"
            " non_blocking=True the host work after them could overlap: {saving} per step ({share})",
        ),
        {},
    )


def _finding(ctx: AdviceContext, kind: str, calls: np.ndarray, texts: tuple[str, str], evidence: dict) -> list[Finding]:
    """``texts``: the message where the calls per step read "1", and where they read any other count."""
    if not len(calls):
        return []
    saving = overlap_saving(ctx, calls)
    call_step = ctx.parsed.attribution.step[calls]
    per_step = pd.Series(saving, index=call_step).groupby(level=0).sum().reindex(ctx.steps["step"], fill_value=0)
    mean = float(per_step.mean())
    if mean <= 0:
        return []
    events = ctx.events
    enclosing = ctx.parsed.links.enclosing_op.astype(np.int64)[calls]
    label = np.where(enclosing >= 0, ctx.name_of(np.maximum(enclosing, 0)), ctx.name_of(calls))
    top = pd.Series(saving, index=label).groupby(level=0).sum().nlargest(TOP) / len(ctx.steps) / 1e6
    count = len(calls) / len(ctx.steps)
    wait = float(events["dur_ns"].to_numpy()[calls].sum()) / len(ctx.steps)
    evidence = {
        "calls_per_step": round(count, 1),
        "wait_ms_per_step": round(wait / 1e6, 3),
        "top_events": [{"name": n, "ms_per_step": round(v, 3)} for n, v in top.items()],
        "frames": top_frames(ctx, calls),
        **evidence,
    }
    steps = material_steps(per_step)
    counted = f"{count:,.0f}"
    template = texts[counted != "1"].format(count=counted, saving="{saving}", share="{share}")
    message = template.format(saving=ms(mean), share=share(mean, ctx.step_ns))
    by_stage = pd.Series(saving, index=ctx.stage_of(calls)).groupby(level=0).sum().sort_values(ascending=False)
    stage = ",".join(str(s) for s in by_stage[by_stage >= 0.1 * by_stage.sum()].index)
    finding = Finding(kind, stage, steps, mean, ctx.step_ns, "medium", message, evidence, template=template)
    if kind == "unpinned_copy":  # (a sync_in_step keeps the path's estimate: dropping a step's last sync in the
        finding.what_if = _pinned(ctx, calls)  # replay overlaps steps, which is not what its fix does)
    return [finding]


#: host-to-device bandwidth from pinned memory the fix is taken to reach (PCIe 4.0 x16 in practice; Gen5 doubles it)
PINNED_H2D_GBPS = 25.0
#: what a non-blocking copy's call still costs the host
ASYNC_CALL_NS = 5_000


def _pinned(ctx: AdviceContext, calls: np.ndarray) -> WhatIf:
    """Pageable copies made pinned and non-blocking: the calls no longer hold the host (a pageable copy's call
    returns once its last chunk is staged, just before the copy ends, so it need not be a blocking call), and each
    copy runs at :data:`PINNED_H2D_GBPS` where that is faster."""
    events = ctx.events
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    copies = np.flatnonzero(ctx.names(PAGEABLE_H2D) & kind_mask(events, {"gpu_memcpy"}))
    copies = copies[np.isin(ctx.parsed.links.launch.astype(np.int64)[copies], calls)]
    dur = events["dur_ns"].to_numpy()[copies].astype(np.float64)
    nbytes = np.maximum(events["bytes"].to_numpy()[copies].astype(np.float64), 0)
    pinned = np.minimum(nbytes / PINNED_H2D_GBPS, dur)  # bytes / (GB/s) = ns
    factor = float(pinned.sum() / dur.sum()) if dur.sum() > 0 else 1.0
    held = np.stack([np.minimum(ts[calls] + ASYNC_CALL_NS, end[calls]), end[calls]], axis=1)
    return WhatIf(held, 1.0, copies, factor, calls)


def top_frames(ctx: AdviceContext, rows: np.ndarray, n: int = TOP) -> list[str]:
    """The user's Python frames the rows were called from, the most frequent first (empty without stacks)."""
    frames = user_frame(ctx, rows)
    counts = pd.Series(frames, dtype=object).value_counts() if frames else pd.Series(dtype=object)
    return [str(f) for f in counts.index[:n]]
