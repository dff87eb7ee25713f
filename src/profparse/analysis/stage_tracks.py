"""Stage tracks: on every host thread and GPU stream, consecutive events of the same stage (and step) merged into
intervals, and the loading sub-steps merged likewise. The timeline view draws them and the annotated trace
(:mod:`profparse.outputs.perfetto`) writes them as Perfetto tracks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.arrays import factorize_rows
from profparse.base.intervals import clip_disjoint, union_length
from profparse.base.marks import STAGES
from profparse.stages.attribute import STEP_NAME
from profparse.tables.host_time import HOST_SPAN_KINDS, mixed_containers
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import kind_mask, name_mask

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

_STREAM_NAME = re.compile(r"^\s*stream\s+(\S+)\s*$")


@dataclass
class StageTracks:
    """``tracks``: one row per host thread / GPU stream; ``intervals``: merged same-stage spans on them."""

    tracks: pd.DataFrame  # track, kind (host|gpu), pid, tid, label, events, busy_ns, order
    intervals: pd.DataFrame  # track, start_ns, end_ns, stage, rule, step, events, busy_ns


def _track_label(raw: Any, pid: int, tid: int, kind: str, device: int | None, stream: int | None) -> str:
    thread = raw.thread_names.get((pid, tid)) or raw.tid_labels.get(tid)
    if kind == "gpu":
        dev = device if device is not None else (pid if pid >= 0 else None)
        if stream is None and thread:
            found = _STREAM_NAME.match(thread)
            stream = found.group(1) if found else None
        where = f"GPU {dev}" if dev is not None else "GPU"
        return f"{where} stream {stream}" if stream is not None else f"{where} {thread or tid}"
    if thread:
        return thread.strip()
    return f"pid {raw.pid_labels.get(pid, pid)} tid {raw.tid_labels.get(tid, tid)}"


def _segments(
    track: np.ndarray, s: np.ndarray, e: np.ndarray, keys: tuple[np.ndarray, ...], gap_ns: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by (track, start) -> (first row of each segment, segment id per row).

    A new segment starts on a new track, when any of ``keys`` changes, or (``gap_ns`` given) after a gap longer
    than ``gap_ns`` since everything before it on the track ended.
    """
    n = len(track)
    new = np.ones(n, dtype=bool)
    new[1:] = track[1:] != track[:-1]
    for key in keys:
        new[1:] |= key[1:] != key[:-1]
    if gap_ns is not None and n:
        base = int(s.min())
        span = int(e.max() - base) + 1
        reach = np.maximum.accumulate((e - base) + track * span) - track * span + base
        new[1:] |= (s[1:] - reach[:-1]) > gap_ns
    return np.flatnonzero(new), np.cumsum(new) - 1


def stage_intervals(
    parsed: ParsedTrace, *, gap_ns: int | None = None, split_steps: bool = True, disjoint: bool = False
) -> StageTracks:
    """Merge consecutive same-stage events on each host thread and GPU stream into intervals.

    Host events are the spans that hold one stage only (containers like ``ProfilerStep#N`` that hold several
    stages are left out, their children are used); GPU events are kernels, memcpy and memset. Consecutive events
    of a track merge while the stage (and, with ``split_steps``, the step) stays the same and, when ``gap_ns`` is
    given, while the gap between them is at most ``gap_ns``. Each interval keeps the rule that decided most of
    its time, its step (``NULL`` outside steps), how many events it merges and the time they cover (``busy_ns``).

    Spans of different stages can overlap on one thread (Python frames and ops are timed separately). With
    ``disjoint`` each interval starts no earlier than the end of the ones before it on its track (an interval
    left empty is dropped), so the intervals of a track never overlap while covering the same time.
    """
    events = parsed.raw.events
    attribution = parsed.attribution
    rows, gpu, ts, end = _activity_rows(parsed)
    empty_tracks = pd.DataFrame(
        {c: pd.Series(dtype=t) for c, t in _TRACK_DTYPES.items()},
    )
    if len(rows) == 0:
        return StageTracks(empty_tracks, _empty_intervals(attribution.rule_names))

    pid = events["pid"].to_numpy()[rows]
    tid = events["tid"].to_numpy()[rows]
    track, uniques = _factorize_pairs(pid, tid)
    del pid, tid  # each temporary given back once read: the timeline of a big trace peaks here
    s, e = ts[rows], end[rows]
    del ts, end
    order = np.lexsort((-(e - s), s, track))
    rows, track, s, e = rows[order], track[order], s[order], e[order]
    del order
    stage = attribution.stage[rows]
    step = attribution.step[rows] if split_steps else np.zeros(len(rows), dtype=np.int64)
    rule = attribution.rule[rows]  # its own integer type: the sum below is int64

    starts, segment = _segments(track, s, e, (stage, step), gap_ns)
    n_seg = len(starts)
    seg_start = np.minimum.reduceat(s, starts)
    seg_end = np.maximum.reduceat(e, starts)
    counts = np.diff(np.append(starts, len(rows)))
    busy = union_length(segment, s, e, n_seg)
    # the rule that decided most of each interval's time (+1 so zero-length events still count)
    n_rules = max(len(attribution.rule_names), 1)
    weight = np.bincount(segment * n_rules + rule, weights=(e - s + 1).astype(np.float64))
    del segment, rule
    pairs = np.flatnonzero(weight)
    pair_seg, pair_rule = pairs // n_rules, pairs % n_rules
    best = np.lexsort((-weight[pairs], pair_seg))
    first = np.flatnonzero(np.r_[True, pair_seg[best][1:] != pair_seg[best][:-1]])
    seg_rule = np.zeros(n_seg, dtype=np.int64)
    seg_rule[pair_seg[best][first]] = pair_rule[best][first]

    seg_track = track[starts]
    del s, e, step
    keep = np.ones(n_seg, dtype=bool)
    if disjoint:
        seg_start, keep = clip_disjoint(seg_track, seg_start, seg_end)
    intervals = pd.DataFrame(
        {
            "track": seg_track,
            "start_ns": seg_start,
            "end_ns": seg_end,
            "stage": pd.Categorical.from_codes(stage[starts].astype(np.int8), categories=list(STAGES)),
            "rule": pd.Categorical.from_codes(seg_rule, categories=attribution.rule_names),
            "step": attribution.step[rows][starts],
            "events": counts,
            "busy_ns": busy,
        }
    )
    if not keep.all():
        intervals = intervals[keep].reset_index(drop=True)
    tracks = _tracks(parsed, uniques, rows, track, gpu)
    return StageTracks(tracks, intervals)


def _activity_rows(parsed: ParsedTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows :func:`stage_intervals` merges (host spans of one stage, GPU activity), the GPU mask, every
    event's start and end."""
    events = parsed.raw.events
    links = parsed.links
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    end = ts + dur
    host = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    host &= ~mixed_containers(links.parent, links.depth, parsed.attribution.stage)
    # step ranges are containers too, where they hold no event: prof.step() opens ProfilerStep#N before the loop
    # enters the Python frame that runs the step, so the range overlaps the step's stages without holding them
    # (a capture with Python stacks), and its "other" span covered them (in annotate's disjoint tracks: replaced)
    host &= ~name_mask(events, STEP_NAME)
    gpu = kind_mask(events, GPU_ACTIVITY_KINDS)
    return np.flatnonzero(host | gpu), gpu, ts, end


def activity_span(parsed: ParsedTrace) -> int | None:
    """From the first start to the last end of what :func:`stage_intervals` merges (its intervals' span,
    without merging them); None when there is nothing."""
    rows, _, ts, end = _activity_rows(parsed)
    return int(end[rows].max() - ts[rows].min()) if len(rows) else None


def _factorize_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Codes of the (a, b) pairs in order of first appearance, and the pairs: what ``MultiIndex.factorize``
    gives, without the MultiIndex's tuples of every row (on a large trace, seconds of the timeline's time)."""
    codes, (first_a, first_b) = factorize_rows(a, b)
    return codes.astype(np.int64), list(zip(first_a.tolist(), first_b.tolist(), strict=True))


_TRACK_DTYPES = {
    "track": "int64",
    "kind": "object",
    "pid": "int64",
    "tid": "int64",
    "label": "object",
    "events": "int64",
    "busy_ns": "int64",
    "order": "int64",
}


def _empty_intervals(rule_names: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "track": np.array([], np.int64),
            "start_ns": np.array([], np.int64),
            "end_ns": np.array([], np.int64),
            "stage": pd.Categorical([], categories=list(STAGES)),
            "rule": pd.Categorical([], categories=rule_names),
            "step": np.array([], np.int64),
            "events": np.array([], np.int64),
            "busy_ns": np.array([], np.int64),
        }
    )


def _tracks(
    parsed: ParsedTrace, uniques: list[tuple[int, int]], rows: np.ndarray, track: np.ndarray, gpu: np.ndarray
) -> pd.DataFrame:
    events = parsed.raw.events
    n = len(uniques)
    is_gpu = np.zeros(n, dtype=bool)
    is_gpu[track[gpu[rows]]] = True
    counts = np.bincount(track, minlength=n)
    dur = events["dur_ns"].to_numpy()[rows]
    busy = np.bincount(track, weights=dur, minlength=n).astype(np.int64)
    device = events["device"].to_numpy()[rows]
    stream = events["stream"].to_numpy()[rows]
    first_row = np.full(n, -1, dtype=np.int64)
    first_row[track[::-1]] = np.arange(len(rows))[::-1]
    main = parsed.attribution.main_thread
    main_key = None
    if main >= 0 and main < len(parsed.links.threads):
        main_key = tuple(int(v) for v in parsed.links.threads.iloc[main][["pid", "tid"]])
    out = []
    for k in range(n):
        pid, tid = int(uniques[k][0]), int(uniques[k][1])
        kind = "gpu" if is_gpu[k] else "host"
        dev = int(device[first_row[k]]) if kind == "gpu" and device[first_row[k]] != NULL else None
        stm = int(stream[first_row[k]]) if kind == "gpu" and stream[first_row[k]] != NULL else None
        out.append(
            {
                "track": k,
                "kind": kind,
                "pid": pid,
                "tid": tid,
                "label": _track_label(parsed.raw, pid, tid, kind, dev, stm),
                "events": int(counts[k]),
                "busy_ns": int(busy[k]),
                "_main": (pid, tid) == main_key,
                "_dev": dev if dev is not None else -1,
                "_stream": stm if stm is not None else -1,
            }
        )
    frame = pd.DataFrame(out)
    # main thread first, other host threads by busy time, then GPU streams by device and stream
    host_part = frame[frame["kind"] == "host"].sort_values(
        ["_main", "busy_ns", "track"], ascending=[False, False, True], kind="stable"
    )
    gpu_part = frame[frame["kind"] == "gpu"].sort_values(["_dev", "_stream", "track"], kind="stable")
    frame = pd.concat([host_part, gpu_part], ignore_index=True)
    frame["order"] = np.arange(len(frame))
    frame = frame.drop(columns=["_main", "_dev", "_stream"])
    return frame.astype(_TRACK_DTYPES)


def _substage_codes(parsed: ParsedTrace) -> tuple[np.ndarray, list[str]] | None:
    """Per raw event: loading sub-step code (-1 = none) and the sub-step names, from the analyses when present.

    Reads the analyses' per-row result directly when it is there (no copy of the event table), else the public
    ``events.substage`` column.
    """
    substeps = parsed.value("substeps") if hasattr(parsed, "value") else None
    if substeps is not None and hasattr(substeps, "substep") and hasattr(substeps, "substage_column"):
        if not getattr(substeps, "active", True):
            return None
        codes = np.asarray(substeps.substep, dtype=np.int64)
        if len(codes) == len(parsed.raw.events):
            return codes, [str(c) for c in substeps.substage_column().categories]
    try:
        public = parsed.events
    except AttributeError:
        return None
    if (
        "substage" not in public.columns
        or not public["substage"].notna().any()
        or len(public) != len(parsed.raw.events)
    ):
        return None
    substage = public["substage"].astype("category")
    return substage.cat.codes.to_numpy().astype(np.int64), [str(c) for c in substage.cat.categories]


def load_substep_intervals(parsed: ParsedTrace) -> pd.DataFrame | None:
    """Loading sub-steps per host thread: (pid, tid, start_ns, end_ns, substep, events), never overlapping.

    Built from the ``substage`` column the analyses add to ``events`` (None when it is absent or empty): spans
    that hold one sub-step only, consecutive ones of the same sub-step merged, as for the stages.
    """
    load = STAGES.index("load")
    if not (parsed.attribution.stage == load).any():
        return None
    found = _substage_codes(parsed)
    if found is None:
        return None
    codes, names = found
    events = parsed.raw.events
    links = parsed.links
    dur = events["dur_ns"].to_numpy()
    spans = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0) & (codes >= 0)
    spans &= ~mixed_containers(links.parent, links.depth, codes)
    rows = np.flatnonzero(spans)
    if len(rows) == 0:
        return None
    pid = events["pid"].to_numpy()[rows]
    tid = events["tid"].to_numpy()[rows]
    track, uniques = _factorize_pairs(pid, tid)
    s = events["ts_ns"].to_numpy()[rows]
    e = s + dur[rows]
    order = np.lexsort((-(e - s), s, track))
    track, s, e, code = track[order], s[order], e[order], codes[rows][order]
    starts, _ = _segments(track, s, e, (code,), None)
    seg_track = track[starts]
    seg_start = np.minimum.reduceat(s, starts)
    seg_end = np.maximum.reduceat(e, starts)
    seg_start, keep = clip_disjoint(seg_track, seg_start, seg_end)
    out = pd.DataFrame(
        {
            "pid": [int(uniques[t][0]) for t in seg_track],
            "tid": [int(uniques[t][1]) for t in seg_track],
            "start_ns": seg_start,
            "end_ns": seg_end,
            "substep": [str(names[c]) for c in code[starts]],
            "events": np.diff(np.append(starts, len(s))),
        }
    )
    return out[keep].reset_index(drop=True)
