"""Stages for GPU activity whose launch is not in the trace, by inference.

Traces often begin mid-step (profiler schedules, warm-up): the GPU still runs work whose runtime call came before
the first recorded host event, so nothing links it to a CPU op (rule ``other.gpu_unlinked``). A step's GPU work
repeats in the next, so such activity gets a stage from the evidence around it, strongest first:

``gpu.sequence_match``  the activity's run of names on its stream (kernels, memcpy, memset in stream order) repeats
                        where the activity is linked. Names are taken in runs (100 ``Memcpy DtoD`` in a row are one
                        letter); windows of 64, 32, ..., 2 runs centred on, starting at or ending at the unlinked
                        event's run are looked up among the same-stream windows anchored (at the same place) at a
                        run that holds linked events, the longest first, the nearest later repetition before the
                        nearest earlier one; the event takes the stage of the linked event at its offset in the
                        matched run (or the nearest linked one in that run). Last, a single name matches when every
                        linked event of that name on the stream has one stage.
``gpu.neighbours``      between two staged events of the same stage on its stream (linked, or matched above).
``gpu.forward_only``    a kernel of a forward-only trace: some forward, no backward or optimizer stage anywhere and
                        no backward or optimizer kernel names among the unlinked.

Linked events decided by ``other.unclassified`` are no evidence. Whatever is left stays ``other.gpu_unlinked``.

Step: the step window that holds the event's estimated launch time, i.e. its GPU start minus the queueing delay
(GPU start - launch call) of the linked event it was matched to (neighbours: that of the staged event after it;
forward-only: of the next linked event on the stream, else the previous). Outside every window a sequence-matched
event belongs to the partial step the trace began or ended in: the first window's step - 1 before the first
window, the last's + 1 after the last (such steps have no row in ``steps``); in a gap, and for the other rules, it
stays outside steps. Windows found from optimizer boundaries (no ``ProfilerStep``) start at the first host event,
so the first one is open to the left.

Cost: per stream one hash per window length (doubling), two sorts per length; linear in memory, n log n in time.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.stages.rules import GPU_UNLINKED, UNCLASSIFIED
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask, track_keys

SEQUENCE_MATCH = "gpu.sequence_match"
NEIGHBOURS = "gpu.neighbours"
FORWARD_ONLY = "gpu.forward_only"
INFERENCE_RULES = (SEQUENCE_MATCH, NEIGHBOURS, FORWARD_ONLY)

_WINDOWS = (64, 32, 16, 8, 4, 2)
_BASE = 0x100000001B3  # odd multiplier of the polynomial name-window hash (mod 2**64)
# kernel names that only training runs; "lamb" but not the "lambda" of CUDA kernel names
_TRAINING_KERNEL = re.compile(r"(?i)backward|bwd|dgrad|wgrad|adam|sgd|lamb(?!da)|multi_tensor_apply|optimi[sz]er")


def infer_gpu_stages(
    events: pd.DataFrame,
    links: Links,
    steps: pd.DataFrame,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    step: np.ndarray,
) -> None:
    """Give unlinked GPU activity a stage, rule and step by inference where the evidence allows (in place)."""
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    unlinked_code = rule_names.index(GPU_UNLINKED)
    if not (activity & (rule == unlinked_code)).any():
        return
    ts_all = events["ts_ns"].to_numpy()
    rows = np.flatnonzero(activity)
    stream = track_keys(events)[0][rows]
    order = np.lexsort((ts_all[rows], stream))
    rows, stream = rows[order], stream[order]
    ts = ts_all[rows]
    names = events["name"].cat.codes.to_numpy()[rows].astype(np.int64) + 1
    query = rule[rows] == unlinked_code
    ref = ~query & (rule[rows] != rule_names.index(UNCLASSIFIED))
    cur_stage = stage[rows].astype(np.int64)
    lag = np.zeros(len(rows), dtype=np.int64)
    linked = links.launch[rows] >= 0
    lag[linked] = np.maximum(ts[linked] - ts_all[links.launch[rows[linked]]], 0)
    inferred = np.full(len(rows), -1, dtype=np.int64)  # index into INFERENCE_RULES

    # 1. sequence match, per stream
    bounds = np.flatnonzero(np.diff(stream)) + 1
    for a, b in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(rows)]]), strict=True):
        if not query[a:b].any() or not ref[a:b].any():
            continue
        match = _sequence_match(names[a:b], query[a:b], ref[a:b], cur_stage[a:b])
        hit = np.flatnonzero(match >= 0)
        cur_stage[a + hit] = cur_stage[a + match[hit]]
        lag[a + hit] = lag[a + match[hit]]
        inferred[a + hit] = 0

    # 2. neighbours: the nearest staged events before and after on the stream agree
    staged = ref | (inferred >= 0)
    left = query & (inferred < 0)
    if left.any():
        prev, nxt = _nearest_staged(staged, stream)
        ok = left & (prev >= 0) & (nxt >= 0)
        ok[ok] &= cur_stage[prev[ok]] == cur_stage[nxt[ok]]
        cur_stage[ok] = cur_stage[nxt[ok]]
        lag[ok] = lag[nxt[ok]]
        inferred[ok] = 1

    # 3. forward-only trace: the rest of the unlinked kernels are forward
    left = query & (inferred < 0) & kind_mask(events, {"kernel"})[rows]
    if left.any() and _forward_only(events, stage, rows[query]):
        prev, nxt = _nearest_staged(linked, stream)
        near = np.where(nxt >= 0, nxt, prev)
        lag[left] = np.where(near[left] >= 0, lag[np.maximum(near[left], 0)], 0)
        cur_stage[left] = STAGES.index("forward")
        inferred[left] = 2

    done = inferred >= 0
    if not done.any():
        return
    target = rows[done]
    rule[target] = np.array([rule_names.index(r) for r in INFERENCE_RULES], dtype=rule.dtype)[inferred[done]]
    stage[target] = cur_stage[done].astype(stage.dtype)
    step[target] = _step_by_time(ts[done] - lag[done], steps, inferred[done] == 0)


def _window_hashes(codes: np.ndarray) -> dict[int, np.ndarray]:
    """Hash of every window of ``k`` consecutive names, per k in 1, 2, 4, ..., ``max(_WINDOWS)``: ``h[k][p]``
    hashes ``codes[p:p+k]`` (polynomial, wrapping mod 2**64; built by doubling, so O(n log k))."""
    hashes = {1: codes.astype(np.uint64)}
    k = 1
    with np.errstate(over="ignore"):
        while 2 * k <= min(len(codes), max(_WINDOWS)):
            h = hashes[k]
            shift = np.uint64(pow(_BASE, k, 1 << 64))
            hashes[2 * k] = h[: len(h) - k] * shift + h[k:]
            k *= 2
    return hashes


def _nearest_same(h: np.ndarray, queries: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """Per query window start, the nearest later reference window start with the same hash, else the nearest
    earlier one, else -1."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(queries) or not len(refs):
        return out
    uniq, rank = np.unique(h[refs], return_inverse=True)
    span = np.int64(len(h) + 1)
    key = np.sort(rank.astype(np.int64) * span + refs)  # grouped by hash, then by position
    q_rank = np.searchsorted(uniq, h[queries])
    known = q_rank < len(uniq)
    known[known] &= uniq[q_rank[known]] == h[queries[known]]
    q_rank, q = q_rank[known].astype(np.int64), queries[known]
    at = np.searchsorted(key, q_rank * span + q, side="right")
    later = at < len(key)
    later[later] &= key[at[later]] // span == q_rank[later]
    earlier = at > 0
    earlier[earlier] &= key[at[earlier] - 1] // span == q_rank[earlier]
    pick = np.where(later, at, at - 1)
    out[np.flatnonzero(known)] = np.where(later | earlier, key[np.clip(pick, 0, len(key) - 1)] % span, -1)
    return out


def _run_match(
    codes: np.ndarray, query: np.ndarray, ref: np.ndarray, windows: tuple[int, ...] = _WINDOWS
) -> np.ndarray:
    """Per position of ``codes``, the reference position whose name windows equal its own (-1: none or no query)."""
    match = np.full(len(codes), -1, dtype=np.int64)
    hashes = _window_hashes(codes)
    todo = np.flatnonzero(query)
    for k in windows:
        if k not in hashes:
            continue
        h = hashes[k]
        # the window is centred on the position (context on both sides pins it inside a long repeat, such as an
        # optimizer's per-parameter kernels right after backward's), else starts there, else ends there
        for anchor in (k // 2, 0, k - 1):
            start = todo - anchor
            ok = (start >= 0) & (start < len(h))
            found = _nearest_same(h, start[ok], np.flatnonzero(ref[anchor : anchor + len(h)]))
            hit = found >= 0
            match[todo[ok][hit]] = found[hit] + anchor
            todo = todo[match[todo] < 0]
    return match


def _sequence_match(
    codes: np.ndarray, query: np.ndarray, ref: np.ndarray, stage: np.ndarray, min_window: int = 1
) -> np.ndarray:
    """Per event of one stream, the index of the reference event it aligns with (-1: none or not a query).

    Alignment is on runs of equal names (a run of 100 ``Memcpy DtoD`` is one letter), so that windows see past long
    repeats; an event takes the event at its offset in the matched run (clipped), or the nearest reference there.
    Only windows of at least ``min_window`` runs count (1: a single name too).
    """
    n = len(codes)
    first = np.concatenate([[True], codes[1:] != codes[:-1]])
    run_of = np.cumsum(first) - 1
    run_start = np.flatnonzero(first)
    run_len = np.diff(np.concatenate([run_start, [n]]))
    runs = len(run_start)
    run_match = _run_match(
        codes[run_start],
        np.bincount(run_of[query], minlength=runs) > 0,
        np.bincount(run_of[ref], minlength=runs) > 0,
        tuple(k for k in _WINDOWS if k >= min_window),
    )
    match = np.full(n, -1, dtype=np.int64)
    todo = np.flatnonzero(query)
    matched_run = run_match[run_of[todo]]
    ok = matched_run >= 0
    todo, matched_run = todo[ok], matched_run[ok]
    at = run_start[matched_run] + np.minimum(todo - run_start[run_of[todo]], run_len[matched_run] - 1)
    match[todo] = _nearest_in_run(ref, run_of, at)
    todo = np.flatnonzero(query & (match < 0))
    if len(todo) and min_window <= 1:  # a single name, where all its linked events on this stream have one stage
        ref_rows = np.flatnonzero(ref)
        pairs = pd.DataFrame({"name": codes[ref_rows], "stage": stage[ref_rows]}).drop_duplicates()
        counts = pairs["name"].value_counts()
        clear = counts.index[counts.to_numpy() == 1].to_numpy()
        todo = todo[np.isin(codes[todo], clear)]
        refs = ref_rows[np.isin(codes[ref_rows], clear)]
        match[todo] = _nearest_same(codes.astype(np.uint64), todo, refs)
    return match


def _nearest_in_run(ref: np.ndarray, run_of: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per position ``at``: itself if a reference, else the nearest reference in its run (later first), else -1."""
    n = len(ref)
    index = np.arange(n)
    before = np.maximum.accumulate(np.where(ref, index, -1))[at]
    after = np.minimum.accumulate(np.where(ref, index, n)[::-1])[::-1][at]
    after_ok = (after < n) & (run_of[np.minimum(after, n - 1)] == run_of[at])
    before_ok = (before >= 0) & (run_of[np.maximum(before, 0)] == run_of[at])
    use_after = after_ok & (~before_ok | (after - at <= at - before))
    return np.where(use_after, after, np.where(before_ok, before, -1))


def _nearest_staged(staged: np.ndarray, stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the nearest staged position before it and after it on the same stream (-1: none)."""
    n = len(staged)
    index = np.arange(n)
    prev = np.maximum.accumulate(np.where(staged, index, -1))
    prev = np.concatenate([[-1], prev[:-1]])
    nxt = np.minimum.accumulate(np.where(staged, index, n)[::-1])[::-1]
    nxt = np.concatenate([nxt[1:], [n]])
    prev[(prev >= 0) & (stream[np.maximum(prev, 0)] != stream)] = -1
    nxt[nxt >= n] = -1
    nxt[(nxt >= 0) & (stream[np.maximum(nxt, 0)] != stream)] = -1
    return prev, nxt


def _forward_only(events: pd.DataFrame, stage: np.ndarray, unlinked_rows: np.ndarray) -> bool:
    """Forward evidence, and none of backward or optimizer: no such stage, no such kernel name among the unlinked."""
    if not (stage == STAGES.index("forward")).any():
        return False
    if np.isin(stage, [STAGES.index("backward"), STAGES.index("optimizer")]).any():
        return False
    names = events["name"].cat.categories
    used = np.unique(events["name"].cat.codes.to_numpy()[unlinked_rows])
    return not any(_TRAINING_KERNEL.search(str(names[c])) for c in used if c >= 0)


def _step_by_time(launch_ts: np.ndarray, steps: pd.DataFrame, repeats_a_step: np.ndarray) -> np.ndarray:
    """Step of the window holding each estimated launch time; outside all windows see the module docstring."""
    out = np.full(len(launch_ts), NULL, dtype=np.int64)
    if steps.empty:
        return out
    windows = steps.sort_values("start_ns", kind="stable")
    starts, ends = windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy()
    numbers = windows["step"].to_numpy().astype(np.int64)
    if (windows["source"] == "optimizer_boundaries").all():
        starts = np.concatenate([[np.iinfo(np.int64).min], starts[1:]])  # the first such window is open to the left
    at = np.searchsorted(starts, launch_ts, side="right") - 1
    inside = at >= 0
    inside[inside] &= launch_ts[inside] < ends[at[inside]]
    out[inside] = numbers[at[inside]]
    out[repeats_a_step & (at < 0)] = numbers[0] - 1
    out[repeats_a_step & ~inside & (launch_ts >= ends.max())] = numbers[-1] + 1
    return out


def sequence_match(
    codes: np.ndarray, query: np.ndarray, ref: np.ndarray, stage: np.ndarray, min_window: int = 1
) -> np.ndarray:
    """Per event of one name sequence, the index of the reference event it aligns with (-1: none or not a query):
    the matching of ``gpu.sequence_match``, for other callers (graph-replayed kernels, stages/graph_launch); with
    ``min_window`` > 1 only windows of at least that many runs of names count (no short or single-name match)."""
    return _sequence_match(codes, query, ref, stage, min_window)
