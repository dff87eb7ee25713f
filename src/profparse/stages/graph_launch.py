"""Stages for GPU activity replayed by a CUDA / HIP graph launch.

One ``cudaGraphLaunch`` / ``hipGraphLaunch`` replays every node of a graph, and every kernel it runs carries that
one call's correlation id: by host nesting all of them would take the launch call's stage (a whole training step
captured as one graph would be all forward, or all "other"). Each replayed activity is staged from the strongest
evidence the trace holds, with a rule of its own (``GRAPH_RULES`` in :mod:`profparse.stages.rules`):

``gpu.graph_capture``   the graph's capture is in the trace: the runtime launches (kernel launches, copies, sets)
                        made between ``StreamBeginCapture`` and ``StreamEndCapture`` in that process, on any of its
                        threads, that ran nothing on the GPU. A replay of k activities maps onto a capture with k
                        such launches (the latest one that ended before the replay, else the nearest one after
                        it): its i-th activity in GPU start order takes the stage of the capture's i-th launch.
                        Launches decided by ``other.unclassified`` are no evidence.
``gpu.graph_launch_op`` the launch call lies in an op whose stage rests on positive evidence (a first-pass rule
                        that names a stage: ``CompiledFunction`` / ``CompiledFunctionBackward``, an autograd engine
                        node, ``Optimizer.step``, a user's mark) and the graph does not span stages: that stage. A
                        graph spans stages when windows of at least ``GRAPH_SPAN_WINDOW`` runs of its names align
                        with eager activity of two or more stages (a whole training step captured as one graph).
``gpu.graph_sequence``  the activity's run of names repeats among eagerly launched activity of its device (warm-up
                        or eager steps): ``gpu.sequence_match``'s window matching over the device's streams laid end
                        to end (a separator between streams, so that no window spans two).
``gpu.graph_launch``    else the stage of the graph launch call itself.

Step: always the launch call's step, the replay's (never the capture's or the eager match's). The launch latency
of a replayed activity (GPU start minus the one launch call's start) measures the graph's position in the replay,
not a launch: :mod:`profparse.analysis.levels` leaves graph activity out of the latency figures and counts it apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.stages.gpu_inference import sequence_match
from profparse.stages.rules import (
    GPU_UNLINKED,
    GRAPH_CAPTURE_BEGIN,
    GRAPH_CAPTURE_END,
    GRAPH_LAUNCH,
    GRAPH_NODE_CALL,
    GRAPH_RULES,
    GRAPH_SPAN_SHARE,
    GRAPH_SPAN_WINDOW,
    UNCLASSIFIED,
)
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask, name_mask, track_keys

GRAPH_RULE_NAMES = tuple(r.name for r in GRAPH_RULES)
CAPTURE, SEQUENCE, LAUNCH, LAUNCH_OP = range(4)  # indexes into GRAPH_RULES


def graph_replayed(events: pd.DataFrame, links: Links) -> np.ndarray:
    """Per row: GPU activity whose launching runtime call is a graph launch."""
    out = np.zeros(len(events), dtype=bool)
    rows = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS) & (links.launch >= 0))
    if len(rows):
        out[rows] = name_mask(events, GRAPH_LAUNCH)[links.launch[rows]]
    return out


def graph_rule_mask(rule: np.ndarray, rule_names: list[str]) -> np.ndarray:
    """Per row: decided by one of the graph rules, i.e. GPU activity replayed by a graph launch."""
    codes = [rule_names.index(name) for name in GRAPH_RULE_NAMES if name in rule_names]
    return np.isin(rule, codes)


def stage_graph_kernels(
    events: pd.DataFrame,
    links: Links,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    evidence_rules: frozenset[str] = frozenset(),
) -> None:
    """Give GPU activity replayed by a graph launch its stage and graph rule (in place); its step stays the launch
    call's. ``rule`` and ``stage`` hold the host attribution (replayed activity: its launch call's);
    ``evidence_rules`` names the host rules whose stage is positive evidence (``gpu.graph_launch_op``)."""
    replayed = graph_replayed(events, links)
    if not replayed.any():
        return
    rows = np.flatnonzero(replayed)
    new_stage = stage[rows].astype(np.int64)
    decided = np.full(len(rows), LAUNCH, dtype=np.int64)
    captured = _capture_stages(events, links, rule_names, rule, stage, rows)
    hit = captured >= 0
    new_stage[hit], decided[hit] = captured[hit], CAPTURE
    if not hit.all():
        left = np.flatnonzero(~hit)
        matched = _sequence_stages(events, links, rule_names, rule, stage, rows[left])
        strong = _sequence_stages(events, links, rule_names, rule, stage, rows[left], GRAPH_SPAN_WINDOW)
        codes = [rule_names.index(name) for name in evidence_rules if name in rule_names]
        backed = np.isin(rule[rows[left]], codes) & ~_spans_stages(links.launch[rows[left]], strong)
        decided[left[backed]] = LAUNCH_OP
        found = (matched >= 0) & ~backed
        new_stage[left[found]], decided[left[found]] = matched[found], SEQUENCE
    codes = np.array([rule_names.index(name) for name in GRAPH_RULE_NAMES], dtype=rule.dtype)
    rule[rows] = codes[decided]
    stage[rows] = new_stage.astype(stage.dtype)


def _spans_stages(launch: np.ndarray, strong: np.ndarray) -> np.ndarray:
    """Per replayed activity: its graph (one launch call) spans stages, i.e. its long-window matches (``strong``,
    -1: none) name two or more stages, each for at least 2 activities and ``GRAPH_SPAN_SHARE`` of them."""
    frame = pd.DataFrame({"launch": launch, "stage": strong})
    frame = frame[frame["stage"] >= 0]
    if frame.empty:
        return np.zeros(len(launch), dtype=bool)
    counts = frame.groupby(["launch", "stage"]).size()
    totals = counts.groupby(level="launch").transform("sum")
    clear = counts[(counts >= 2) & (counts >= GRAPH_SPAN_SHARE * totals)]
    stages = clear.groupby(level="launch").size()
    spanning = stages.index[stages.to_numpy() >= 2].to_numpy()
    return np.isin(launch, spanning)


def _capture_windows(events: pd.DataFrame, links: Links) -> pd.DataFrame:
    """One row per capture (pid, start_ns, end_ns): each ``StreamBeginCapture`` call with the first
    ``StreamEndCapture`` call after it on the same thread."""
    runtime = kind_mask(events, RUNTIME_KINDS) & links.host
    ts = events["ts_ns"].to_numpy()
    begins = np.flatnonzero(runtime & name_mask(events, GRAPH_CAPTURE_BEGIN))
    ends = np.flatnonzero(runtime & name_mask(events, GRAPH_CAPTURE_END))
    empty = pd.DataFrame({"pid": [], "start_ns": [], "end_ns": []}, dtype=np.int64)
    if not len(begins) or not len(ends):
        return empty
    span = np.int64(max(int(ts.max()) - int(ts.min()), 0) + 1)
    t0 = int(ts.min())
    end_key = links.thread[ends].astype(np.int64) * span + (ts[ends] - t0)
    order = np.argsort(end_key, kind="stable")
    end_key, ends = end_key[order], ends[order]
    at = np.searchsorted(end_key, links.thread[begins].astype(np.int64) * span + (ts[begins] - t0))
    ok = at < len(ends)
    ok[ok] &= links.thread[ends[np.minimum(at[ok], len(ends) - 1)]] == links.thread[begins[ok]]
    begins, closing = begins[ok], ends[at[ok]]
    windows = pd.DataFrame(
        {
            "pid": events["pid"].to_numpy()[begins].astype(np.int64),
            "start_ns": ts[begins],
            "end_ns": ts[closing] + events["dur_ns"].to_numpy()[closing],
        }
    )
    return windows.sort_values(["pid", "start_ns"], kind="stable", ignore_index=True)


def _captured_launches(events: pd.DataFrame, links: Links, windows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The launches recorded inside each capture window that ran nothing on the GPU (graph nodes, not work): their
    rows and capture numbers (rows of ``windows``), ordered by capture, then time."""
    corr = events["correlation"].to_numpy()
    activity = kind_mask(events, GPU_ACTIVITY_KINDS) & (corr != NULL)
    candidates = kind_mask(events, RUNTIME_KINDS) & links.host & (corr != NULL)
    candidates &= name_mask(events, GRAPH_NODE_CALL) & ~name_mask(events, GRAPH_LAUNCH)
    rows = np.flatnonzero(candidates)
    rows = rows[~np.isin(corr[rows], corr[activity])]
    ts = events["ts_ns"].to_numpy()
    pid = events["pid"].to_numpy()
    capture = np.full(len(rows), -1, dtype=np.int64)
    for p, group in windows.groupby("pid", sort=False):  # one pass per process holding captures
        here = np.flatnonzero(pid[rows] == p)
        at = np.searchsorted(group["start_ns"].to_numpy(), ts[rows[here]], side="right") - 1
        inside = at >= 0
        inside[inside] &= ts[rows[here[inside]]] <= group["end_ns"].to_numpy()[at[inside]]
        capture[here[inside]] = group.index.to_numpy()[at[inside]]
    keep = capture >= 0
    rows, capture = rows[keep], capture[keep]
    order = np.lexsort((rows, ts[rows], capture))
    return rows[order], capture[order]


def _capture_stages(
    events: pd.DataFrame,
    links: Links,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    rows: np.ndarray,
) -> np.ndarray:
    """Per replayed activity of ``rows``, the stage of its launch in the graph's capture (-1: no capture fits)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    windows = _capture_windows(events, links)
    if windows.empty:
        return out
    captured, capture = _captured_launches(events, links, windows)
    sizes = np.bincount(capture, minlength=len(windows))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    evidence = np.where(rule[captured] == rule_names.index(UNCLASSIFIED), -1, stage[captured].astype(np.int64))
    ts = events["ts_ns"].to_numpy()
    launch = links.launch[rows].astype(np.int64)
    order = np.lexsort((rows, ts[rows], launch))  # by launch call, then GPU start
    by_launch = launch[order]
    first = np.concatenate([[True], by_launch[1:] != by_launch[:-1]])
    group = np.cumsum(first) - 1
    position = np.arange(len(order)) - np.flatnonzero(first)[group]
    calls = by_launch[first]
    count = np.bincount(group)
    call_pid = events["pid"].to_numpy()[calls].astype(np.int64)
    chosen = np.full(len(calls), -1, dtype=np.int64)
    starts, ends, pids = (windows[c].to_numpy() for c in ("start_ns", "end_ns", "pid"))
    # later assignments win: first the nearest capture after the replay, then the latest one before it
    for c in np.argsort(-starts, kind="stable"):
        chosen[(count == sizes[c]) & (call_pid == pids[c]) & (ts[calls] < starts[c])] = c
    for c in np.argsort(ends, kind="stable"):
        chosen[(count == sizes[c]) & (call_pid == pids[c]) & (ts[calls] >= ends[c])] = c
    took = chosen[group] >= 0
    picked = np.full(len(order), -1, dtype=np.int64)
    picked[took] = evidence[offsets[chosen[group[took]]] + position[took]]
    out[order] = picked
    return out


def _sequence_stages(
    events: pd.DataFrame,
    links: Links,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    query_rows: np.ndarray,
    min_window: int = 1,
) -> np.ndarray:
    """Per row of ``query_rows``, the stage of the eagerly launched activity it aligns with by name sequence on its
    device (-1: none); ``min_window``: only windows of at least that many runs of names count."""
    activity = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    is_query = np.zeros(len(events), dtype=bool)
    is_query[query_rows] = True
    replayed = graph_replayed(events, links)
    not_evidence = np.isin(rule, [rule_names.index(UNCLASSIFIED), rule_names.index(GPU_UNLINKED)])
    is_ref = (links.launch >= 0) & ~replayed & ~not_evidence
    stream = track_keys(events)[0][activity]
    device = events["pid"].to_numpy()[activity]
    ts = events["ts_ns"].to_numpy()[activity]
    order = np.lexsort((activity, ts, stream))
    rows, stream, device = activity[order], stream[order], device[order]
    out = np.full(len(events), -1, dtype=np.int64)
    names = events["name"].cat.codes.to_numpy()[rows].astype(np.int64) + 1
    for d in pd.unique(device):  # the device's streams end to end, a separator name of its own between two
        part = np.flatnonzero(device == d)
        if not is_query[rows[part]].any() or not is_ref[rows[part]].any():
            continue
        new_stream = np.concatenate([[False], stream[part][1:] != stream[part][:-1]])
        at = np.arange(len(part)) + np.cumsum(new_stream)
        size = len(part) + int(new_stream.sum())
        codes = np.int64(names.max() + 1) + np.arange(size, dtype=np.int64)  # separators: each a name of its own
        codes[at] = names[part]
        query, ref, staged = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool), np.zeros(size, dtype=np.int64)
        query[at], ref[at] = is_query[rows[part]], is_ref[rows[part]]
        staged[at] = stage[rows[part]]
        back = np.full(size, -1, dtype=np.int64)
        back[at] = rows[part]
        match = sequence_match(codes, query, ref, staged, min_window)
        hit = np.flatnonzero(match >= 0)
        out[back[hit]] = stage[back[match[hit]]]
    return out[query_rows]


__all__ = ["GRAPH_RULE_NAMES", "graph_replayed", "graph_rule_mask", "stage_graph_kernels"]
