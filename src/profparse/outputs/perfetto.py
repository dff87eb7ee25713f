"""The annotated trace for Perfetto UI / chrome://tracing.

:func:`write_annotated` appends the stage tracks (:func:`profparse.analysis.stage_tracks.stage_intervals`) to a copy
of the trace as new ``X`` events on a new process named ``profparse stages`` (one thread per host thread / GPU
stream), and one thread ``critical path`` whose slices are the steps' critical path segments, named by bound.
The original text of every event is copied through unchanged: the input is streamed, never held as Python objects.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec
import numpy as np
import pandas as pd

from profparse.analysis.stage_tracks import StageTracks, load_substep_intervals, stage_intervals
from profparse.base.arrays import text_codes
from profparse.base.errors import OutputRefusedError, TraceFormatError
from profparse.base.files import atomic_file
from profparse.trace.kinds import NULL
from profparse.trace.scan import event_boundaries
from profparse.trace.source import BOM, open_trace

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

STAGE_PROCESS_NAME = "profparse stages"
STAGE_CATEGORY = "profparse_stage"
LOAD_CATEGORY = "profparse_load"
PATH_CATEGORY = "profparse_critical_path"
CRITICAL_PATH_TRACK = "critical path"
COPY_BYTES = 16 << 20  # read size while copying
HOLD_BYTES = 16 << 20  # tail of a trace cut short kept back until the end: it holds the last complete event
_SPACE = b" \t\r\n"


# -- the annotated trace -------------------------------------------------------------------------------------


def _us(ns: int) -> str:
    """Integer nanoseconds -> exact microseconds as JSON number text."""
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(int(ns)), 1000)
    return f"{sign}{whole}.{frac:03d}" if frac else f"{sign}{whole}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _slice(category: str, name: str, pid: int, tid: int, start: int, stop: int, args: str) -> str:
    """One complete event (``ph: X``) of the annotation's own tracks; ``args`` is the text inside its braces."""
    return (
        f'{{"ph":"X","cat":"{category}","name":{_json(name)},"pid":{pid},"tid":{tid},'
        f'"ts":{_us(start)},"dur":{_us(stop - start)},"args":{{{args}}}}}'
    )


def _labels(column: pd.Series) -> tuple[list[int], list[str]]:
    """:func:`~profparse.base.arrays.text_codes` as lists, which the event loops index fastest; "nan" where
    missing is a JSON string (pandas 3's ``astype(str)`` keeps it missing, written as JSON's invalid ``NaN``)."""
    codes, texts = text_codes(column)
    return codes.tolist(), texts.tolist()


def _free_pid(parsed: ParsedTrace) -> int:
    """An integer pid no event of the trace uses (the new process must not merge with an existing one)."""
    used = set(np.unique(parsed.raw.events["pid"].to_numpy()).tolist())
    pid = 0x7F0000
    while pid in used:
        pid += 1
    return pid


def annotation_events(parsed: ParsedTrace, tracks: StageTracks | None = None) -> Iterator[str]:
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
        yield from _thread_metadata(pid, tid, label)
    intervals = tracks.intervals
    track_tid = intervals["track"].map(tid_of).to_numpy()
    stage, stage_text = _labels(intervals["stage"])
    stage_json = [_json(text) for text in stage_text]
    rule, rule_text = _labels(intervals["rule"])
    rule_json = [_json(text) for text in rule_text]
    step = intervals["step"].to_numpy()
    start = intervals["start_ns"].to_numpy()
    stop = intervals["end_ns"].to_numpy()
    count = intervals["events"].to_numpy()
    busy = intervals["busy_ns"].to_numpy()
    for i in range(len(intervals)):
        step_text = "null" if step[i] == NULL else str(int(step[i]))
        args = (
            f'"stage":{stage_json[stage[i]]},"rule":{rule_json[rule[i]]},"step":{step_text},'
            f'"events":{int(count[i])},"busy_us":{_us(busy[i])}'
        )
        yield _slice(STAGE_CATEGORY, stage_text[stage[i]], pid, track_tid[i], start[i], stop[i], args)
    path = parsed.table("critical_path")
    lane = step_lanes(path)
    yield from critical_path_events(path, lane, pid, len(tid_of) + 1)
    substeps = load_substep_intervals(parsed)
    if substeps is not None and len(substeps):
        labels = {(int(r.pid), int(r.tid)): r.label for r in tracks.tracks.itertuples(index=False)}
        next_tid = len(tid_of) + 1 + (int(lane.max()) + 1 if len(lane) else 0)
        for (spid, stid), group in substeps.groupby(["pid", "tid"], sort=True):
            tid = next_tid
            next_tid += 1
            label = f"load sub-steps: {labels.get((spid, stid), f'pid {spid} tid {stid}')}"
            yield from _thread_metadata(pid, tid, label)
            for r in group.itertuples(index=False):
                args = f'"stage":"load","substep":{_json(r.substep)},"events":{int(r.events)}'
                yield _slice(LOAD_CATEGORY, r.substep, pid, tid, r.start_ns, r.end_ns, args)


def _thread_metadata(pid: int, tid: int, name: str) -> Iterator[str]:
    """A track's name and its place in the list (its tid), as Perfetto reads them."""
    yield _json({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    yield _json({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})


def step_lanes(path: pd.DataFrame) -> np.ndarray:
    """Per segment of the ``critical_path`` table, its track: 0 for every step but one that overlaps a step
    before it (a trace whose step ranges overlap), which goes on the first track free by its start: a track's
    slices never overlap, which Perfetto needs to draw them."""
    if path.empty:
        return np.zeros(0, dtype=np.int64)
    extent = path.groupby("step", sort=False).agg(start=("start_ns", "min"), end=("end_ns", "max"))
    ends: list[int] = []  # each track's last end
    lane_of = {}
    for step, start, end in extent.sort_values(["start", "end"], kind="stable").itertuples():
        free = next((i for i, last in enumerate(ends) if last <= start), len(ends))
        if free == len(ends):
            ends.append(end)
        else:
            ends[free] = end
        lane_of[step] = free
    return path["step"].map(lane_of).to_numpy(dtype=np.int64)


def critical_path_events(path: pd.DataFrame, lane: np.ndarray, pid: int, tid: int) -> Iterator[str]:
    """The thread ``critical path`` (tid ``tid``): one slice per segment of the ``critical_path`` table, named by
    its bound (args: bound, stage, step, the event it lies in and its ``trace_index``); a step that overlaps
    another goes on ``critical path 2`` (tid + 1), and so on (``lane``: :func:`step_lanes`). Nothing when no
    step has a path."""
    if path.empty:
        return
    for extra in range(int(lane.max()) + 1):
        yield from _thread_metadata(pid, tid + extra, CRITICAL_PATH_TRACK + (f" {extra + 1}" if extra else ""))
    bound, bound_text = _labels(path["bound"])
    stage, stage_text = _labels(path["stage"])
    name, name_text = _labels(path["name"])
    name_json = [_json(text) for text in name_text]
    step = path["step"].to_numpy()
    start = path["start_ns"].to_numpy()
    stop = path["end_ns"].to_numpy()
    index = path["trace_index"].to_numpy()
    track = (lane + tid).tolist()
    for i in range(len(path)):
        event = "null" if index[i] == NULL else str(int(index[i]))
        args = (
            f'"bound":"{bound_text[bound[i]]}","stage":"{stage_text[stage[i]]}","step":{int(step[i])},'
            f'"event":{name_json[name[i]]},"trace_index":{event}'
        )
        yield _slice(PATH_CATEGORY, bound_text[bound[i]], pid, track[i], start[i], stop[i], args)


@dataclass
class AnnotateResult:
    path: Path
    intervals: int  # stage slices written
    tracks: int  # host threads and GPU streams with a stage track
    truncated_input: bool  # the input was cut short: its complete events were copied
    substeps: int = 0  # loading sub-step slices written
    path_segments: int = 0  # critical path slices written (one per segment)
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
    parsed: ParsedTrace,
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
    new_text = _NewEvents(annotation_events(parsed, tracks))
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
        substeps=new_text.counts[LOAD_CATEGORY],
        path_segments=new_text.counts[PATH_CATEGORY],
        trailing_bytes=report.trailing_bytes if end is not None else 0,
    )


class _NewEvents:
    """The new events' text, written a block at a time as it is made (all at once, as one list and one joined
    text, it was most of ``annotate``'s peak: a stage slice per event interval on every track is millions of
    events on a big trace); counts the loading sub-step and critical path slices written."""

    BLOCK = 1 << 14  # events per write

    def __init__(self, events: Iterator[str]) -> None:
        self.events = events
        self.counts = {LOAD_CATEGORY: 0, PATH_CATEGORY: 0}

    def write(self, dst: BinaryIO) -> None:
        """Every event, separated by ``,\n`` (none before the first or after the last)."""
        separator = b""
        while block := list(islice(self.events, self.BLOCK)):
            for category in self.counts:
                self.counts[category] += sum(1 for e in block if category in e[:60])
            dst.write(separator + ",\n".join(block).encode("utf-8"))
            separator = b",\n"


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
    source: Path, src: BinaryIO, dst: BinaryIO, new_text: _NewEvents, close: int, end: int | None, trailing: int
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
    dst.write(b"\n" if last in b"[," else b",\n")
    new_text.write(dst)
    dst.write(b"\n]")
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


def _splice_cut_short(source: Path, src: BinaryIO, dst: BinaryIO, new_text: _NewEvents) -> bool:
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
        dst.write(tail[:cut] + b"\n")
    else:
        dst.write(tail[:cut] + b",\n")
    new_text.write(dst)
    dst.write(b"\n]}\n")
    return True
