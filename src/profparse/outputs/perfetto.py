"""Stage tracks per host thread and GPU stream, and the annotated trace for Perfetto UI / chrome://tracing.

:func:`stage_intervals` merges, on every track, consecutive events of the same stage (and step) into one interval;
plots draw them and :func:`write_annotated` appends them to a copy of the trace as new ``X`` events on a new
process named ``profparse stages`` (one thread per host thread / GPU stream). The original text of every event is
copied through unchanged: the input is streamed, never held as Python objects.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import pandas as pd

from profparse.base.errors import OutputRefusedError, TraceFormatError
from profparse.base.files import atomic_file
from profparse.base.intervals import union_length
from profparse.base.marks import STAGES
from profparse.tables.host_time import HOST_SPAN_KINDS, mixed_containers
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import kind_mask
from profparse.trace.scan import event_boundaries
from profparse.trace.source import BOM, open_trace

STAGE_PROCESS_NAME = "profparse stages"
STAGE_CATEGORY = "profparse_stage"
LOAD_CATEGORY = "profparse_load"
COPY_BYTES = 16 << 20  # read size while copying
HOLD_BYTES = 16 << 20  # tail of a trace cut short kept back until the end: it holds the last complete event
_SPACE = b" \t\r\n"
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


def _clip_disjoint(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals sorted by (track, start) -> (starts clipped to the end of everything before them on the track,
    which to keep: those not left empty)."""
    if len(track) == 0:
        return start, np.ones(0, dtype=bool)
    base = int(min(start.min(), end.min()))
    span = int(end.max() - base) + 1
    reach = np.maximum.accumulate((end - base) + track * span) - track * span + base
    before = np.full(len(track), np.iinfo(np.int64).min)
    same = np.r_[False, track[1:] == track[:-1]]
    before[same] = reach[:-1][same[1:]]
    clipped = np.maximum(start, before)
    keep = (end > clipped) | ((end == start) & (start >= before))
    return clipped, keep


def stage_intervals(
    parsed: Any, *, gap_ns: int | None = None, split_steps: bool = True, disjoint: bool = False
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
    s, e = ts[rows], end[rows]
    order = np.lexsort((-(e - s), s, track))
    rows, track, s, e = rows[order], track[order], s[order], e[order]
    stage = attribution.stage[rows].astype(np.int64)
    step = attribution.step[rows] if split_steps else np.zeros(len(rows), dtype=np.int64)
    rule = attribution.rule[rows].astype(np.int64)

    starts, segment = _segments(track, s, e, (stage, step), gap_ns)
    n_seg = len(starts)
    seg_start = np.minimum.reduceat(s, starts)
    seg_end = np.maximum.reduceat(e, starts)
    counts = np.diff(np.append(starts, len(rows)))
    busy = union_length(segment, s, e, n_seg)
    # the rule that decided most of each interval's time (+1 so zero-length events still count)
    n_rules = max(len(attribution.rule_names), 1)
    weight = np.bincount(segment * n_rules + rule, weights=(e - s + 1).astype(np.float64))
    pairs = np.flatnonzero(weight)
    pair_seg, pair_rule = pairs // n_rules, pairs % n_rules
    best = np.lexsort((-weight[pairs], pair_seg))
    first = np.flatnonzero(np.r_[True, pair_seg[best][1:] != pair_seg[best][:-1]])
    seg_rule = np.zeros(n_seg, dtype=np.int64)
    seg_rule[pair_seg[best][first]] = pair_rule[best][first]

    seg_track = track[starts]
    keep = np.ones(n_seg, dtype=bool)
    if disjoint:
        seg_start, keep = _clip_disjoint(seg_track, seg_start, seg_end)
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


def _activity_rows(parsed: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows :func:`stage_intervals` merges (host spans of one stage, GPU activity), the GPU mask, every
    event's start and end."""
    events = parsed.raw.events
    links = parsed.links
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    end = ts + dur
    host = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    host &= ~mixed_containers(links.parent, links.depth, parsed.attribution.stage)
    gpu = kind_mask(events, GPU_ACTIVITY_KINDS)
    return np.flatnonzero(host | gpu), gpu, ts, end


def activity_span(parsed: Any) -> int | None:
    """From the first start to the last end of what :func:`stage_intervals` merges (its intervals' span,
    without merging them); None when there is nothing."""
    rows, _, ts, end = _activity_rows(parsed)
    return int(end[rows].max() - ts[rows].min()) if len(rows) else None


def _factorize_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Codes of the (a, b) pairs in order of first appearance, and the pairs: what ``MultiIndex.factorize``
    gives, without the MultiIndex's tuples of every row (on a large trace, seconds of the timeline's time)."""
    ca, ua = pd.factorize(a)
    cb, ub = pd.factorize(b)
    width = max(len(ub), 1)
    codes, first = pd.factorize(ca.astype(np.int64) * width + cb)
    pairs = [(int(ua[k // width]), int(ub[k % width])) for k in first]
    return codes.astype(np.int64), pairs


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
    parsed: Any, uniques: list[tuple[int, int]], rows: np.ndarray, track: np.ndarray, gpu: np.ndarray
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


# -- the annotated trace -------------------------------------------------------------------------------------


def _us(ns: int) -> str:
    """Integer nanoseconds -> exact microseconds as JSON number text."""
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(int(ns)), 1000)
    return f"{sign}{whole}.{frac:03d}" if frac else f"{sign}{whole}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _free_pid(parsed: Any) -> int:
    """An integer pid no event of the trace uses (the new process must not merge with an existing one)."""
    used = set(np.unique(parsed.raw.events["pid"].to_numpy()).tolist())
    pid = 0x7F0000
    while pid in used:
        pid += 1
    return pid


def _substage_codes(parsed: Any) -> tuple[np.ndarray, list[str]] | None:
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


def load_substep_intervals(parsed: Any) -> pd.DataFrame | None:
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
    seg_start, keep = _clip_disjoint(seg_track, seg_start, seg_end)
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


def annotation_events(parsed: Any, tracks: StageTracks | None = None) -> Iterator[str]:
    """The new events (JSON text, one per item): metadata first, then one ``X`` event per stage interval."""
    tracks = tracks if tracks is not None else stage_intervals(parsed, disjoint=True)
    pid = _free_pid(parsed)
    yield _json({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": STAGE_PROCESS_NAME}})
    yield _json({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}})
    tid_of: dict[int, int] = {}
    for row in tracks.tracks.sort_values("order").itertuples(index=False):
        tid = int(row.order) + 1
        tid_of[int(row.track)] = tid
        label = f"stages: {row.label}"
        yield _json({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
        yield _json({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    intervals = tracks.intervals
    track_tid = intervals["track"].map(tid_of).to_numpy()
    stage = intervals["stage"].astype(str).to_numpy()
    rule = intervals["rule"].astype(str).to_numpy()
    step = intervals["step"].to_numpy()
    start = intervals["start_ns"].to_numpy()
    stop = intervals["end_ns"].to_numpy()
    count = intervals["events"].to_numpy()
    busy = intervals["busy_ns"].to_numpy()
    for i in range(len(intervals)):
        step_text = "null" if step[i] == NULL else str(int(step[i]))
        yield (
            f'{{"ph":"X","cat":"{STAGE_CATEGORY}","name":{_json(stage[i])},"pid":{pid},"tid":{track_tid[i]},'
            f'"ts":{_us(start[i])},"dur":{_us(stop[i] - start[i])},'
            f'"args":{{"stage":{_json(stage[i])},"rule":{_json(rule[i])},"step":{step_text},'
            f'"events":{int(count[i])},"busy_us":{_us(busy[i])}}}}}'
        )
    substeps = load_substep_intervals(parsed)
    if substeps is not None and len(substeps):
        labels = {(int(r.pid), int(r.tid)): r.label for r in tracks.tracks.itertuples(index=False)}
        next_tid = len(tid_of) + 1
        for (spid, stid), group in substeps.groupby(["pid", "tid"], sort=True):
            tid = next_tid
            next_tid += 1
            label = f"load sub-steps: {labels.get((spid, stid), f'pid {spid} tid {stid}')}"
            yield _json({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
            yield _json({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
            for r in group.itertuples(index=False):
                yield (
                    f'{{"ph":"X","cat":"{LOAD_CATEGORY}","name":{_json(r.substep)},"pid":{pid},"tid":{tid},'
                    f'"ts":{_us(r.start_ns)},"dur":{_us(r.end_ns - r.start_ns)},'
                    f'"args":{{"stage":"load","substep":{_json(r.substep)},"events":{int(r.events)}}}}}'
                )


@dataclass
class AnnotateResult:
    path: Path
    intervals: int  # stage slices written
    tracks: int  # host threads and GPU streams with a stage track
    truncated_input: bool  # the input was cut short: its complete events were copied
    substeps: int = 0  # loading sub-step slices written
    trailing_bytes: int = 0  # bytes after the input's JSON document, not copied (parsing ignores them too)


def _last_event_end(tail: bytes) -> int | None:
    """End (just after its ``}``) of the last complete event in the tail of a trace cut short, or None."""
    boundary = next(event_boundaries(tail, len(tail)), None)  # the last '},{' between two events
    start = boundary[1] if boundary else tail.find(b"{")
    candidates = []
    close = tail.rfind(b"]")
    if close >= 0 and tail[:close].rstrip().endswith(b"}"):
        candidates.append(len(tail[:close].rstrip()))  # cut inside the trailer
    stripped = tail.rstrip()
    if stripped.endswith(b"}"):
        candidates.append(len(stripped))  # cut right after an event
    for cut in candidates:
        if start >= 0 and cut > start:
            try:
                if isinstance(msgspec.json.decode(tail[start:cut]), dict):
                    return cut
            except msgspec.DecodeError:
                pass
    return boundary[0] if boundary else None


def _open_out(path: Path, gz: bool) -> BinaryIO:
    if gz:
        return gzip.open(path, "wb", compresslevel=3)  # type: ignore[return-value]
    return path.open("wb")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def write_annotated(
    parsed: Any,
    out: str | Path,
    *,
    force: bool = False,
    gzip_output: bool | None = None,
) -> AnnotateResult:
    """Copy ``parsed``'s trace file to ``out`` with the stage tracks appended to ``traceEvents``.

    Every byte of the original document is copied through unchanged; the new events go right after the last
    original event, before the array's closing ``]``, at the offset the decoder found (see :func:`_splice`).
    What parsing ignored is left out: a byte-order mark, and bytes after the end of the document. ``out`` is
    gzip-compressed when it ends with ``.gz`` (or as ``gzip_output`` says) and is written atomically; the input
    is never modified.
    """
    source = Path(parsed.path)
    target = Path(out)
    if _same_file(source, target):
        raise OutputRefusedError(f"{target}: is the input trace; annotate never modifies its input")
    gz = target.name.endswith(".gz") if gzip_output is None else gzip_output
    tracks = stage_intervals(parsed, disjoint=True)
    new_events = list(annotation_events(parsed, tracks))
    substeps = sum(1 for e in new_events if LOAD_CATEGORY in e[:60])
    new_text = ",\n".join(new_events).encode("utf-8")
    report = parsed.raw.report
    close, end = report.events_end_byte, report.document_end_byte
    if close is None and not report.truncated:  # e.g. an entry of an older cache: no offsets to splice at
        raise TraceFormatError(f"{source}: where its traceEvents array ends is not known; nothing written")
    with atomic_file(target, force=force, inputs=[source]) as tmp, _open_out(tmp, gz) as dst, open_trace(source) as src:
        if close is None:
            truncated = _splice_cut_short(source, src, dst, new_text)
        else:
            truncated = end is None  # cut inside the trailer: the events are whole, the trailer keys are lost
            _splice(source, src, dst, new_text, close, end, report.trailing_bytes)
    return AnnotateResult(
        path=target,
        intervals=len(tracks.intervals),
        tracks=len(tracks.tracks),
        truncated_input=truncated,
        substeps=substeps,
        trailing_bytes=report.trailing_bytes if end is not None else 0,
    )


def _copy(source: Path, src: BinaryIO, dst: BinaryIO, count: int) -> int:
    """Copy the next ``count`` bytes of ``src``; the last of them that is not a blank (0 if none)."""
    last = 0
    while count > 0:
        block = _read(source, src, min(count, COPY_BYTES))
        if not block:
            raise TraceFormatError(f"{source}: ends before the offsets found when it was parsed (changed since?)")
        dst.write(block)
        count -= len(block)
        stripped = block.rstrip(_SPACE)
        if stripped:
            last = stripped[-1]
    return last


def _read(source: Path, src: BinaryIO, size: int) -> bytes:
    try:  # only reading errors are the input's fault (a full disk while writing is not)
        return src.read(size)
    except EOFError:
        return b""
    except (OSError, zlib.error) as exc:
        raise TraceFormatError(f"{source}: cannot read ({exc})") from None


def _splice(
    source: Path, src: BinaryIO, dst: BinaryIO, new_text: bytes, close: int, end: int | None, trailing: int
) -> None:
    """Copy the document with ``new_text`` inserted before the ``]`` at offset ``close`` that the decoder found
    closing ``traceEvents`` (by structure: never a bracket of a string or of a later key), and the trailer up
    to ``end``, where the decoder found the document's last ``}``; bytes after it (``trailing`` of them besides
    blanks: NUL padding, junk, a second document) are left out, as parsing leaves them out; blanks alone are
    copied (the output is then the input with one block inserted). A UTF-8 byte-order mark is left out too (JSON text
    must not start with one). Each offset is checked against the bytes there: an input that changed since it
    was parsed is refused (exit 4), and the temporary output removed."""
    start = _read(source, src, len(BOM))
    if start != BOM:
        dst.write(start)
    last = _copy(source, src, dst, close - len(start))
    if start != BOM and start.rstrip(_SPACE):
        last = last or start.rstrip(_SPACE)[-1]
    bracket = _read(source, src, 1)
    if bracket != b"]":
        raise TraceFormatError(f"{source}: no ']' at byte {close}, where parsing found the end of traceEvents")
    dst.write((b"\n" if last in b"[," else b",\n") + new_text + b"\n]")
    if end is None:
        dst.write(b"}\n")
        return
    _copy(source, src, dst, end - close - 2)
    if _read(source, src, 1) != b"}":
        raise TraceFormatError(f"{source}: no '}}' at byte {end - 1}, where parsing found the end of the document")
    dst.write(b"}")
    if trailing:
        dst.write(b"\n")
        return
    while block := _read(source, src, COPY_BYTES):  # blanks only; those JSON does not allow are left out
        dst.write(block.translate(None, b"\x0b\x0c"))


def _splice_cut_short(source: Path, src: BinaryIO, dst: BinaryIO, new_text: bytes) -> bool:
    """Copy a trace cut short inside its event array: its complete events, then ``new_text`` and the closing
    brackets (the tail is held back to find the last complete event). Returns whether the input was cut."""
    tail = b""
    while True:
        block = _read(source, src, COPY_BYTES)
        if not block:
            break
        tail += block
        if len(tail) > HOLD_BYTES + COPY_BYTES:
            dst.write(tail[:-HOLD_BYTES])
            tail = tail[-HOLD_BYTES:]
    cut = _last_event_end(tail)
    if cut is None:
        if not tail.rstrip().endswith(b"["):
            raise TraceFormatError(f"{source}: cut short and no complete event found near its end")
        cut = len(tail.rstrip())
        dst.write(tail[:cut] + b"\n" + new_text + b"\n]}\n")
    else:
        dst.write(tail[:cut] + b",\n" + new_text + b"\n]}\n")
    return True
