"""Decoding chunks in forked worker processes: the reader hands each chunk's text over in shared memory, a worker
turns it into columns and hands their numbers back in shared memory too, and the parent appends them in file
order."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profparse.trace.columns import ChunkColumns, chunk_columns
from profparse.trace.decode import ReadSequentially, TraceDecoder
from profparse.trace.recovery import ChunkDecoder
from profparse.trace.source import expected_json_bytes
from profparse.trace.table import EventTableBuilder

WORKERS_ENV = "PROFPARSE_WORKERS"
PARALLEL_MIN_BYTES = 64 << 20
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class _Slots:
    """Chunk buffers in memory shared with forked workers: the reader copies a chunk's text in once (as a JSON
    array) and a worker decodes it in place, instead of pickling it through a pipe. Each slot has a second
    buffer of ``size`` bytes for the columns the worker makes of it (:func:`_columns_out`)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.memory = mmap.mmap(-1, count * size)  # anonymous and shared: forked workers see the same pages
        self.results = mmap.mmap(-1, count * size)

    def put(self, slot: int, body: memoryview) -> int | None:
        """Write ``[`` + body + ``]`` into ``slot``; its length, or None if it does not fit."""
        n = len(body)
        if n + 2 > self.size:
            return None
        base = slot * self.size
        self.memory[base] = 0x5B  # [
        self.memory[base + 1 : base + 1 + n] = body
        self.memory[base + 1 + n] = 0x5D  # ]
        return n + 2

    def view(self, slot: int, length: int) -> memoryview:
        return memoryview(self.memory)[slot * self.size : slot * self.size + length]

    def result_view(self, slot: int) -> memoryview:
        return memoryview(self.results)[slot * self.size : (slot + 1) * self.size]

    def close(self) -> None:
        for memory in (self.memory, self.results):
            try:
                memory.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with the last reference
                pass


@dataclass(frozen=True)
class _InSlot:
    """A column a worker left in its slot's result buffer: where, its dtype and length."""

    offset: int
    dtype: str
    length: int


_ALIGN = 64


def _columns_out(chunk: ChunkColumns, out: memoryview) -> None:
    """Worker side: copy ``chunk``'s numeric columns into ``out`` (as many as fit), each replaced by its
    :class:`_InSlot`, so that the pickle sent back holds only the strings. Pickled through the result pipe, the
    columns cost a copy into the pickle, two through the pipe and one out of it (~0.7 s of the read's 5.4 s of CPU
    on a 300 MB trace)."""
    at = 0
    for key, values in chunk.cols.items():
        if values is None:
            continue
        size = values.nbytes
        if at + size > len(out):
            continue  # this one goes through the pipe
        np.frombuffer(out, dtype=values.dtype, count=len(values), offset=at)[:] = values
        chunk.cols[key] = _InSlot(at, values.dtype.str, len(values))  # type: ignore[assignment]
        at += -(-size // _ALIGN) * _ALIGN


def _columns_in(chunk: ChunkColumns, out: memoryview) -> None:
    """Parent side of :func:`_columns_out`: the columns as views of the slot's buffer (the builder copies them
    into its own before the slot takes another chunk)."""
    for key, values in chunk.cols.items():
        if isinstance(values, _InSlot):
            chunk.cols[key] = np.frombuffer(out, dtype=values.dtype, count=values.length, offset=values.offset)


_SLOTS: _Slots | None = None  # set before the workers fork, so they inherit the mapping


def _decode_body(body: bytes | None, slot: int = -1, length: int = 0) -> tuple[ChunkColumns | None, int, dict] | None:
    """Worker side of the parallel reader: decode one chunk (``body``, or ``length`` bytes of shared ``slot``)
    into columns (those that fit left in the slot's result buffer); None if it does not decode."""
    decoder = ChunkDecoder("")
    try:
        if body is None:
            data = _SLOTS.view(slot, length)  # type: ignore[union-attr]
            events, raw = decoder.decode_array(data)
        else:
            events, raw = decoder.decode_body(body)
            del body
        chunk = chunk_columns(events, raw) if events else None
        del raw
        if chunk is not None and body is None:
            _columns_out(chunk, _SLOTS.result_view(slot))  # type: ignore[union-attr]
        return chunk, len(events), decoder.report.dropped
    except Exception:  # noqa: BLE001 - whatever it is, the sequential reader reproduces and reports it
        return None


def die_with_parent(parent: int) -> None:
    """Start-up of a worker process: the kernel kills it when its parent dies, however the parent died (SIGKILL
    included), so no worker outlives profparse; Ctrl-C is left to the parent, which stops the workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux/glibc: the parent's shutdown is all there is
        pass
    if os.getppid() != parent:  # the parent died before the call above took effect
        os._exit(1)


def worker_count(path: str | Path, workers: int | None = None) -> int:
    """Processes for decoding: ``workers``, else ``$PROFPARSE_WORKERS``, else one per CPU (up to 4) for files
    of at least 64 MB of JSON, else 1. Only where processes can be forked (Linux)."""
    if workers is None:
        env = os.environ.get(WORKERS_ENV, "").strip()
        if env.isdigit():
            workers = int(env)
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if workers is not None:
        return max(int(workers), 1)
    if multiprocessing.parent_process() is not None or threading.active_count() > 1:
        return 1  # inside a worker (e.g. one per rank) or a threaded program: forking more is no help or unsafe
    size = expected_json_bytes(path)
    return min(usable_cpus(), 4) if size >= PARALLEL_MIN_BYTES else 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as ``os.process_cpu_count`` of Python 3.13)."""
    process_cpu_count = getattr(os, "process_cpu_count", None)
    if process_cpu_count is not None:
        return process_cpu_count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity masks here (macOS)
        return os.cpu_count() or 1


def _fork_pool(workers: int) -> ProcessPoolExecutor | None:
    """A pool of ``workers`` forked processes that die with this one; None where none can be made."""
    try:
        return ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        )
    except (OSError, ValueError):
        return None


def _take_in(
    future: Future, decoder: TraceDecoder, builder: EventTableBuilder, progress: Any, slots: _Slots, slot: int
) -> bool:
    """Append a worker's chunk (decoded from ``slot``, -1: sent as bytes) and count its events; False if it did
    not decode (or the worker died)."""
    try:
        result = future.result()
    except BrokenProcessPool:  # a worker died (e.g. killed for memory): read sequentially instead
        return False
    if result is None:
        return False
    chunk, events, dropped = result
    if chunk is not None:
        if slot >= 0:
            _columns_in(chunk, slots.result_view(slot))
        builder.append(chunk)
        del chunk
    decoder.report.events_read += events
    for reason, count in dropped.items():
        decoder.report.drop(reason, count)
    if progress is not None:
        progress(decoder.report.bytes_read)
    return True


def read_parallel(decoder: TraceDecoder, builder: EventTableBuilder, workers: int, progress: Any) -> bool:
    """Decode the chunks in ``workers`` forked processes, in file order; False if a chunk needs the sequential
    reader (then nothing of this attempt is to be used)."""
    global _SLOTS
    pending: deque[tuple[Future, int]] = deque()  # and the slot it decodes (-1: none)
    slots = _Slots(workers + 2, decoder.chunk_bytes + (1 << 20))
    _SLOTS = slots
    pool = _fork_pool(workers)
    if pool is None:
        slots.close()
        return False

    def take_in_all() -> bool:
        while pending:
            future, slot = pending.popleft()
            if not _take_in(future, decoder, builder, progress, slots, slot):
                return False
        return True

    chunks = 0
    try:
        for item in decoder.bodies():
            if isinstance(item, memoryview):
                # chunk number ``chunks`` goes to slot ``chunks % count``: the chunk that used it must be in
                while len(pending) >= slots.count - 1:
                    future, slot = pending.popleft()
                    if not _take_in(future, decoder, builder, progress, slots, slot):
                        return False
                future, slot = _submit(pool, slots, chunks % slots.count, item)
                if future is None:
                    return False
                del item
                pending.append((future, slot))
                chunks += 1
            elif item is None:
                if not take_in_all():
                    return False
            else:
                builder.add(*item)  # the end of the file, decoded here
                del item
                if progress is not None:
                    progress(decoder.report.bytes_read)
        return take_in_all()
    except ReadSequentially:
        return False
    except Exception:
        # the reader stopped (e.g. corrupt compressed data): the sequential reader would have stopped there too,
        # unless a chunk before it does not decode
        if not take_in_all():
            return False
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _SLOTS = None
        slots.close()


def _submit(pool: ProcessPoolExecutor, slots: _Slots, slot: int, body: memoryview) -> tuple[Future | None, int]:
    """Hand ``body`` to a worker through ``slot`` (or as bytes when it does not fit: slot -1); no future where
    processes cannot be started (e.g. inside a daemonic worker)."""
    length = slots.put(slot, body)
    try:
        if length is None:  # bigger than a slot: send the text itself
            return pool.submit(_decode_body, bytes(body)), -1
        return pool.submit(_decode_body, None, slot, length), slot
    except (OSError, RuntimeError, AssertionError, BrokenProcessPool):
        return None, -1
