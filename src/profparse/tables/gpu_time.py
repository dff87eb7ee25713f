"""GPU time: busy per stage, overlap between stages, and idle gaps charged to the work that ends them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.base.arrays import factorize_rows
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import kind_mask


@dataclass
class GpuTime:
    """Per (step, device) group: ``span`` (first start to last end of the step's GPU activity on the device) and per
    (group, stage) ``busy``, ``overlap`` and ``idle`` (flat arrays of ``groups * len(STAGES)``); for every group,
    the stages' busy + overlap + idle add up to its span exactly."""

    step: np.ndarray  # per group: step number (NULL: activity outside every step)
    device: np.ndarray  # per group: device id (the GPU pid where the event has no device)
    span: np.ndarray
    busy: np.ndarray
    overlap: np.ndarray
    idle: np.ndarray


def gpu_time(events: pd.DataFrame, attribution: Attribution) -> GpuTime:
    """Split each step's GPU span on each device into busy time per stage, overlap and idle gaps.

    - busy: time when the device runs work of this stage only (any number of streams);
    - overlap: time when it runs work of two or more stages at once, charged to the stage that was running alone
      just before (the work the other stage joined); when they start together, to the first of them in the order
      load, forward, backward, optimizer, other;
    - idle: gaps inside the span with no activity, each charged to the stage of the work that ends the gap (what
      the GPU waited for; on a tie, the first stage in that order).

    A step's GPU activity is the activity launched inside it (``attribution.step``); activity outside every step is
    grouped by the gap between steps it runs in, so no span reaches over a step.
    """
    n_stages = len(STAGES)
    rows = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    ts = events["ts_ns"].to_numpy()[rows]
    dur = events["dur_ns"].to_numpy()[rows]
    stage = attribution.stage[rows].astype(np.int64)
    device = events["device"].to_numpy()[rows]
    device = np.where(device == NULL, events["pid"].to_numpy()[rows], device)
    step = attribution.step[rows]
    steps = attribution.steps
    gap = np.searchsorted(steps["start_ns"].to_numpy(), ts, side="right") if not steps.empty else np.zeros_like(ts)
    outside = np.where(step == NULL, gap, -1)  # activity outside every step: grouped by the gap it runs in
    group, (step_of_group, _, device_of_group) = factorize_rows(step, outside, device, sort=True)
    step_of_group, device_of_group = step_of_group.astype(np.int64), device_of_group.astype(np.int64)
    groups = len(step_of_group)
    busy = np.zeros(groups * n_stages, dtype=np.int64)
    overlap = np.zeros_like(busy)
    idle = np.zeros_like(busy)
    span = np.zeros(groups, dtype=np.int64)
    if groups:
        span = _split_gpu_span(group.astype(np.int64), ts, ts + dur, stage, busy, overlap, idle)
    return GpuTime(step=step_of_group, device=device_of_group, span=span, busy=busy, overlap=overlap, idle=idle)


def _split_gpu_span(
    group: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    stage: np.ndarray,
    busy: np.ndarray,
    overlap: np.ndarray,
    idle: np.ndarray,
) -> np.ndarray:
    """The sweep behind :func:`gpu_time`: adds each elementary segment between consecutive start/end points of a
    group to ``busy``/``overlap``/``idle`` at ``group * n_stages + charged stage`` (in place). Returns each group's
    span (first start to last end), read off the sorted points instead of ``np.minimum.at``/``np.maximum.at``
    over every event."""
    n_stages = len(STAGES)
    m = len(start)
    pg = np.concatenate([group, group])
    pt = np.concatenate([start, end])
    is_end = np.concatenate([np.zeros(m, dtype=np.int8), np.ones(m, dtype=np.int8)])
    ps = np.concatenate([stage, stage])
    order = np.lexsort((ps, is_end, pt, pg))  # at one instant, starts before ends, then pipeline order
    pg, pt, is_end, ps = pg[order], pt[order], is_end[order], ps[order]
    del order
    delta = np.where(is_end == 1, -1, 1).astype(np.int32)
    mask = np.zeros(len(pt), dtype=np.int16)  # bit s: stage s is running just after this point
    lowest = np.full(len(pt), -1, dtype=np.int64)
    for s in range(n_stages - 1, -1, -1):
        running = np.cumsum(np.where(ps == s, delta, 0)) > 0  # groups sum to zero, so counts restart per group
        mask |= running.astype(np.int16) << s
        lowest[running] = s
    n_running = np.zeros(len(pt), dtype=np.int8)
    for s in range(n_stages):
        n_running += (mask >> s) & 1
    same_group = np.concatenate([pg[1:] == pg[:-1], [False]])
    length = np.where(same_group, np.concatenate([pt[1:] - pt[:-1], [0]]), 0)
    alone = n_running == 1
    gap = n_running == 0
    # overlap: the stage last running alone in this group, if it is still running; else the lowest running stage
    group_start = np.concatenate([[True], pg[1:] != pg[:-1]])
    anchor = np.where(alone | gap | group_start, np.arange(len(pt)), 0)
    anchor = np.maximum.accumulate(anchor)
    before = np.where(alone[anchor], lowest[anchor], -1)
    still = (before >= 0) & (((mask >> np.maximum(before, 0)) & 1) == 1)
    charged_overlap = np.where(still, before, lowest)
    # an idle segment is followed by a start point in the same group (ends sort after starts at an instant)
    next_stage = np.concatenate([ps[1:], [0]])
    key = pg * n_stages
    sel = alone & (length > 0)
    busy += np.bincount(key[sel] + lowest[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    sel = (n_running >= 2) & (length > 0)
    overlap += np.bincount(key[sel] + charged_overlap[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    sel = gap & (length > 0)
    idle += np.bincount(key[sel] + next_stage[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    span = np.zeros(len(busy) // n_stages, dtype=np.int64)
    heads = np.flatnonzero(group_start)  # sorted by time within a group: its first point starts earliest, its last
    tails = np.concatenate([heads[1:], [len(pt)]]) - 1  # ends latest (no activity ends before it starts)
    span[pg[heads]] = pt[tails] - pt[heads]
    return span
