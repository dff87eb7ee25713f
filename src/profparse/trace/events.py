"""Reading a trace into its event table.

One row per entry of ``traceEvents`` (in file order, ``trace_index`` = position in the array), typed columns,
times as int64 nanoseconds, strings dictionary-encoded (see :mod:`profparse.trace.kinds` for ``kind``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profparse.base.errors import OutOfMemoryError
from profparse.trace.budget import BYTES_PER_EVENT, memory_left, release_memory
from profparse.trace.decode import TraceDecoder
from profparse.trace.schema import DecodeReport
from profparse.trace.source import expected_json_bytes
from profparse.trace.table import EventTableBuilder
from profparse.trace.workers import read_parallel, worker_count


@dataclass
class RawTrace:
    """A decoded trace: the event table, top-level keys, track names and the decoder's report."""

    path: str
    events: pd.DataFrame
    header: dict[str, Any]
    report: DecodeReport
    process_names: dict[int, str]
    thread_names: dict[tuple[int, int], str]
    pid_labels: dict[int, str]
    tid_labels: dict[int, str]


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: decoding allocates millions of acyclic objects, and every collection
    would walk all of them again. Reference counting still frees everything as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_trace(
    path: str | Path,
    *,
    strict: bool = False,
    chunk_bytes: int | None = None,
    progress: Any = None,
    workers: int | None = None,
) -> RawTrace:
    """Decode a trace file into a :class:`RawTrace` (streaming, chunk by chunk).

    With ``workers`` > 1 (default: see :func:`worker_count`) chunks are decoded in forked processes; the result
    is the same as with one, which is also what is used whenever a chunk does not decode cleanly.
    """
    try:
        return _read_trace(path, strict=strict, chunk_bytes=chunk_bytes, progress=progress, workers=workers)
    except MemoryError:  # the early estimate passed, the trace needed more: say which file (exit 8)
        raise OutOfMemoryError(
            f"{path}: out of memory while reading it ({memory_left()}); run it where more memory is free"
        ) from None


def _reader(
    path: str | Path, strict: bool, kwargs: dict[str, Any], rows: int
) -> tuple[TraceDecoder, EventTableBuilder]:
    """A decoder and the builder its chunks go to; the decoder's memory checks count what the builder holds."""
    decoder = TraceDecoder(path, strict=strict, **kwargs)
    builder = EventTableBuilder(rows)
    decoder.tally = builder.tally
    return decoder, builder


def _read_trace(
    path: str | Path, *, strict: bool, chunk_bytes: int | None, progress: Any, workers: int | None
) -> RawTrace:
    """:func:`read_trace` without its handling of MemoryError."""
    kwargs = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    rows = expected_json_bytes(path) // BYTES_PER_EVENT
    with _no_cyclic_gc():
        done = False
        processes = worker_count(path, workers)
        if processes > 1:
            decoder, builder = _reader(path, strict, kwargs, rows)
            done = read_parallel(decoder, builder, processes, progress)
        if not done:
            decoder, builder = _reader(path, strict, kwargs, rows)
            for events, raw in decoder.chunks_with_text():
                builder.add(events, raw)
                del events, raw  # free the chunk before the next one is decoded
                if progress is not None:
                    progress(decoder.report.bytes_read)
        decoder.check_memory_after(builder.tally())  # exact counts, before the tables and analyses take the most
        frame = builder.build()
    release_memory()
    if frame.attrs.get("dropped_missing_ts"):
        decoder.report.drop("event without ts", frame.attrs["dropped_missing_ts"])
    if frame.attrs.get("dropped_absurd_time"):
        decoder.report.drop(
            "absurd ts or dur (non-finite, or beyond int64 ns / 11 days)", frame.attrs["dropped_absurd_time"]
        )
    return RawTrace(
        path=str(path),
        events=frame,
        header=decoder.header,
        report=decoder.report,
        process_names=builder.process_names,
        thread_names=builder.thread_names,
        pid_labels=builder.pid_labels,
        tid_labels=builder.tid_labels,
    )
