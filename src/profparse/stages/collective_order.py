"""Stages for collective kernels launched before the trace began, from their place in the stream's sequence.

A profiler that starts mid-run (a schedule's warm-up, a late ``start()``) finds the GPU still running collective
kernels whose launch, and the ``record_param_comms`` op that issued them, came before its first event: neither the
correlation nor :mod:`profparse.stages.collective_match` can place them. Their names (``ncclKernel_SendRecv``,
``ncclDevKernel_Generic``) repeat within a step, so ``gpu.sequence_match`` cannot either. But a training step issues
the same collectives in the same order on the same stream every step, so such a kernel is placed by position:

``gpu.collective_order``       per stream, the collective kernels in GPU order; a step's collective sequence has
                               the most common length ``n`` among the steps' placed kernels. A run of unplaced
                               kernels just before a placed one, whose step holds ``m`` placed kernels from that one
                               on (the tail of its sequence), sits at positions ``n - m - 1``, ``n - m - 2``, ...;
                               below 0 it wraps into the step before. The kernel takes the stage of the kernel at
                               that position in the first step from the placed one's on holding ``n`` placed ones
                               (after it, for a run before every placed kernel that does not start before that
                               step's ``ProfilerStep`` window: the trace may have begun inside that step), when their
                               names agree, and the step it sits in (the step before the first window has no row).
``gpu.collective_neighbours``  else the stage of the staged GPU work that overlaps it most on the device's other
                               streams (the compute it runs beside), and that work's step.

Both run after :mod:`profparse.stages.collective_match` and before :mod:`profparse.stages.gpu_inference`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.stages.rules import (
    COLLECTIVE_KERNEL,
    COLLECTIVE_NEIGHBOURS,
    COLLECTIVE_ORDER,
    GPU_UNLINKED,
    UNCLASSIFIED,
)
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask, name_mask, track_keys

ORDER_RULE_NAMES = (COLLECTIVE_ORDER, COLLECTIVE_NEIGHBOURS)


def order_collectives(
    events: pd.DataFrame,
    links: Links,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    step: np.ndarray,
    steps: pd.DataFrame,
) -> None:
    """Give collective kernels still unlinked a stage, rule and step by their place in the stream's collective
    sequence, else by the work beside them on other streams (in place). ``steps``: the step windows."""
    unlinked = rule_names.index(GPU_UNLINKED)
    comm = name_mask(events, COLLECTIVE_KERNEL) & kind_mask(events, {"kernel"})
    if not (comm & (rule == unlinked)).any():
        return
    placed = ~np.isin(rule, [unlinked, rule_names.index(UNCLASSIFIED)])
    streams = track_keys(events)[0]
    ts = events["ts_ns"].to_numpy()
    rows = np.flatnonzero(comm)
    rows = rows[np.lexsort((ts[rows], streams[rows]))]
    names = events["name"].cat.codes.to_numpy()
    code = rule_names.index(COLLECTIVE_ORDER)
    bounds = np.flatnonzero(np.diff(streams[rows])) + 1
    real = steps[steps["source"] == "ProfilerStep"] if len(steps) else steps
    starts = (
        dict(zip(real["step"].astype(np.int64), real["start_ns"].astype(np.int64), strict=True)) if len(real) else {}
    )
    for part in np.split(rows, bounds):
        if (rule[part] == unlinked).any() and placed[part].any():
            found, found_step = _by_position(names[part], stage[part], step[part], placed[part], ts[part], starts)
            hit = (found >= 0) & (rule[part] == unlinked)  # a linked kernel decided by no rule keeps its launch
            rule[part[hit]], stage[part[hit]], step[part[hit]] = code, found[hit], found_step[hit]
    left = np.flatnonzero(comm & (rule == unlinked))
    if len(left):
        _by_neighbours(events, streams, left, placed, rule, stage, step, rule_names.index(COLLECTIVE_NEIGHBOURS))


def _by_position(
    names: np.ndarray,
    stage: np.ndarray,
    step: np.ndarray,
    placed: np.ndarray,
    ts: np.ndarray,
    starts: dict[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """One stream's collective kernels in GPU order: per kernel the stage and step its position gives (-1: none).
    ``starts``: the start of each ``ProfilerStep`` window by step number."""
    found = np.full(len(names), -1, dtype=np.int64)
    found_step = np.full(len(names), NULL, dtype=np.int64)
    known = np.flatnonzero(placed)
    counts = pd.Series(step[known]).value_counts(sort=False)  # placed kernels per step (NULL: before the windows)
    numbered = counts[counts.index != NULL]
    if numbered.empty:
        return found, found_step
    n = int(numbered.value_counts().idxmax())  # a step's collective sequence: its most common length
    for first in np.flatnonzero(~placed & np.concatenate([[True], placed[:-1]])):  # each run of unplaced kernels
        after = known[known > first]
        if not len(after):
            continue
        nxt = int(after[0])
        group = int(step[nxt])
        # a run before every placed kernel may hold the head of the next one's step (the trace began inside it),
        # which then may be partial: the pattern comes from a later step, unless the run started before that step
        own = bool(known[0] < first) or ts[first] < starts.get(group, np.iinfo(np.int64).min)
        pattern = _pattern(known, step, n, nxt, own)
        tail = int(np.count_nonzero(step[after] == group))  # the step's placed kernels from the next one on
        if pattern is None or tail > n:
            continue
        for i in range(nxt - 1, first - 1, -1):
            p = n - tail - (nxt - i)  # its position in its step's sequence (< 0: the step before)
            at = int(pattern[p % n])
            if names[at] == names[i]:
                found[i] = stage[at]
                found_step[i] = group if p >= 0 else (group - 1 - (-p - 1) // n if group != NULL else NULL)
    return found, found_step


def _pattern(known: np.ndarray, step: np.ndarray, n: int, start: int, own: bool) -> np.ndarray | None:
    """The positions (into the stream) of the first step from the one of ``start`` on (after it unless ``own``)
    whose placed kernels number ``n``."""
    later = known[known >= start]
    steps = step[later]
    for s in pd.unique(steps[(steps != NULL) & (own | (steps != step[start]))]):
        members = later[steps == s]
        if len(members) == n:
            return members
    return None


def _by_neighbours(
    events: pd.DataFrame,
    streams: np.ndarray,
    left: np.ndarray,
    placed: np.ndarray,
    rule: np.ndarray,
    stage: np.ndarray,
    step: np.ndarray,
    code: int,
) -> None:
    """Each kernel of ``left`` takes the stage (and step) of the placed GPU work on the same device's other streams
    that overlaps it longest."""
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    pid = events["pid"].to_numpy()
    others = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS) & placed)
    others = others[np.argsort(ts[others], kind="stable")]
    longest = int((end[others] - ts[others]).max()) if len(others) else 0
    for row in left:
        lo = np.searchsorted(ts[others], ts[row] - longest)
        hi = np.searchsorted(ts[others], end[row], side="left")
        near = others[lo:hi]
        near = near[(pid[near] == pid[row]) & (streams[near] != streams[row]) & (end[near] > ts[row])]
        if not len(near):
            continue
        overlap = np.minimum(end[near], end[row]) - np.maximum(ts[near], ts[row])
        by_stage = pd.Series(overlap).groupby(stage[near]).sum()
        best = by_stage.idxmax()
        rule[row], stage[row] = code, best
        pick = near[stage[near] == best]
        step[row] = step[pick[np.argmax(overlap[stage[near] == best])]]


__all__ = ["ORDER_RULE_NAMES", "order_collectives"]
