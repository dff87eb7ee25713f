"""Build the columnar event table from decoded chunks.

One row per entry of ``traceEvents`` (in file order, ``trace_index`` = position in the array), typed columns,
times as int64 nanoseconds, strings dictionary-encoded. Categories of every schema era are normalised into
``kind`` (e.g. legacy ``Kernel`` and current ``kernel`` are both ``kernel``).
"""

from __future__ import annotations

import gc
import hashlib
import mmap
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import astuple

from profparse.base.errors import OutOfMemoryError
from profparse.trace.decode import (
    ABSENT,
    BYTES_PER_EVENT,
    TEXT_ARG_FIELDS,
    Args,
    DecodeReport,
    Event,
    FastChunk,
    FastEvent,
    ReadSequentially,
    TraceDecoder,
    expected_json_bytes,
    integer_value,
    memory_budget,
)

NULL = np.iinfo(np.int64).min  # sentinel for a missing integer inside numpy arrays
WORKERS_ENV = "PROFPARSE_WORKERS"
PARALLEL_MIN_BYTES = 64 << 20
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_INITIAL_ROWS = 1 << 12  # the first chunk's rows or the size hint usually decide; this is the floor

KINDS: tuple[str, ...] = (
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "memory",
    "instant",
    "flow_start",
    "flow_end",
    "metadata",
    "other",
)
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

CATEGORY_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    # Kineto's other backends record their runtime and driver calls like CUDA's: their kernels link the same way
    "xpu_runtime": "cuda_runtime",
    "xpu_driver": "cuda_driver",
    "mtia_runtime": "cuda_runtime",
    "mtia_driver": "cuda_driver",
    "privateuse1_runtime": "cuda_runtime",
    "privateuse1_driver": "cuda_driver",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_sync": "cuda_sync",
}
GPU_ACTIVITY_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GPU_TRACK_KINDS = GPU_ACTIVITY_KINDS | {"gpu_user_annotation", "cuda_sync"}
RUNTIME_KINDS = frozenset({"cuda_runtime", "cuda_driver"})

INT_ARG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("correlation", "correlation"),
    ("external_id", "external_id"),
    ("sequence_number", "sequence_number"),
    ("fwd_thread_id", "fwd_thread_id"),
    ("stream", "stream"),
    ("device", "device"),
    ("bytes", "bytes"),
    ("mem_bytes", "mem_bytes"),
    ("mem_total_allocated_bytes", "total_allocated"),
    ("mem_total_reserved_bytes", "total_reserved"),
    ("mem_device_type", "device_type"),
    ("mem_device_id", "device_id"),
    ("mem_addr", "addr"),
    ("python_id", "python_id"),
    ("python_parent_id", "python_parent_id"),
    ("comm_in_nelems", "comm_in_nelems"),
    ("comm_out_nelems", "comm_out_nelems"),
    ("comm_group_size", "comm_group_size"),
    ("comm_seq", "comm_seq"),
)
#: ``args`` kept as text (decode.TEXT_ARG_FIELDS): categorical string columns of the same names, NaN where absent
TEXT_ARG_COLUMNS: tuple[str, ...] = TEXT_ARG_FIELDS

_ARG_KEYS = frozenset(column for column, _ in INT_ARG_COLUMNS) | frozenset(TEXT_ARG_FIELDS)
_EVENT_FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args")
assert Event.__struct_fields__ == FastEvent.__struct_fields__ == _EVENT_FIELDS  # chunk_columns unpacks by position
_INT_ARG_NAMES = tuple(column for column, _ in INT_ARG_COLUMNS)
_INT_ARG_OF = {attr: column for column, attr in INT_ARG_COLUMNS}  # Args field -> column
_TEXT_ARG_SET = frozenset(TEXT_ARG_FIELDS)
_LEGACY_RANGE = re.compile(r"^(ProfilerStep#\d+|Optimizer\.(step|zero_grad)#|enumerate\(DataLoader\)#|##)")
_EXACT_TS_LIMIT_US = float(2**42)  # beyond this a float64 of microseconds cannot hold whole nanoseconds


class _TsText(msgspec.Struct):
    ts: Any = None


_TS_TEXT = msgspec.json.Decoder(list[_TsText], float_hook=str)


def _code_dtype(categories: int) -> type:
    """The smallest signed integer type that holds codes for ``categories`` values and -1."""
    if categories < 127:
        return np.int8
    if categories < 32767:
        return np.int16
    return np.int32


def _all_null(n: int) -> np.ndarray:
    """A read-only int64 column of ``n`` NULLs that takes no memory (stride 0)."""
    return np.broadcast_to(np.int64(NULL), (n,))


class _Interner:
    """Map strings to stable small integer codes across chunks (codes in order of first appearance)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []

    def _code(self, s: str) -> int:
        c = self.codes.get(s)
        if c is None:
            c = self.codes[s] = len(self.values)
            self.values.append(s)
        return c

    def encode(self, items: list[str]) -> np.ndarray:
        distinct, codes = _local_codes(items)
        return self.remap(distinct, codes)

    def remap(self, distinct: list[str], codes: np.ndarray) -> np.ndarray:
        """Chunk-local codes into ``distinct`` (in order of first appearance) -> codes of this interner."""
        local = np.fromiter((self._code(s) for s in distinct), dtype=np.int32, count=len(distinct))
        return local[codes]


def _local_codes(items: Any) -> tuple[list[str], np.ndarray]:
    """Strings or None (counted as ``""``; ``cat`` may be absent) -> (distinct strings in order of first
    appearance, int32 code per item). None is filled in by Arrow, not by a list comprehension first: a quarter
    less time for ``cat``, which most events carry."""
    try:  # Arrow finds the distinct strings in C
        arr = pa.array(items, pa.string())
        encoded = (pc.fill_null(arr, "") if arr.null_count else arr).dictionary_encode()
    except (pa.ArrowException, UnicodeError):  # e.g. lone surrogates from \ud800 escapes
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(s or "", len(index)) for s in items), dtype=np.int32, count=len(items))
        return list(index), codes
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy()


def _int_array(values: list[Any]) -> np.ndarray:
    """Python ints/None -> int64 numpy array with ``NULL`` for missing (pyarrow does the loop in C)."""
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = pa.array([v if isinstance(v, int) and -(2**63) < v < 2**63 else None for v in values], pa.int64())
    return pc.fill_null(arr, NULL).to_numpy()


def _float_column(values: Any, missing: float, text: pa.Array | None = None) -> np.ndarray:
    """ts/dur values (float, int, the text of a float or None) -> float64, ``missing`` for None.

    Text is parsed by Arrow, correctly rounded like msgspec and ``float()``; the result equals decoding floats.
    ``text``: the values as an Arrow string array, when the caller has it already.
    Arrow is tried first and refuses what it cannot take exactly (text, ints beyond 2**53): no scan of the values'
    types first (with :func:`_text_column`; scanning cost ts + dur about a third more time).
    """
    try:
        if text is not None:
            arr = text.cast(pa.float64())
        else:
            try:
                arr = pa.array(values, pa.float64())  # ints, floats and None
            except pa.ArrowInvalid:  # text (anything else fails here too)
                arr = pa.array(values, pa.string()).cast(pa.float64())
        if arr.null_count:
            arr = pc.fill_null(arr, missing)
        return arr.to_numpy(zero_copy_only=False).copy()
    except (pa.ArrowException, TypeError, OverflowError, UnicodeError):
        if text is not None:  # e.g. 1e400, which Arrow refuses and float() makes infinite
            values = text.to_pylist()
        return np.array([missing if v is None else float(v) for v in values], dtype=np.float64)


def _fast_ts_text(chunk: FastChunk) -> pa.Array:
    """A :class:`FastChunk`'s ``ts`` column as an Arrow string array (null where absent), from its buffers: no
    Python object per value. The text is ASCII (every value is a JSON number)."""
    offsets = chunk.ts_offsets
    n = len(offsets) - 1
    present = offsets[1:] != offsets[:-1]
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(chunk.ts_data)])


def _text_column(values: Any) -> pa.Array | None:
    """``ts`` values as an Arrow string array when all are text (or None, not all), else None.

    Arrow refuses ints and floats (``ts`` of :class:`Event`); the text of :class:`FastEvent` is taken by
    :func:`_fast_ts_text` instead.
    """
    try:
        text = pa.array(values, pa.string())
    except (pa.ArrowException, UnicodeError):
        return None
    return None if text.null_count == len(text) else text


_NS_PER_UNIT = np.array([1000, 100, 10, 1], dtype=np.int64)  # by number of decimals


def _exact_ts_fast(text: pa.Array | None) -> np.ndarray | None:
    """:func:`_exact_ts_ns` for plain decimal text with 1 to 3 decimals (``1712195495519689.047``): drop the dot,
    parse the digits as an integer, scale to nanoseconds. None when any value is not of that form."""
    if text is None or text.null_count or len(text) == 0:
        return None
    uniform = _exact_ts_uniform(text)
    if uniform is not None:
        return uniform
    dot = pc.find_substring(text, ".").to_numpy()
    decimals = pc.binary_length(text).to_numpy() - dot - 1
    if (dot < 1).any() or (decimals < 1).any() or (decimals > 3).any():
        return None
    try:
        digits = pc.replace_substring(text, ".", "", max_replacements=1).cast(pa.int64()).to_numpy()
    except pa.ArrowException:  # an exponent, a sign Arrow does not take, too many digits
        return None
    scale = _NS_PER_UNIT[decimals]
    limit = np.iinfo(np.int64).max // scale
    if ((digits > limit) | (digits < -limit)).any():
        return None
    return digits * scale


def _exact_ts_uniform(text: pa.Array) -> np.ndarray | None:
    """:func:`_exact_ts_fast` where every value has the same width, digits and one dot at the same place (Kineto
    writes ``%.3f`` of 16-digit microseconds): the digits are read from Arrow's data buffer as an (n, width)
    byte matrix by numpy, no string kernels: about twice as fast as the kernels.
    None when the values are not of that form (then the string kernels decide)."""
    n = len(text)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * text.offset)
    width = int(offsets[1] - offsets[0])
    if not 3 <= width <= 20 or (np.diff(offsets) != width).any():  # at most 19 digits: < 2**64
        return None
    data = np.frombuffer(text.buffers()[2], dtype=np.uint8, count=n * width, offset=int(offsets[0]))
    data = data.reshape(n, width)
    dot = int(np.argmax(data[0] == 46))  # '.'
    decimals = width - dot - 1
    if data[0, dot] != 46 or dot < 1 or not 1 <= decimals <= 3 or (data[:, dot] != 46).any():
        return None
    numbers = (np.delete(data, dot, axis=1) - np.uint8(48)).T.copy()  # wraps below '0': each digit must be <= 9
    if (numbers > 9).any():
        return None
    digits = numbers[0].astype(np.uint64)
    for column in numbers[1:]:  # Horner, one column of digits at a time (an integer matmul is 5x slower)
        digits *= np.uint64(10)
        digits += column
    scale = int(_NS_PER_UNIT[decimals])
    if int(digits.max()) > np.iinfo(np.int64).max // scale:
        return None
    return digits.astype(np.int64) * scale


def _flow_ids(values: tuple[Any, ...]) -> np.ndarray:
    """Flow ``id`` values -> int64 with ``NULL`` where missing or not an integer (string ids)."""
    if values.count(None) == len(values):  # no flow event in the chunk: one identity check per row
        return np.full(len(values), NULL, dtype=np.int64)
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _int_array([v if isinstance(v, int) else None for v in values])
    return pc.fill_null(arr, NULL).to_numpy()


_MAX_ABS_TS_US = 9.2e15  # int64 nanoseconds end near 9.22e18
_MAX_DUR_US = 1e12  # 11.6 days


def _us_to_ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (float64) -> int64 nanoseconds, rounding to the nearest nanosecond."""
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000).astype(np.int64)


def _exact_ts_ns(texts: list[Any]) -> np.ndarray:
    """Timestamps as decoded text (floats) or ints (whole microseconds) -> exact int64 nanoseconds."""
    as_text = [v if isinstance(v, str) else ("0" if v is None else str(v)) for v in texts]
    dec = pa.array(as_text, pa.string()).cast(pa.decimal128(30, 6))
    scaled = pc.multiply(dec, pa.scalar(1000, pa.decimal128(4, 0)))
    return pc.round(scaled, 0).cast(pa.int64()).to_numpy()


def _ids(values: Any, labels: dict[int, str]) -> np.ndarray:
    """pid/tid values (ints, numeric strings, labels) -> int64; a label gets a stable negative id.

    Not all ints (legacy traces write every tid as a string): each distinct value is converted once and the rows
    are mapped through a dict in C: ~5x faster than a per-row Python loop.
    """
    try:
        return np.array(values, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        pass
    known = dict.fromkeys(values)  # values are int, str or None: hashable, and equal only when the same
    for v in known:
        known[v] = _id_of(v, labels)
    return np.fromiter(map(known.__getitem__, values), dtype=np.int64, count=len(values))


def _id_of(v: Any, labels: dict[int, str]) -> int:
    """One pid/tid value -> int64 (see :func:`_ids`)."""
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) < v < 2**63:
        return v
    text = "" if v is None else str(v)
    try:
        number = int(text)
        if -(2**63) <= number < 2**63:
            return number
    except ValueError:  # a label, or a number beyond int64: keep it as a label
        pass
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=5).digest()
    key = -(1 + int.from_bytes(digest, "little"))
    labels[key] = text
    return key


def _json_text(raw: Any) -> str:
    """A text ``args`` value (msgspec.Raw) as a string: a JSON string unquoted, anything else as written."""
    data = bytes(raw)
    if data[:1] == b'"':
        try:
            value = msgspec.json.decode(data)
        except msgspec.DecodeError:
            value = None
        if isinstance(value, str):
            return value
    return data.decode("utf-8", "replace")


def _arg_columns(args: tuple[Any, ...]) -> tuple[dict[str, np.ndarray | None], dict[str, tuple[list[str], np.ndarray]]]:
    """The ``args`` columns of a chunk: integer columns (``NULL`` where missing; None where all are missing) and,
    per text field present, (distinct strings, int64 code per row, ``NULL`` where absent).

    One transposition of the events that have ``args`` (``astuple`` + ``zip``, in C) serves every field; a field
    absent from the chunk (most of them in most chunks) costs one ``tuple.count`` (identity checks). An integer
    field is a tuple of ints (absent keys decode as the shared ``ABSENT`` == ``NULL``, see decode.Args) that
    numpy converts in C; Arrow only where that fails (an explicit null, an int beyond int64). Rows are selected
    with ``itertools.compress`` / ``filter(None, ...)`` (structs and Raw values are truthy, None is not): C loops
    with no mask array. Each present text field is dictionary-encoded by Arrow (shapes repeat: few distinct texts
    reach Python). Against Arrow for every integer field, numpy masks from ``is_not`` and one Arrow call per text
    field, this takes about a third less CPU where a few events of every chunk carry a collective's text fields,
    and ~10% less where many events carry input shapes.
    """
    n = len(args)
    ints: dict[str, np.ndarray | None] = dict.fromkeys(_INT_ARG_NAMES)
    texts: dict[str, tuple[list[str], np.ndarray]] = {}
    present = list(filter(None, args))
    m = len(present)
    if not m:
        return ints, texts
    rows = None if m == n else np.fromiter(compress(range(n), args), dtype=np.int64, count=m)  # None: all rows
    hits = None  # rows (of ``present``) of the last text field
    for attr, values in zip(Args.__struct_fields__, zip(*map(astuple, present), strict=True), strict=True):
        column = _INT_ARG_OF.get(attr)
        if column is not None:
            if values.count(ABSENT) == m:
                continue
            try:
                found = np.fromiter(values, dtype=np.int64, count=m)  # ~25% less than np.array (no shape search)
            except (TypeError, OverflowError, ValueError):  # an explicit null, an int beyond int64, a string
                found = _int_array([integer_value(v) if isinstance(v, str) else v for v in values])
            ints[column] = _scatter(found, rows, n)
        elif attr in _TEXT_ARG_SET:
            k = m - values.count(None)
            if not k:
                continue
            # text fields come in groups on the same events (a collective's name, dtype, process group): the rows
            # of the previous field are checked (k items) instead of found again (m items)
            if hits is None or len(hits) != k or None in _take(values, hits):
                hits = np.fromiter(compress(range(m), values), dtype=np.int64, count=k)
            codes = np.full(n, NULL, dtype=np.int64)
            distinct, local = _text_codes(list(map(bytes, filter(None, values))))
            codes[hits if rows is None else rows[hits]] = local
            texts[attr] = ([_json_text(b) for b in distinct], codes)
    return ints, texts


def _take(values: tuple[Any, ...], index: np.ndarray) -> tuple[Any, ...]:
    """``values[i] for i in index`` as a tuple, the loop in C (itemgetter)."""
    return (values[int(index[0])],) if len(index) == 1 else itemgetter(*index.tolist())(values)


def _text_codes(items: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """Distinct byte strings in order of first appearance and a code per item: Arrow's ``dictionary_encode``, or
    a dict for a few items (Arrow costs ~0.1 ms per call, a dict ~0.1 us per item: with an Arrow call each, the
    text fields of a few collectives were a tenth of a chunk's time)."""
    if len(items) < 256:
        index: dict[bytes, int] = {}
        codes = [index.setdefault(b, len(index)) for b in items]
        return list(index), np.array(codes, dtype=np.int64)
    encoded = pa.array(items, pa.binary()).dictionary_encode()
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy()


def _scatter(values: np.ndarray, rows: np.ndarray | None, n: int) -> np.ndarray:
    """``values`` of the rows ``rows`` (None: all rows) into a column of ``n`` rows, ``NULL`` elsewhere."""
    if rows is None:
        return values
    out = np.full(n, NULL, dtype=np.int64)
    out[rows] = values
    return out


@dataclass
class ChunkColumns:
    """One decoded chunk as columns; strings as codes into chunk-local lists (see :func:`chunk_columns`)."""

    rows: int
    cols: dict[str, np.ndarray | None]  # None: an int64 column where every value is NULL
    ph: list[str]
    cat: list[str]
    name: list[str]
    pid_labels: dict[int, str]
    tid_labels: dict[int, str]
    metadata: list[tuple[str, int, int, str]]  # (event name, pid, tid, args.name) of "M" events with a name
    texts: dict[str, list[str]] = field(default_factory=dict)  # text args column -> its chunk-local values


def chunk_columns(events: list[Event] | list[FastEvent], raw_chunk: bytes | None = None) -> ChunkColumns:
    """Turn one decoded chunk into columns; ``raw_chunk`` is its JSON text when it decoded without repairs."""
    n = len(events)
    ph, name, cat, ts_values, dur_values, pid, tid, flow, args = zip(*map(astuple, events), strict=True)
    cols: dict[str, np.ndarray | None] = {}
    ph_values, cols["ph_code"] = _local_codes(ph)
    cat_values, cols["cat_code"] = _local_codes(cat)
    name_values, cols["name_code"] = _local_codes(name)
    del ph, cat
    if isinstance(events, FastChunk):  # ts as JSON text (numbers, or empty where absent)
        text = _fast_ts_text(events)
        ts = _float_column(None, np.nan, text)
    else:
        text = _text_column(ts_values)
        ts = _float_column(ts_values, np.nan, text)
    dur = _float_column(dur_values, 0.0)
    del dur_values
    missing_ts = np.isnan(ts)
    # absurd values (overflow int64 ns, infinities, durations over 11 days) would poison every sum: drop them
    absurd = ~missing_ts & ((np.abs(ts) > _MAX_ABS_TS_US) | ~np.isfinite(ts))
    absurd |= ~np.isfinite(dur) | (np.abs(dur) > _MAX_DUR_US)
    ts[missing_ts | absurd] = 0.0
    dur[absurd] = 0.0
    if raw_chunk is not None and np.abs(ts).max(initial=0.0) >= _EXACT_TS_LIMIT_US and (ts % 1).any():
        if not isinstance(events, FastChunk):  # floats were parsed: read the timestamps' text again
            ts_values = [t.ts for t in _TS_TEXT.decode(raw_chunk)]
            text = None
        exact = _exact_ts_fast(text)
        if exact is None and text is not None:
            ts_values = text.to_pylist()
        cols["ts_ns"] = exact if exact is not None else _exact_ts_ns(ts_values)
    else:
        cols["ts_ns"] = _us_to_ns(ts)
    del ts_values, ts, text
    cols["ts_missing"] = missing_ts
    cols["absurd_time"] = absurd
    cols["dur_ns"] = np.maximum(_us_to_ns(dur), 0)
    cols["negative_dur"] = dur < 0
    del dur
    pid_labels: dict[int, str] = {}
    tid_labels: dict[int, str] = {}
    cols["pid"] = _ids(pid, pid_labels)
    cols["tid"] = _ids(tid, tid_labels)
    del pid, tid
    int_args, found = _arg_columns(args)
    cols.update(int_args)
    texts = {}
    for column in TEXT_ARG_COLUMNS:  # every key, None where absent (like the int args: NULL-filled when stored)
        values, cols[column] = found.get(column, ([], None))
        if cols[column] is not None:
            texts[column] = values
    cols["flow_id"] = _flow_ids(flow)
    metadata = []
    if "M" in ph_values:
        for i in np.flatnonzero(cols["ph_code"] == ph_values.index("M")).tolist():
            a = args[i]
            if a is not None and a.name is not None:
                metadata.append((name[i], int(cols["pid"][i]), int(cols["tid"][i]), a.name))
    return ChunkColumns(n, cols, ph_values, cat_values, name_values, pid_labels, tid_labels, metadata, texts)


class EventTableBuilder:
    """Accumulate decoded chunks into one columnar table."""

    def __init__(self, expected_rows: int = 0) -> None:
        self.expected_rows = expected_rows  # capacity to start with (an estimate from the input's size)
        self.names = _Interner()
        self.texts = {column: _Interner() for column in TEXT_ARG_COLUMNS}
        self.cats = _Interner()
        self.phs = _Interner()
        self.pid_labels: dict[int, str] = {}
        self.tid_labels: dict[int, str] = {}
        self.columns: dict[str, np.ndarray] = {}  # preallocated, ``capacity`` rows, the first ``rows`` filled
        self.capacity = 0
        self.rows = 0
        self.seen: set[str] = set()  # args columns with a value so far
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.position = 0  # events appended so far, the rows dropped while appending included
        # rows dropped while appending (no ts, absurd times): counted here, never stored
        self.dropped = {"dropped_missing_ts": 0, "dropped_absurd_time": 0, "negative_dur": 0}

    def add(self, events: list[Event] | list[FastEvent], raw_chunk: bytes | None = None) -> None:
        """Append one decoded chunk; ``raw_chunk`` is its JSON text when it decoded without repairs."""
        if events:
            self.append(chunk_columns(events, raw_chunk))

    def append(self, chunk: ChunkColumns) -> None:
        """Append a chunk made by :func:`chunk_columns` (here or in another process)."""
        cols = chunk.cols
        cols["ph_code"] = self.phs.remap(chunk.ph, cols["ph_code"])
        cols["cat_code"] = self.cats.remap(chunk.cat, cols["cat_code"])
        cols["name_code"] = self.names.remap(chunk.name, cols["name_code"])
        for column, values in chunk.texts.items():
            codes = cols[column]
            present = codes != NULL
            codes[present] = self.texts[column].remap(values, codes[present])
        self.pid_labels.update(chunk.pid_labels)
        self.tid_labels.update(chunk.tid_labels)
        for event_name, pid, tid, label in chunk.metadata:
            if event_name == "process_name":
                self.process_names[pid] = label
            elif event_name == "thread_name":
                self.thread_names[(pid, tid)] = label
        n = self._drop_invalid(cols, chunk.rows, chunk.ph)
        self.position += chunk.rows
        self._store(cols, n)

    def _drop_invalid(self, cols: dict[str, np.ndarray | None], n: int, ph: list[str]) -> int:
        """Take the rows :meth:`build` would drop (no ts and not metadata, absurd times) out of a chunk's
        columns before they are stored, counting them; the rows left.

        Stored, they cost ~55 bytes each until the end (and twice that while a column grows): a trace of ``{}``
        events took ~5x the memory estimate. Once a row has been dropped, each row stores its
        position in the array (``trace_index``), which is otherwise the row number.
        """
        metadata = ph.index("M") if "M" in ph else -1  # chunk-local code, as build's kind "metadata"
        missing = cols["ts_missing"] & (cols["ph_code"] != metadata)
        invalid = missing | cols["absurd_time"]
        positions = None
        if invalid.any():
            keep = ~invalid
            self.dropped["dropped_missing_ts"] += int(missing.sum())
            self.dropped["dropped_absurd_time"] += int(cols["absurd_time"].sum())
            self.dropped["negative_dur"] += int((cols["negative_dur"] & invalid).sum())
            for key, values in cols.items():
                if values is not None:
                    cols[key] = values[keep]
            positions = np.flatnonzero(keep) + self.position
            if "trace_index" not in self.columns:  # the first gap: the rows so far are at their own positions
                column = self.columns["trace_index"] = np.empty(self.capacity, dtype=np.int64)
                column[: self.rows] = np.arange(self.rows, dtype=np.int64)
            n = len(positions)
        if "trace_index" in self.columns:
            cols["trace_index"] = positions if positions is not None else np.arange(self.position, self.position + n)
        return n

    def _store(self, cols: dict[str, np.ndarray | None], n: int) -> None:
        """Copy a chunk's columns into the preallocated ones (no list of chunks, no concatenation at the end).

        Capacity starts at ``expected_rows`` (an estimate from the input's size, so a small trace reserves little
        address space and runs under a low ``ulimit -v``) and doubles; pages the rows do not reach are never
        touched, so they take address space but no memory. An args column is written only from its first chunk
        with a value on (then the rows before are filled with NULL); one that never gets a value is never written.
        """
        end = self.rows + n
        if end > self.capacity:
            capacity = max(_INITIAL_ROWS, self.expected_rows, 2 * self.capacity, end)
            for key, old in self.columns.items():  # one column at a time: the extra memory is one column
                grown = np.empty(capacity, dtype=old.dtype)
                if key in self.seen or key not in _ARG_KEYS:  # an args column without values yet holds nothing
                    grown[: self.rows] = old[: self.rows]
                self.columns[key] = grown
                del old
            self.capacity = capacity
        for key, values in cols.items():
            column = self.columns.get(key)
            if column is None:
                dtype = np.int64 if values is None else values.dtype
                column = self.columns[key] = np.empty(self.capacity, dtype=dtype)
            if values is None:
                if key in self.seen:
                    column[self.rows : end] = NULL
            else:
                if key not in self.seen and key in _ARG_KEYS:
                    self.seen.add(key)
                    column[: self.rows] = NULL
                column[self.rows : end] = values
        self.rows = end

    def build(self) -> pd.DataFrame:
        """The event DataFrame (its columns are views of the filled rows, no copies)."""
        if not self.rows:
            frame = empty_event_frame()
            frame.attrs.update(self.dropped)
            return frame
        merged = {key: column[: self.rows] for key, column in self.columns.items()}
        self.columns = {}
        kind = self._kinds(merged["ph_code"], merged["cat_code"], merged["name_code"])
        positions = merged.pop("trace_index", None)
        columns = {
            "trace_index": np.arange(self.rows, dtype=np.int64) if positions is None else positions,
            "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
            "category": pd.Categorical.from_codes(merged.pop("cat_code"), categories=self.cats.values),
            "ph": pd.Categorical.from_codes(merged.pop("ph_code"), categories=self.phs.values),
            "name": pd.Categorical.from_codes(merged.pop("name_code"), categories=self.names.values),
            "ts_ns": merged.pop("ts_ns"),
            "dur_ns": merged.pop("dur_ns"),
            "pid": merged.pop("pid"),
            "tid": merged.pop("tid"),
        }
        for column, _ in INT_ARG_COLUMNS:
            # an args key absent from the whole trace (memory, Python ids in most traces): one NULL repeated
            # (read-only, no memory) instead of 8 bytes per row
            columns[column] = merged.pop(column) if column in self.seen else _all_null(self.rows)
        for column in TEXT_ARG_COLUMNS:
            columns[column] = self._text_column(merged.pop(column, None), column)
        columns["flow_id"] = merged.pop("flow_id")
        frame = pd.DataFrame(columns, copy=False)
        del columns
        invalid = merged["ts_missing"] & (kind != KIND_CODE["metadata"])
        frame.attrs["dropped_missing_ts"] = int(invalid.sum()) + self.dropped["dropped_missing_ts"]
        frame.attrs["dropped_absurd_time"] = int(merged["absurd_time"].sum()) + self.dropped["dropped_absurd_time"]
        invalid |= merged["absurd_time"]
        frame.attrs["negative_dur"] = int(merged["negative_dur"].sum()) + self.dropped["negative_dur"]
        if invalid.any():
            frame = frame.loc[~invalid].reset_index(drop=True)
        return frame

    def _text_column(self, codes: np.ndarray | None, column: str) -> pd.Categorical:
        """Interned codes (``NULL`` where absent) -> a categorical of the column's strings, NaN where absent."""
        categories = self.texts[column].values
        if codes is None or column not in self.seen:
            small = np.full(self.rows, -1, dtype=np.int8)
            return pd.Categorical.from_codes(small, categories=categories)
        small = np.where(codes == NULL, -1, codes).astype(_code_dtype(len(categories)))
        return pd.Categorical.from_codes(small, categories=categories)

    def _kinds(self, ph_code: np.ndarray, cat_code: np.ndarray, name_code: np.ndarray) -> np.ndarray:
        ph_kind = np.full(len(self.phs.values), KIND_CODE["other"], dtype=np.int8)
        for i, ph in enumerate(self.phs.values):
            ph_kind[i] = {
                "M": KIND_CODE["metadata"],
                "s": KIND_CODE["flow_start"],
                "f": KIND_CODE["flow_end"],
                "t": KIND_CODE["flow_end"],
                "i": KIND_CODE["instant"],
                "I": KIND_CODE["instant"],
            }.get(ph, -1)
        cat_kind = np.array([KIND_CODE[CATEGORY_KIND.get(c, "other")] for c in self.cats.values], dtype=np.int8)
        kind = ph_kind[ph_code]
        complete = kind == -1
        kind[complete] = cat_kind[cat_code[complete]]
        legacy_ops = np.array([c == "Operator" for c in self.cats.values], dtype=bool)
        if legacy_ops.any():  # 2021 traces file record_function ranges under "Operator" too
            ranges = np.array([_LEGACY_RANGE.match(n) is not None for n in self.names.values], dtype=bool)
            kind[legacy_ops[cat_code] & ranges[name_code]] = KIND_CODE["user_annotation"]
        memory_code = self.names.codes.get("[memory]")
        if memory_code is not None:
            kind[(kind == KIND_CODE["instant"]) & (name_code == memory_code)] = KIND_CODE["memory"]
        return kind


def empty_event_frame() -> pd.DataFrame:
    """An event table with every column and no rows."""
    cols: dict[str, Any] = {
        "trace_index": np.array([], np.int64),
        "kind": pd.Categorical([], categories=list(KINDS)),
        "category": pd.Categorical([]),
        "ph": pd.Categorical([]),
        "name": pd.Categorical([]),
        "ts_ns": np.array([], np.int64),
        "dur_ns": np.array([], np.int64),
        "pid": np.array([], np.int64),
        "tid": np.array([], np.int64),
    }
    for column, _ in INT_ARG_COLUMNS:
        cols[column] = np.array([], np.int64)
    for column in TEXT_ARG_COLUMNS:
        cols[column] = pd.Categorical([])
    cols["flow_id"] = np.array([], np.int64)
    frame = pd.DataFrame(cols)
    frame.attrs.update(dropped_missing_ts=0, negative_dur=0)
    return frame


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


def _load_malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc keeps it otherwise): big numpy arrays come from fresh
    mappings, not from that kept memory, so without this it only inflates the resident size. Takes a few ms."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


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


class _Slots:
    """Chunk buffers in memory shared with forked workers: the reader copies a chunk's text in once (as a JSON
    array) and a worker decodes it in place, instead of pickling it through a pipe."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.memory = mmap.mmap(-1, count * size)  # anonymous and shared: forked workers see the same pages

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

    def close(self) -> None:
        try:
            self.memory.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the last reference
            pass


_SLOTS: _Slots | None = None  # set before the workers fork, so they inherit the mapping


def _decode_body(body: bytes | None, slot: int = -1, length: int = 0) -> tuple[ChunkColumns | None, int, dict] | None:
    """Worker side of the parallel reader: decode one chunk (``body``, or ``length`` bytes of shared ``slot``)
    into columns; None if it does not decode."""
    decoder = TraceDecoder("")
    try:
        if body is None:
            data = _SLOTS.view(slot, length)  # type: ignore[union-attr]
            events, raw = decoder.decode_array(data)
        else:
            events, raw = decoder._decode(body)
            del body
        chunk = chunk_columns(events, raw) if events else None
        del raw
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


def _read_parallel(decoder: TraceDecoder, builder: EventTableBuilder, workers: int, progress: Any) -> bool:
    """Decode the chunks in ``workers`` forked processes, in file order; False if a chunk needs the sequential
    reader (then nothing of this attempt is to be used)."""
    global _SLOTS
    pending: deque[Future] = deque()
    slots = _Slots(workers + 2, decoder.chunk_bytes + (1 << 20))
    _SLOTS = slots
    try:
        pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        )
    except (OSError, ValueError):
        slots.close()
        return False

    def take_in(future: Future) -> bool:
        try:
            result = future.result()
        except BrokenProcessPool:  # a worker died (e.g. killed for memory): read sequentially instead
            return False
        if result is None:
            return False
        chunk, events, dropped = result
        if chunk is not None:
            builder.append(chunk)
        decoder.report.events_read += events
        for reason, count in dropped.items():
            decoder.report.drop(reason, count)
        if progress is not None:
            progress(decoder.report.bytes_read)
        return True

    def take_in_all() -> bool:
        while pending:
            if not take_in(pending.popleft()):
                return False
        return True

    chunks = 0
    try:
        for item in decoder.bodies():
            if isinstance(item, memoryview):
                # chunk number ``chunks`` goes to slot ``chunks % count``: the chunk that used it must be in
                while len(pending) >= slots.count - 1:
                    if not take_in(pending.popleft()):
                        return False
                slot = chunks % slots.count
                length = slots.put(slot, item)
                try:
                    if length is None:  # bigger than a slot: send the text itself
                        future = pool.submit(_decode_body, bytes(item))
                    else:
                        future = pool.submit(_decode_body, None, slot, length)
                except (OSError, RuntimeError, AssertionError, BrokenProcessPool):
                    return False  # no processes here (e.g. inside a daemonic worker)
                del item
                pending.append(future)
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
            f"{path}: out of memory while reading it ({_memory_left()}); run it where more memory is free"
        ) from None


def _memory_left() -> str:
    """What :func:`memory_budget` says is left, for a message."""
    budget, source = memory_budget()
    return "no limit known" if budget is None else f"{budget >> 20} MiB {source}"


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
            decoder = TraceDecoder(path, strict=strict, **kwargs)
            builder = EventTableBuilder(rows)
            done = _read_parallel(decoder, builder, processes, progress)
        if not done:
            decoder = TraceDecoder(path, strict=strict, **kwargs)
            builder = EventTableBuilder(rows)
            for events, raw in decoder.chunks_with_text():
                builder.add(events, raw)
                del events, raw  # free the chunk before the next one is decoded
                if progress is not None:
                    progress(decoder.report.bytes_read)
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
