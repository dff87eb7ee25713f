"""Streaming decoder for Kineto Chrome traces (``.json`` or ``.json.gz``).

The ``traceEvents`` array is cut into chunks of whole events and each chunk is decoded with msgspec into typed
structs that keep only the fields profparse uses, so memory stays bounded by the chunk size, not the file size.
A file cut short (``.json`` or ``.json.gz``) yields every complete event before the cut and is reported as
truncated. A malformed event in the middle is skipped and counted: after a decode error the reader finds the
error's position (from msgspec's message, or by search), keeps the events before it and resynchronises at the next
event boundary once, so every byte is decoded a bounded number of times whatever the damage (linear time).
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from profparse.base.errors import (
    InputNotFoundError,
    OutOfMemoryError,
    TraceFormatError,
    TruncatedTraceError,
    UsageError,
)

CHUNK_BYTES = 1 << 20  # small chunks keep the decoded objects in cache and the allocator reusing memory
MAX_HEADER_BYTES = 256 << 20
MAX_EVENT_BYTES = 64 << 20  # a single event larger than this is hostile or corrupt: refuse, keep memory bounded
MAX_SKIPPED_FRACTION = 0.01  # more of the events' bytes malformed than this: too damaged for totals to mean much
MEMORY_ENV = "PROFPARSE_MEMORY_LIMIT"
# peak memory ~ NEED_PER_JSON_BYTE x the JSON + NEED_FIXED: the peak that docs/performance.md reports, on top of
# what Python, pandas and pyarrow take themselves
NEED_PER_JSON_BYTE = 1.5
NEED_FIXED = 128 << 20
BYTES_PER_EVENT = 200  # Kineto events take 200-250 bytes of JSON: sizes the event table before reading
# at most this many events decoded at once (counted as '{' bytes, at least one per event): a chunk of Kineto
# events holds 4,000-6,000 of them (7,000-11,000 '{'), but a chunk of tiny events ('{}') holds ~50x more, whose
# objects and columns at once went far above the estimate (NEED_PER_JSON_BYTE); this many take a few MB
MAX_CHUNK_EVENTS = 1 << 14

Num = int | float
ABSENT = -(2**63)  # an integer ``args`` key not in the event (see :class:`Args`); == events.NULL


class Args(
    msgspec.Struct,
    gc=False,
    rename={
        "external_id": "External id",
        "sequence_number": "Sequence number",
        "fwd_thread_id": "Fwd thread id",
        "mem_bytes": "Bytes",
        "total_allocated": "Total Allocated",
        "total_reserved": "Total Reserved",
        "device_type": "Device Type",
        "device_id": "Device Id",
        "addr": "Addr",
        "python_id": "Python id",
        "python_parent_id": "Python parent id",
        "comm_in_nelems": "In msg nelems",
        "comm_out_nelems": "Out msg nelems",
        "comm_group_size": "Group size",
        "comm_seq": "Seq",
        "input_dims": "Input Dims",
        "input_types": "Input type",
        "concrete_inputs": "Concrete Inputs",
        "collective": "Collective name",
        "comm_dtype": "dtype",
        "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description",
        "pg_ranks": "Process Group Ranks",
    },
):
    """The ``args`` keys profparse reads; all others are skipped without being materialised.

    An integer key that is absent decodes as :data:`ABSENT` (one shared int, the event table's NULL), not None:
    a column of a chunk is then a tuple of ints that numpy converts in C, and one without any value is found by
    ``tuple.count(ABSENT)`` (an identity check per item). None is left for an explicit JSON ``null``. A string is
    accepted too (ROCm traces write a runtime call's ``stream`` as ``"0x0"``) and turned into an int, or NULL, as
    :func:`coerce_event` does, by :func:`profparse.trace.events.chunk_columns`: a chunk with one such event used to
    fail the fast decoding and be decoded event by event (see profparse.trace.events._arg_columns).
    """

    correlation: int | str | None = ABSENT
    external_id: int | str | None = ABSENT
    sequence_number: int | str | None = ABSENT
    fwd_thread_id: int | str | None = ABSENT
    stream: int | str | None = ABSENT
    device: int | str | None = ABSENT
    bytes: int | str | None = ABSENT
    mem_bytes: int | str | None = ABSENT
    total_allocated: int | str | None = ABSENT
    total_reserved: int | str | None = ABSENT
    device_type: int | str | None = ABSENT
    device_id: int | str | None = ABSENT
    addr: int | str | None = ABSENT
    python_id: int | str | None = ABSENT
    python_parent_id: int | str | None = ABSENT
    comm_in_nelems: int | str | None = ABSENT
    comm_out_nelems: int | str | None = ABSENT
    comm_group_size: int | str | None = ABSENT
    comm_seq: int | str | None = ABSENT
    name: str | None = None
    # kept as the JSON text as written (msgspec.Raw: a slice of the input, no Python objects built), None when
    # absent; turned into categorical string columns by events.chunk_columns (shapes repeat: few distinct values)
    input_dims: msgspec.Raw = None  # type: ignore[assignment]
    input_types: msgspec.Raw = None  # type: ignore[assignment]
    concrete_inputs: msgspec.Raw = None  # type: ignore[assignment]
    collective: msgspec.Raw = None  # type: ignore[assignment]
    comm_dtype: msgspec.Raw = None  # type: ignore[assignment]
    pg_name: msgspec.Raw = None  # type: ignore[assignment]
    pg_desc: msgspec.Raw = None  # type: ignore[assignment]
    pg_ranks: msgspec.Raw = None  # type: ignore[assignment]


TEXT_ARG_FIELDS = (
    "input_dims",
    "input_types",
    "concrete_inputs",
    "collective",
    "comm_dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
)


class Event(msgspec.Struct, gc=False):
    """One entry of ``traceEvents`` with the fields profparse uses."""

    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: Num | None = None
    dur: Num | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None


NO_TS = msgspec.Raw(b"")  # FastEvent.ts of an event without ``ts``


class FastEvent(msgspec.Struct, gc=False):
    """:class:`Event` with ``ts`` kept as the JSON text (msgspec.Raw: a view into the decoded text; :data:`NO_TS`
    when absent).

    The text keeps nanosecond digits that a float64 of microseconds loses, so one decoding pass serves both the
    float and the exact timestamp paths. A chunk where a ``ts`` is not a number (null, a string) is decoded again
    with :class:`Event` and repaired event by event. Raw instead of a ``float_hook`` that made a str per float:
    msgspec no longer calls back into Python per event (decoding alone ~15% faster), and the column is built from
    one ``bytes.join`` (:class:`FastChunk`) instead of an Arrow conversion of the str objects. Where ``ts`` are
    whole microseconds (legacy traces: ints, no hook before) decoding is ~10% slower and the columns ~8% faster:
    the same worker CPU.
    """

    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: msgspec.Raw = NO_TS
    dur: Num | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None


class FastChunk(list):
    """A decoded chunk of :class:`FastEvent` with its ``ts`` values as one text column: ``ts_data`` (every value's
    text, one after another) and ``ts_offsets`` (int32, one more than the events; an empty value: no ``ts``)."""

    __slots__ = ("ts_data", "ts_offsets")

    ts_data: bytes
    ts_offsets: np.ndarray


def _fast_chunk(fast: list[FastEvent]) -> FastChunk | None:
    """``fast`` with its ``ts`` column, or None when a ``ts`` is not a number (its text does not start with a
    digit or ``-``: null, a string, an object; msgspec checked the syntax, so one that does is a JSON number)."""
    values = list(map(_GET_TS, fast))
    lengths = np.fromiter(map(len, values), dtype=np.int32, count=len(values))
    data = b"".join(values)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    first = np.frombuffer(data, dtype=np.uint8)[offsets[:-1][lengths > 0]]
    if not (((first >= 48) & (first <= 57)) | (first == 45)).all():
        return None
    chunk = FastChunk(fast)
    chunk.ts_data, chunk.ts_offsets = data, offsets
    return chunk


class LooseEvent(msgspec.Struct):
    """Fallback shape for events whose fields have unexpected types; cleaned by :func:`coerce_event`."""

    ph: Any = ""
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    args: Any = None


_STRICT = msgspec.json.Decoder(list[Event])
_FAST = msgspec.json.Decoder(list[FastEvent])
_GET_TS = attrgetter("ts")
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ONE_STRICT = msgspec.json.Decoder(Event)
_ONE_LOOSE = msgspec.json.Decoder(LooseEvent)
_ARGS = msgspec.json.Decoder(Args)
_HEADER = msgspec.json.Decoder(dict[str, Any])
_TRAILER_RAW = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()

Decoded = tuple[list[Event] | list[FastEvent], bytes | None]

_BLANKS = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.lstrip() removes
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
_NEXT_EVENT = re.compile(rb"}\s*,\s*{")  # a plausible start of the next event, to resynchronise after an error
_NONFINITE = re.compile(rb"(?<=[:,\[])(\s*)-?(?:NaN|Infinity)(?=\s*[,}\]])")  # written by Python's json module
_NONFINITE_AT = re.compile(rb"-?(?:NaN|Infinity)")
_SCAN_BLOCK = 1 << 22
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark: accepted at the start, as JSON readers do
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # a surrogate escape, \ud800 to \udfff
_REPLACEMENT = b"\\ufffd"  # as long as the escape it replaces: offsets stay valid


class ReadSequentially(Exception):
    """Raised by :meth:`TraceDecoder.bodies` where only :meth:`TraceDecoder.chunks_with_text` can go on."""


@dataclass
class DecodeReport:
    """What the decoder noticed while reading: counts and where the file ended."""

    path: str
    bytes_read: int = 0
    events_read: int = 0
    truncated: bool = False
    truncated_at_byte: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    malformed_at_byte: int | None = None  # the first malformed event skipped
    skipped_bytes: int = 0  # bytes of malformed events skipped
    nonfinite_values: int = 0  # NaN / Infinity tokens, read as non-finite floats
    trailing_bytes: int = 0  # bytes after the end of the JSON document, ignored
    lone_surrogates: int = 0  # surrogate escapes (\ud800) without their pair, read as U+FFFD
    events_end_byte: int | None = None  # offset of the ']' that closes traceEvents (in the uncompressed text)
    document_end_byte: int | None = None  # offset just after the '}' that closes the document

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def integer_value(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


_GET_TEXT_ARGS = attrgetter(*TEXT_ARG_FIELDS)
_NO_TEXT = (None,) * len(TEXT_ARG_FIELDS)


def _own_text_args(events: list[Any]) -> None:
    """Replace each text ``args`` field and :class:`FastEvent` ``ts`` (a msgspec.Raw: a view into the chunk's
    buffer, which is reused or released after decoding) by its own bytes. Only a retry after a decode error gets
    here (a first decode reads a copy of the text)."""
    if isinstance(events, FastChunk):
        for event in events:
            event.ts = msgspec.Raw(bytes(event.ts))
    for event in events:
        args = event.args
        if args is None or _GET_TEXT_ARGS(args) == _NO_TEXT:
            continue
        for field_name in TEXT_ARG_FIELDS:
            value = getattr(args, field_name)
            if value is not None:
                setattr(args, field_name, bytes(value))


def _raw_json(value: Any) -> msgspec.Raw | None:
    """A loosely decoded value as JSON text again (a text ``args`` field), or None when it cannot be encoded."""
    try:
        return msgspec.Raw(msgspec.json.encode(value))
    except (TypeError, ValueError, OverflowError):
        return None


def coerce_event(loose: LooseEvent, report: DecodeReport) -> Event | None:
    """Repair an event with odd field types, or drop it (counted in ``report``) when it cannot be used."""
    ph = loose.ph if isinstance(loose.ph, str) else ""
    ts = _number(loose.ts)
    if ph in ("X", "i", "I", "s", "f", "t", "B", "E") and ts is None:
        report.drop("missing or non-numeric ts")
        return None
    dur = _number(loose.dur)
    if ph == "X" and dur is None:
        report.drop("complete event without numeric dur")
        return None
    args: Args | None = None
    if isinstance(loose.args, dict):
        clean: dict[str, Any] = {}
        for field_name in Args.__struct_fields__:
            key = Args.__struct_encode_fields__[Args.__struct_fields__.index(field_name)]
            if key in loose.args:
                raw = loose.args[key]
                if field_name in TEXT_ARG_FIELDS:
                    clean[field_name] = _raw_json(raw)
                elif field_name == "name":
                    clean[field_name] = raw if isinstance(raw, str) else None
                else:
                    clean[field_name] = integer_value(raw)
        args = Args(**clean)
    pid = loose.pid if isinstance(loose.pid, int | str) and not isinstance(loose.pid, bool) else None
    tid = loose.tid if isinstance(loose.tid, int | str) and not isinstance(loose.tid, bool) else None
    flow_id = loose.id if isinstance(loose.id, int | str) and not isinstance(loose.id, bool) else None
    return Event(
        ph=ph,
        name=loose.name if isinstance(loose.name, str) else str(loose.name),
        cat=loose.cat if isinstance(loose.cat, str) else None,
        ts=ts,
        dur=dur,
        pid=pid,
        tid=tid,
        id=flow_id,
        args=args,
    )


def _size(text: str) -> int:
    """``"1.5G"``, ``"800M"``, ``"123456"`` -> bytes (binary units)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if found is None:
        raise UsageError(f"{MEMORY_ENV}={text!r}: expected a size such as 4G, 800M or a number of bytes")
    return int(float(found.group(1)) * units[found.group(2).upper()])


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def memory_budget() -> tuple[int | None, str]:
    """Bytes this process may still take, and what says so: ``$PROFPARSE_MEMORY_LIMIT``, else the smaller of
    ``MemAvailable`` (/proc/meminfo) and the address-space limit (``ulimit -v``) minus what is mapped already."""
    env = os.environ.get(MEMORY_ENV, "").strip()
    if env:
        return _size(env), f"allowed by {MEMORY_ENV}"
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "available"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            mapped = 0
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmSize:"):
                    mapped = int(line.split()[1]) * 1024
            found.append((max(soft - mapped, 0), "left under the address-space limit (ulimit -v)"))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(found) if found else (None, "")


class _Gunzip:
    """A gzip stream reader that tells a cut file (``truncated``: every byte before the cut is returned, then EOF)
    from corrupt data (:class:`TraceFormatError`), reads concatenated members and ignores zero padding.

    ``gzip.GzipFile`` raises ``EOFError`` on a cut stream and loses what it inflated in that read.
    """

    def __init__(self, raw: BinaryIO, path: str) -> None:
        self.raw, self.path = raw, path
        self._z = zlib.decompressobj(31)
        self._input = b""  # compressed bytes not yet given to the decompressor
        self._in_member = False
        self.eof = False
        self.truncated = False

    def __enter__(self) -> _Gunzip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()

    def compressed_offset(self) -> int:
        """Bytes of the file consumed so far (for projecting the inflated size)."""
        return self.raw.tell() - len(self._input) - len(self._z.unconsumed_tail)

    def _feed(self) -> bytes | None:
        """The next compressed bytes for the decompressor; None at the end of the input."""
        if self._z.unconsumed_tail:
            return self._z.unconsumed_tail
        data, self._input = self._input or self.raw.read(1 << 16), b""
        if not self._in_member:  # between members: another gzip member, zero padding, or the end
            while 0 < len(data) < 2:
                more = self.raw.read(1 << 16)
                if not more:
                    break
                data += more
            if not data or not data.startswith(b"\x1f\x8b"):
                self.eof = True  # trailing zero padding or bytes after the last member are ignored, like gzip
                return None
            self._in_member = True
        if not data:
            self.truncated = self.eof = True
            return None
        return data

    def read(self, n: int) -> bytes:
        out: list[bytes] = []
        got = 0
        while got < n and not self.eof:
            data = self._feed()
            if data is None:
                break
            try:
                piece = self._z.decompress(data, n - got)
            except zlib.error as exc:
                raise TraceFormatError(f"{self.path}: corrupt compressed data ({exc})") from None
            if piece:
                out.append(piece)
                got += len(piece)
            if self._z.eof:
                self._input = self._z.unused_data
                self._z = zlib.decompressobj(31)
                self._in_member = False
        return b"".join(out)

    def readinto(self, view: memoryview) -> int:
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


def open_trace(path: str | Path) -> BinaryIO:
    """Open a trace for binary reading, gunzipping when the file starts with the gzip magic bytes.

    Only regular files are read: a FIFO, a device or a socket is refused (a FIFO without a writer would block
    forever; a pipe cannot be read twice, which the parallel reader and its sequential fallback need).
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise InputNotFoundError(f"{p}: no such file") from None
    except OSError as exc:
        raise InputNotFoundError(f"{p}: cannot open ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise InputNotFoundError(f"{p}: is a directory, expected a trace file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "not a regular file (a device or a socket)"
        raise InputNotFoundError(f"{p}: is {kind}; save the trace to a file and pass that")
    try:
        handle = p.open("rb")
    except OSError as exc:
        raise InputNotFoundError(f"{p}: cannot open ({exc.strerror})") from None
    magic = handle.read(2)
    handle.seek(0)
    if magic == b"\x1f\x8b":
        return _Gunzip(handle, str(p))  # type: ignore[return-value]
    return handle


def expected_json_bytes(path: str | Path) -> int:
    """A first guess of the JSON bytes in ``path`` (traces compress about 8-15x), 0 if it cannot be read."""
    try:
        info = Path(path).stat()
        if not stat.S_ISREG(info.st_mode):  # opening a FIFO would block: open_trace refuses it
            return 0
        with open(path, "rb") as handle:
            return info.st_size * 8 if handle.read(2) == b"\x1f\x8b" else info.st_size
    except OSError:
        return 0


def _event_ends(buf: bytes | bytearray, start: int, stop: int) -> tuple[np.ndarray, int | None]:
    """Structure of ``buf[start:stop]``, which starts outside any string at nesting depth 0: the positions just
    after each ``}`` that closes a top-level value (ends of whole events), and the position of the first closing
    bracket without its opening one (the ``]`` that closes the event array), or None.

    Vectorised (numpy, in 4 MiB blocks): used only after a decode error, where the candidate boundaries of
    :meth:`TraceDecoder._boundaries` (any ``},{``) may lie inside a string or a nested value.
    """
    ends: list[np.ndarray] = []
    depth, in_string, backslashes = 0, 0, 0
    pos = start
    while pos < stop:
        end = min(pos + _SCAN_BLOCK, stop)
        a = np.frombuffer(buf, dtype=np.uint8, count=end - pos, offset=pos)
        inside, in_string, backslashes = _inside_strings(a, in_string, backslashes)
        closing = ((a == 125) | (a == 93)) & ~inside
        delta = (((a == 123) | (a == 91)) & ~inside).astype(np.int32) - closing
        levels = np.cumsum(delta, dtype=np.int64) + depth
        below = np.flatnonzero(levels < 0)
        limit = int(below[0]) if below.size else len(a)
        ends.append(np.flatnonzero((a[:limit] == 125) & closing[:limit] & (levels[:limit] == 0)) + pos + 1)
        if below.size:
            return np.concatenate(ends), pos + limit
        depth = int(levels[-1])
        pos = end
    return (np.concatenate(ends) if ends else np.empty(0, np.int64)), None


def _inside_strings(a: np.ndarray, in_string: int, backslashes: int) -> tuple[np.ndarray, int, int]:
    """Which bytes of ``a`` lie inside a JSON string (opening quote included), given whether ``a`` starts inside
    one and after how many backslashes; also those two facts for the bytes that follow ``a``."""
    quotes = np.flatnonzero(a == 34)
    is_bs = a == 92
    if quotes.size and (backslashes or is_bs.any()):  # drop quotes escaped by an odd run of backslashes
        last_other = np.maximum.accumulate(np.where(is_bs, -1 - backslashes, np.arange(len(a))))
        before = quotes - 1
        run = np.where(before >= 0, before - last_other[np.maximum(before, 0)], backslashes)
        quotes = quotes[run % 2 == 0]
    toggles = np.zeros(len(a), dtype=np.int8)
    toggles[quotes] = 1
    inside = ((np.cumsum(toggles, dtype=np.int32) + in_string) & 1).astype(bool)
    others = np.flatnonzero(~is_bs)
    trailing = len(a) - 1 - int(others[-1]) if others.size else len(a) + backslashes
    return inside, (in_string + len(quotes)) & 1, trailing


def _unmatched_close(buf: bytes | bytearray, start: int, state: list[int]) -> int | None:
    """The position of the first closing bracket of ``buf[start:]`` without its opening one, outside strings, or
    None. ``state`` (depth, inside a string, backslashes before) is where the text before ``buf[start]`` left the
    scan, and is updated: the scan goes on in the next block of a stream. Vectorised like :func:`_event_ends`."""
    depth, in_string, backslashes = state
    pos = start
    while pos < len(buf):
        end = min(pos + _SCAN_BLOCK, len(buf))
        a = np.frombuffer(buf, dtype=np.uint8, count=end - pos, offset=pos)
        inside, in_string, backslashes = _inside_strings(a, in_string, backslashes)
        delta = (((a == 123) | (a == 91)) & ~inside).astype(np.int32) - (((a == 125) | (a == 93)) & ~inside)
        levels = np.cumsum(delta, dtype=np.int64) + depth
        below = np.flatnonzero(levels < 0)
        if below.size:
            state[:] = [0, 0, 0]
            return pos + int(below[0])
        depth = int(levels[-1])
        pos = end
    state[:] = [depth, in_string, backslashes]
    return None


def _trailer_follows(buf: bytes | bytearray, close: int) -> bool:
    """Whether the ``]`` at ``close`` is followed by what ends a document after its event array: ``}``, or ``,``
    and a key. Between events (a stray bracket of a damaged event) a ``{`` follows instead."""
    pos = close + 1
    while pos < len(buf) and buf[pos] in _BLANKS:
        pos += 1
    if pos < len(buf) and buf[pos] == 44:  # ','
        pos += 1
        while pos < len(buf) and buf[pos] in _BLANKS:
            pos += 1
        return pos < len(buf) and buf[pos] == 34  # '"'
    return pos < len(buf) and buf[pos] == 125  # '}'


def _closing_bracket(buf: bytes | bytearray, pos: int, stop: int, exc: Exception) -> int | None:
    """Where the event array closes in ``buf[pos:stop]`` (events decoded as ``[`` + that text + ``]``), when
    ``exc`` says so: msgspec read a whole array and found more after it, and what follows its ``]`` ends a
    document (:func:`_trailer_follows`); else None. msgspec found the bracket with the strings skipped, so this
    costs nothing while the events go on."""
    message = str(exc)
    if "trailing characters" not in message:
        return None
    found = _BYTE_POS.search(message)
    if found is None:
        return None
    trailing = pos + int(found.group(1)) - 2  # msgspec counts from 1, and the '[' put in front
    if not pos < trailing < stop:
        return None
    close = buf.rfind(b"]", pos, trailing)
    if close < 0 or bytes(buf[close + 1 : trailing]).strip(b" \t\r\n"):
        return None
    return close if _trailer_follows(buf, close) else None


def _repair_surrogates(buf: bytearray, start: int, stop: int) -> int:
    """Replace each lone surrogate escape of ``buf[start:stop]`` (``\\ud800`` without its low half, or a low half
    alone: valid JSON that msgspec refuses) by ``\\ufffd`` in place; the number replaced. Pairs are kept."""
    found = [m.start() for m in _SURROGATE.finditer(buf, start, stop)]
    lone = []
    i = 0
    while i < len(found):
        at = found[i]
        before = bytes(buf[max(start, at - 64) : at])
        if (len(before) - len(before.rstrip(b"\\"))) % 2:  # an escaped backslash followed by 'u': text, not an escape
            i += 1
            continue
        high = buf[at + 3] in b"89abAB"
        if high and i + 1 < len(found) and found[i + 1] == at + 6 and buf[at + 9] in b"cdefCDEF":
            i += 2  # a pair
            continue
        lone.append(at)
        i += 1
    for at in lone:
        buf[at : at + 6] = _REPLACEMENT
    return len(lone)


def _after_separator(buf: bytes | bytearray, pos: int, stop: int) -> int:
    """``pos`` moved past blanks and at most one comma (and the blanks after it)."""
    while pos < stop and buf[pos] in _BLANKS:
        pos += 1
    if pos < stop and buf[pos] == 44:  # ','
        pos += 1
        while pos < stop and buf[pos] in _BLANKS:
            pos += 1
    return pos


class TraceDecoder:
    """Iterate over a trace's events in decoded chunks; ``header`` holds the top-level keys.

    Usage::

        decoder = TraceDecoder(path)
        for events in decoder.chunks():
            ...
        decoder.header, decoder.report
    """

    def __init__(self, path: str | Path, *, chunk_bytes: int = CHUNK_BYTES, strict: bool = False) -> None:
        self.path = str(path)
        self.chunk_bytes = chunk_bytes
        self.strict = strict
        self.header: dict[str, Any] = {}
        self.report = DecodeReport(path=self.path)
        self._consumed = 0  # bytes of the decompressed stream before the current buffer
        self._retry_at = 0  # a long event is pending: decode again once the buffer holds this many bytes
        self._stream_handle: BinaryIO | None = None
        self._disk_bytes = 0
        self._memory_checked_at = 0  # bytes read when the memory need was last projected
        self._close_in_region: int | None = None  # set by _decode_region: where the event array closed
        self._scan_at = 0  # a buffer without an event boundary is scanned for the array's end at this size

    def _read(self, stream: BinaryIO) -> bytes:
        try:
            block = stream.read(self.chunk_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{self.path}: corrupt compressed data ({exc})") from None
        self.report.bytes_read += len(block)
        self._check_memory(stream)
        return block

    # -- memory ------------------------------------------------------------------------------------------

    def _check_memory(self, stream: BinaryIO) -> None:
        """Project the memory the whole trace needs from what was read so far; stop early when it is more than
        the machine has (:func:`memory_budget`). Checked at 16 MiB of JSON and every doubling after, so a gzip
        bomb is stopped after reading a few MiB per GiB it would inflate to, long before it fills the memory."""
        read = self.report.bytes_read
        if read < max(16 << 20, 2 * self._memory_checked_at):
            return
        self._memory_checked_at = read
        if isinstance(stream, _Gunzip):
            consumed = stream.compressed_offset()
            projected = read * self._disk_bytes / consumed if consumed > 0 else read
        else:
            projected = max(self._disk_bytes, read)
        self.check_memory_for(projected)

    def check_memory_for(self, json_bytes: float) -> None:
        """Raise :class:`OutOfMemoryError` when ``json_bytes`` of JSON need more memory than there is."""
        need = NEED_PER_JSON_BYTE * json_bytes + NEED_FIXED
        budget, source = memory_budget()
        if budget is None or need <= budget:
            return
        inflated = f", inflated from {_human(self._disk_bytes)} on disk" if self._gzip else ""
        raise OutOfMemoryError(
            f"{self.path}: needs about {_human(need)} of memory for about {_human(json_bytes)} of JSON{inflated}; "
            f"{_human(budget)} {source}. Run it where more memory is free (or set {MEMORY_ENV} to a larger "
            "size to try anyway)"
        )

    @property
    def _gzip(self) -> bool:
        return isinstance(self._stream_handle, _Gunzip)

    def chunks(self) -> Iterator[list[Event] | list[FastEvent]]:
        """Yield lists of decoded events, in file order."""
        for events, _ in self.chunks_with_text():
            yield events

    def chunks_with_text(self) -> Iterator[Decoded]:
        """Yield ``(events, text)``: decoded events and the JSON array they came from.

        ``text`` is None when some events of the chunk had to be repaired or dropped one by one.
        """
        for item in self._stream(defer=False):
            yield item  # type: ignore[misc]
            del item  # do not hold the last chunk while decoding the next one

    def bodies(self) -> Iterator[memoryview | Decoded | None]:
        """Like :meth:`chunks_with_text`, but yield each chunk's text undecoded (a ``memoryview``: events separated
        by commas), for decoding elsewhere; only what is left at the end of the file is decoded here.

        A chunk is cut where :meth:`chunks_with_text` would cut it when its text decodes, so decoding every body
        with :meth:`_decode` gives the same events. If one fails with ``msgspec.DecodeError``, the caller must
        read the file again with :meth:`chunks_with_text` (which then skips malformed events or reports them).
        ``None`` is yielded once before the end of the file is decoded: the caller must then count the events of
        every body so far into ``report.events_read`` (messages about the end quote that count).
        """
        return self._stream(defer=True)

    def _stream(self, defer: bool) -> Iterator[memoryview | Decoded | None]:
        try:
            yield from self._stream_inner(defer)
        except RecursionError:  # msgspec follows nesting on the C stack, guarded by Python's recursion limit
            raise TraceFormatError(f"{self.path}: JSON nested too deeply (corrupt or hostile input)") from None

    def _stream_inner(self, defer: bool) -> Iterator[memoryview | Decoded | None]:
        with open_trace(self.path) as stream:
            self._stream_handle = stream
            self._disk_bytes = os.fstat(stream.raw.fileno() if isinstance(stream, _Gunzip) else stream.fileno()).st_size
            if not isinstance(stream, _Gunzip):
                self.check_memory_for(self._disk_bytes)  # the JSON's size is known: decide before reading
            buf = self._read(stream)
            blank = bom = 0
            if buf.startswith(BOM):
                bom, buf = len(BOM), buf[len(BOM) :]
            while buf and not buf.lstrip():  # a run of whitespace: count it, keep nothing
                blank += len(buf)
                buf = self._read(stream)
            if not buf:
                if blank:
                    raise TraceFormatError(f"{self.path}: only whitespace ({blank} bytes), no JSON")
                raise TraceFormatError(f"{self.path}: file is empty")
            match = _EVENTS_KEY.search(buf)
            while match is None:
                if len(buf) > MAX_HEADER_BYTES:
                    raise TraceFormatError(f"{self.path}: no traceEvents array in the first 256 MB")
                block = self._read(stream)
                if not block:
                    self._no_events_array(buf)
                searched = max(len(buf) - 4096, 0)  # search only the new bytes (and a key cut across blocks)
                buf += block
                match = _EVENTS_KEY.search(buf, searched)
            self._parse_header(buf[: match.start()])
            self._consumed = bom + blank + match.end()
            buf = buf[match.end() :]
            if defer:
                yield from self._deferred(stream, buf)
                return
            eof = False
            while not eof:
                block = self._read(stream)
                eof = not block
                buf += block
                del block
                buf = yield from self._bounded_prefix(buf)
                if self._close_in_region is None:
                    items, buf = self._final(buf) if eof else self._complete_prefix(buf)
                    yield from self._hand_out(items)
                    del items
                if self._close_in_region is not None:  # the event array closed: what follows is no event
                    self._read_trailer(stream, buf)
                    return

    def _hand_out(self, items: list[Decoded]) -> Iterator[Decoded]:
        """Yield the decoded chunks of ``items`` that hold events, counted in ``report.events_read``; each is let go
        of (here and in ``items``) before the next is asked for, so the caller's ``del`` frees it."""
        items.reverse()
        while items:
            events = items.pop()
            if events[0]:
                self.report.events_read += len(events[0])
                yield events
            del events

    def _piece_cuts(self, buf: bytes | bytearray, size: int) -> list[int]:
        """Candidate ends of events (:meth:`_boundaries`) that split ``buf[:size]`` into pieces of at most
        :data:`MAX_CHUNK_EVENTS` events, in order; [] when it holds fewer (as a trace's chunks do).

        Events are counted as ``{`` bytes: every event has one, and counting them is a few hundred times cheaper
        than a scan of the structure (:func:`_event_ends`). A cut may lie inside an event (a ``},{`` in a
        string): decoding then stops at the last whole event before it, and the next piece goes on from there."""
        a = np.frombuffer(buf, dtype=np.uint8, count=size)
        if np.count_nonzero(a == 123) <= MAX_CHUNK_EVENTS:
            return []
        cuts: list[int] = []
        for limit in np.flatnonzero(a == 123)[MAX_CHUNK_EVENTS::MAX_CHUNK_EVENTS].tolist():
            cut = next(self._boundaries(buf, limit, size), None)
            if cut is not None and cut > (cuts[-1] if cuts else 0):
                cuts.append(cut)
        return cuts

    def _bounded_prefix(self, buf: bytes) -> Generator[Decoded, None, bytes]:
        """Decode and yield the events at the start of ``buf`` :data:`MAX_CHUNK_EVENTS` at a time while it holds
        more than that (a chunk of tiny events); return the rest, which holds fewer, for the usual decoding."""
        if len(buf) < self._retry_at:  # a long event is still being read
            return buf
        cuts = self._piece_cuts(buf, len(buf))
        if not cuts:
            return buf
        work = bytearray(buf) + b" "  # one copy for all the pieces (see _decode_region)
        start = 0
        for cut in cuts:
            if cut <= start:
                continue
            items, stop = self._decode_region(work, start, cut, final=False)
            yield from self._hand_out(items)
            del items
            if self._close_in_region is not None:  # the event array closed at ``stop``: the trailer follows
                self._consumed += stop
                return buf[stop:]
            start = _after_separator(work, stop, len(buf))
            self._check_damage(final=False)
        self._consumed += start
        return buf[start:]

    def _deferred(self, stream: BinaryIO, rest: bytes) -> Iterator[memoryview | Decoded | None]:
        """The reading loop of :meth:`bodies`. Blocks are read into one buffer that is used again for every chunk,
        so reading takes no new memory per chunk (no page faults, no copies but the rest after a cut)."""
        work = bytearray(max(2 * self.chunk_bytes, len(rest) + self.chunk_bytes))
        used = len(rest)
        work[:used] = rest
        del rest
        while True:
            if used + self.chunk_bytes > len(work):  # an event longer than a chunk: make room
                grown = bytearray(used + 2 * self.chunk_bytes)
                grown[:used] = work[:used]
                work = grown
            got = self._read_into(stream, work, used)
            if not got:
                yield None  # the caller takes in every chunk handed out so far before the end is read
                rest = yield from self._bounded_prefix(bytes(work[:used]))
                del work
                if self._close_in_region is not None:
                    self._read_trailer(stream, rest)
                    return
                yield from self._hand_out(self._final(rest)[0])
                return
            used += got
            cut = next(self._boundaries(work, used, used), None)
            if cut is None:
                if used > 2 * self.chunk_bytes:
                    raise ReadSequentially("no event boundary in two chunks")  # the sequential reader knows
                continue
            start = 0
            for end in [*self._piece_cuts(work, cut), cut]:  # many tiny events: a bounded number per body
                body = memoryview(work)[start:end]
                yield body
                body.release()
                start = _after_separator(work, end, used)
            self._consumed += start
            work[: used - start] = work[start:used]
            used -= start

    def _read_into(self, stream: BinaryIO, work: bytearray, at: int) -> int:
        """Read up to ``chunk_bytes`` into ``work[at:]``, like :meth:`_read`; the number of bytes read."""
        view = memoryview(work)[at : at + self.chunk_bytes]
        got = 0
        try:
            while got < len(view):
                n = stream.readinto(view[got:])
                if not n:
                    break
                got += n
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{self.path}: corrupt compressed data ({exc})") from None
        finally:
            view.release()
        self.report.bytes_read += got
        self._check_memory(stream)
        return got

    # -- header and trailer -------------------------------------------------------------------------------

    def _no_events_array(self, buf: bytes) -> None:
        text = buf.lstrip()
        if not text.startswith((b"{", b"[")):
            raise TraceFormatError(f"{self.path}: not JSON (starts with {text[:16]!r})")
        try:
            doc = msgspec.json.decode(buf)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"{self.path}: not valid JSON ({exc})") from None
        if isinstance(doc, list):
            raise TraceFormatError(
                f"{self.path}: a bare JSON array, not a Kineto trace (expected an object with traceEvents)"
            )
        raise TraceFormatError(f"{self.path}: JSON without a traceEvents array, not a Kineto trace")

    def _parse_header(self, prefix: bytes) -> None:
        text = prefix.strip()
        if not text.startswith(b"{"):
            raise TraceFormatError(f"{self.path}: not a JSON object at the top level")
        body = text[1:].rstrip().rstrip(b",")
        try:
            self.header = _HEADER.decode(b"{" + body + b"}") if body.strip() else {}
        except msgspec.DecodeError:
            self.header = {}  # header keys are informative only; events are what matter

    def _parse_trailer(self, tail: bytes) -> bool:
        """Parse what follows the event array (``, "traceName": ...}``); True when it closes the document.

        A second ``traceEvents`` key is refused: JSON readers keep the last one, and this reader has streamed the
        first (its keys are looked at before any value is built, so a long second array costs no objects).
        """
        rest = tail.strip()
        if rest == b"}":
            return True
        if not rest.startswith(b",") or not rest.endswith(b"}"):
            return False
        try:
            raw = _TRAILER_RAW.decode(b"{" + rest[1:])
        except msgspec.DecodeError:
            return False
        if "traceEvents" in raw:
            raise TraceFormatError(
                f"{self.path}: two traceEvents keys (JSON readers keep the last, profparse reads the first): "
                "ambiguous, refused; keep one of them"
            )
        self.header.update({key: _ANY.decode(value) for key, value in raw.items()})
        return True

    def _read_trailer(self, stream: BinaryIO, rest: bytes) -> None:
        """Read what follows the event array, ``rest`` (from its ``]`` on) and the rest of ``stream``: the trailer
        up to the ``}`` that closes the document (found by structure, held up to :data:`MAX_HEADER_BYTES`) gives
        header keys; what comes after it is counted, not held (``report.trailing_bytes``)."""
        self.report.events_end_byte = base = self._consumed
        state = [0, 0, 0]
        pieces: list[bytes] = []
        held = 0
        data, pos = rest, 1
        while True:
            end = _unmatched_close(data, pos, state)
            if end is not None:
                pieces.append(data[pos : end + 1])
                break
            pieces.append(data[pos:])
            held += len(data) - pos
            if held > MAX_HEADER_BYTES:
                raise TraceFormatError(
                    f"{self.path}: more than {MAX_HEADER_BYTES >> 20} MB after the event array without the end of "
                    "the document (corrupt or hostile input)"
                )
            base += len(data)
            data, pos = self._read(stream), 0
            if not data:  # cut inside the trailer: every event is there, only trailing keys are lost
                self._consumed = base
                self._mark_truncated(b"", 0, in_events=False)
                return
        trailer = b"".join(pieces)
        del pieces
        if data[end] != 125 or not self._parse_trailer(trailer):
            self._trailer_damaged(self.report.events_end_byte, len(trailer) + 1)
        else:
            self.report.document_end_byte = base + end + 1
        self.report.trailing_bytes = self._count_trailing(stream, data[end + 1 :])
        self._check_damage(final=True)

    def _count_trailing(self, stream: BinaryIO, data: bytes) -> int:
        """Bytes from ``data`` to the end of ``stream`` once blanks at both ends are left out; nothing is held."""
        first = last = None
        offset = 0
        while data:
            if data.strip():
                if first is None:
                    first = offset + len(data) - len(data.lstrip())
                last = offset + len(data.rstrip())
            offset += len(data)
            data = self._read(stream)
        return 0 if first is None or last is None else last - first

    def _trailer_damaged(self, where: int, size: int) -> None:
        """The text after the ``]`` taken for the end of the events is no trailer: skipped as damage."""
        self.report.drop("malformed JSON (skipped to the next event)")
        self.report.skipped_bytes += size
        if self.report.malformed_at_byte is None:
            self.report.malformed_at_byte = where

    # -- chunking ----------------------------------------------------------------------------------------

    def _boundaries(self, buf: bytes | bytearray, limit: int, size: int | None = None) -> Iterator[int]:
        """Positions just after a ``}`` that is followed by ``,`` and ``{``: candidate ends of a whole event.

        ``size``: the bytes of ``buf`` in use (default: all).
        """
        end = limit
        n = len(buf) if size is None else size
        while True:
            idx = buf.rfind(b"}", 0, end)
            if idx < 0:
                return
            j = idx + 1
            while j < n and buf[j] in b" \t\r\n":
                j += 1
            if j < n and buf[j] == 44:  # ','
                j += 1
                while j < n and buf[j] in b" \t\r\n":
                    j += 1
                if j < n and buf[j] == 123:  # '{'
                    yield idx + 1
            end = idx

    def _decode(self, body: bytes | bytearray) -> Decoded:
        """Decode ``body`` (events separated by commas, no brackets); fall back per event on type errors.

        The usual result is a list of :class:`FastEvent` and the JSON text; after a fallback, a list of
        :class:`Event` and None.
        """
        return self.decode_array(b"[" + body + b"]")

    def decode_array(self, data: bytes | memoryview) -> Decoded:
        """:meth:`_decode` of a JSON array (``[`` + events + ``]``), e.g. a view of shared memory."""
        try:
            fast = _FAST.decode(data)
        except msgspec.ValidationError:
            pass
        else:
            chunk = _fast_chunk(fast)
            if chunk is not None:
                return chunk, data
            del fast
        try:
            return _STRICT.decode(data), data
        except msgspec.ValidationError:
            pass
        raws = _RAW_LIST.decode(data)
        events: list[Event] = []
        for raw in raws:
            try:
                events.append(_ONE_STRICT.decode(raw))
                continue
            except msgspec.ValidationError:
                pass
            try:
                loose = _ONE_LOOSE.decode(raw)
            except msgspec.ValidationError:
                self.report.drop("event is not a JSON object")
                continue
            event = coerce_event(loose, self.report)
            if event is not None:
                events.append(event)
        return events, None

    def _complete_prefix(self, buf: bytes) -> tuple[list[Decoded], bytes]:
        """Decode the longest prefix of whole events (skipping malformed ones); return them and the unread rest.

        The usual case is one decode up to the last ``},{``. After an error, :meth:`_decode_region` finds out
        what went wrong once; a long event still being read is tried again only when the buffer has doubled, so
        the bytes of even a 64 MB event are decoded a few times at most.
        """
        if len(buf) < self._retry_at:
            return [], buf
        cut = next(self._boundaries(buf, len(buf)), None)
        if cut is None:
            start = len(buf) - len(buf.lstrip())  # blanks before the next event go (a whitespace bomb stays small)
            self._consumed += start
            buf = buf[start:]
            if len(buf) > max(self._scan_at, 2 * self.chunk_bytes):
                # long without a boundary: a long event, or the array closed and a long trailer follows (a long
                # string, say); scanned again only once the buffer doubled, so each byte a few times at most
                self._scan_at = 2 * len(buf)
                _, close = _event_ends(buf, 0, len(buf))
                if close is not None and buf[close] == 93 and _trailer_follows(buf, close):
                    items = self._decode_region(buf, 0, close)[0] if buf[:close].strip() else []
                    self._close_in_region = close
                    self._consumed += close
                    return items, buf[close:]
            if len(buf) > max(MAX_EVENT_BYTES, 2 * self.chunk_bytes):
                raise TraceFormatError(
                    f"{self.path}: no end of an event in {len(buf) >> 20} MB near byte {self._consumed}: an "
                    f"event larger than {MAX_EVENT_BYTES >> 20} MB or garbage (corrupt or hostile input)"
                )
            return [], buf
        items, stop = self._decode_region(buf, 0, cut, final=False)
        if self._close_in_region is not None:  # the event array closed at ``stop``: keep the rest for the trailer
            self._consumed += stop
            return items, buf[stop:]
        stop = _after_separator(buf, stop, len(buf))
        self._consumed += stop
        rest = buf[stop:]
        self._retry_at = 2 * len(rest) if stop < cut else 0
        self._check_damage(final=False)
        return items, rest

    def _decode_region(
        self, buf: bytes | bytearray, pos: int, stop: int, *, final: bool = True, repair: bool = True
    ) -> tuple[list[Decoded], int]:
        """Decode the events of ``buf[pos:stop]``, skipping malformed ones; return them and where decoding ended.

        ``stop`` is a candidate end of an event. Not ``final`` (more of the file follows): when ``stop`` turns out
        to lie inside an event (a ``},{`` in a string or a nested value), decoding ends after the last whole event
        before it and the rest is left for later. Each error costs one decode up to the error and one of the
        events before it; then reading goes on from the next ``},{`` after the error.
        """
        items: list[Decoded] = []
        if not isinstance(buf, bytearray):
            buf = bytearray(buf) + b" "  # writable, with a spare byte after the end: see _decode_span
        copy_texts = True  # one copy of the region at most: never one per error (linear in damaged input)
        surrogates = repair  # lone surrogate escapes are looked for once per region, after its first error
        while True:
            pos = _after_separator(buf, pos, stop)
            if pos >= stop:
                return items, stop
            try:
                items.append(self._decode_span(buf, pos, stop, copy_texts))
                return items, stop
            except msgspec.DecodeError as exc:
                close = None if final else _closing_bracket(buf, pos, stop, exc)
                if close is not None:  # the event array ends inside the region: decode the events before it
                    if buf[pos:close].strip():
                        items += self._decode_region(buf, pos, close, repair=repair)[0]
                    self._close_in_region = close
                    return items, close
                if surrogates:
                    surrogates = False
                    fixed = _repair_surrogates(buf, pos, stop)  # in place: ``buf`` is this reader's copy
                    if fixed:
                        self.report.lone_surrogates += fixed
                        continue
                err = self._error_offset(buf, pos, stop, exc)
            copy_texts = False
            ends, _ = _event_ends(buf, pos, stop) if err is None else (None, None)
            if err is None and final and ends.size and int(ends[-1]) >= stop:
                # whole events, yet msgspec says "truncated": a value it cannot finish inside a complete event
                # (a lone surrogate escape "\ud800" at the end); find the event instead of retrying this region
                err = self._search_error(buf, pos, stop)
            if err is None:  # ``stop`` is inside a value: keep the whole events before it
                good = int(ends[-1]) if ends.size else pos
                if good > pos:
                    items += self._decode_region(buf, pos, good, repair=repair)[0]
                if not final:
                    return items, good
                err = good
            else:
                ends, _ = _event_ends(buf, pos, err)
                good = int(ends[-1]) if ends.size else pos
                if good > pos:  # the events before the error parsed: decode them
                    try:
                        items.append(self._decode_span(buf, pos, good))
                    except msgspec.DecodeError:
                        good = pos
                if repair and (_NONFINITE_AT.match(buf, err) or _NONFINITE_AT.match(buf, max(err - 1, 0))):
                    fixed = self._repair_nonfinite(buf, good, stop)
                    if fixed is not None:  # NaN / Infinity (Python's json writes them): read as non-finite
                        return items + self._decode_region(fixed, 0, len(fixed), repair=False)[0], stop
            where = self._consumed + err
            if self.strict:
                raise TraceFormatError(f"{self.path}: malformed JSON near byte {where}")
            found = _NEXT_EVENT.search(buf, max(err, good), stop)
            resume = found.end() - 1 if found is not None else stop
            self.report.drop("malformed JSON (skipped to the next event)")
            self.report.skipped_bytes += resume - good
            if self.report.malformed_at_byte is None:
                self.report.malformed_at_byte = where
            pos = resume

    def _decode_span(self, buf: bytearray, pos: int, stop: int, copy_texts: bool = True) -> Decoded:
        """:meth:`_decode` of ``buf[pos:stop]`` without copying it: the bytes just before and after are set to
        ``[`` and ``]`` for the call, then restored. A decode that fails after a few bytes then costs a few bytes,
        not a copy of the rest of the chunk (garbage with an error every few bytes stays linear).

        ``ts`` (:class:`FastEvent`) and text ``args`` (shapes, collective args) decode as msgspec.Raw views into
        the decoded buffer, which is reused afterwards: with ``copy_texts`` the span is decoded from a copy (one
        memcpy per chunk, which costs too little to see; copying each Raw on its own after decoding made decoding
        nearly twice as slow). Without (a retry after an error,
        so that a region is copied once at most), the Raw values are given their own bytes if a decode kept any.
        """
        if pos < 1 or stop >= len(buf):
            return self._decode(bytes(buf[pos:stop]))
        before, after = buf[pos - 1], buf[stop]
        buf[pos - 1], buf[stop] = 91, 93
        try:
            if copy_texts:  # FastEvent.ts (and text args) would view ``buf``
                data = bytes(buf[pos - 1 : stop + 1])
                events, text = self.decode_array(data)
                return events, (None if text is None else data)
            view = memoryview(buf)[pos - 1 : stop + 1]
            decoded: Decoded | None = None
            try:
                decoded = self.decode_array(view)
            finally:
                try:
                    view.release()
                except BufferError:  # text args still view the buffer: give them their own bytes
                    if decoded is not None:
                        _own_text_args(decoded[0])
                    view.release()
            events, text = decoded
        finally:
            buf[pos - 1], buf[stop] = before, after
        return events, (None if text is None else bytes(buf[pos:stop]).join((b"[", b"]")))

    def _repair_nonfinite(self, buf: bytes | bytearray, start: int, stop: int) -> bytes | None:
        """``buf[start:stop]`` with every NaN / Infinity / -Infinity value (outside strings) quoted: then repaired
        like any numeric string, into a non-finite float (an event with a non-finite ts or dur is dropped and
        counted; an ``args`` id becomes missing)."""
        region = bytes(buf[start:stop])
        matches = list(_NONFINITE.finditer(region))
        if not matches:
            return None
        inside, _, _ = _inside_strings(np.frombuffer(region, dtype=np.uint8), 0, 0)
        keep = [m for m in matches if not inside[m.start()]]
        if not keep:
            return None
        parts, last = [], 0
        for m in keep:
            parts += [region[last : m.start()], m.group(1), b'"', region[m.start(1) + len(m.group(1)) : m.end()], b'"']
            last = m.end()
        parts.append(region[last:])
        self.report.nonfinite_values += len(keep)
        return b"".join(parts)

    def _error_offset(self, buf: bytes | bytearray, pos: int, stop: int, exc: Exception) -> int | None:
        """Where in ``buf`` decoding ``buf[pos:stop]`` failed; None when it failed because the text ends inside
        a value (the candidate end ``stop`` was not the end of an event)."""
        message = str(exc)
        if "truncated" in message:
            return None
        found = _BYTE_POS.search(message)
        if found is not None:
            err = pos + int(found.group(1)) - 1  # minus the '[' added in front
            return None if err >= stop - 1 else err  # at the ']' added behind: an event is not closed
        if "UTF-8" in message:  # msgspec gives no position for invalid UTF-8; Python's codec does, in windows
            width = 4096  # that double, so finding an error d bytes in costs O(d)
            while True:
                end = min(pos + width, stop)
                try:
                    bytes(buf[pos:end]).decode("utf-8")
                except UnicodeDecodeError as bad:
                    if bad.end < end - pos or end == stop or bad.reason != "unexpected end of data":
                        return pos + bad.start
                if end == stop:
                    break
                width *= 2
        return self._search_error(buf, pos, stop)

    def _search_error(self, buf: bytes | bytearray, pos: int, stop: int) -> int:
        """The start of the first event of ``buf[pos:stop]`` that does not decode, by doubling then bisecting
        over whole events (cost: a few decodes of the text before the error)."""
        ends, _ = _event_ends(buf, pos, stop)
        good, bad, step = -1, len(ends), 1
        while good + step < len(ends):  # gallop: ends[good] decodes, find a failing one
            try:
                self._decode(buf[pos : ends[good + step]])
                good += step
                step *= 2
            except msgspec.DecodeError:
                bad = good + step
                break
        while bad - good > 1:
            mid = (good + bad) // 2
            try:
                self._decode(buf[pos : ends[mid]])
                good = mid
            except msgspec.DecodeError:
                bad = mid
        return int(ends[good]) if good >= 0 else pos

    def _check_damage(self, final: bool) -> None:
        """Stop when more than :data:`MAX_SKIPPED_FRACTION` of the bytes were malformed (checked on the way from
        1 MiB of damage on, so a file of garbage stops early; at the end for any amount)."""
        skipped = self.report.skipped_bytes
        if skipped and skipped > MAX_SKIPPED_FRACTION * self.report.bytes_read and (final or skipped > 1 << 20):
            raise TraceFormatError(
                f"{self.path}: malformed JSON near byte {self.report.malformed_at_byte} "
                f"({skipped} of {self.report.bytes_read} bytes unreadable, more than "
                f"{MAX_SKIPPED_FRACTION:.0%}: corrupt file)"
            )

    def _final(self, buf: bytes) -> tuple[list[Decoded], bytes]:
        """Decode what is left at end of file: the last events, ``]`` and the trailer, or a truncated tail."""
        # The ']' closing the events: where the structure closes the array when the text is intact (the last ']'
        # of the text may close an array of the trailer: Kineto writes ``"INFO": ["...", ...]`` after the events),
        # else the last ']' (a damaged event can put a bracket that closes early); the first whose trailer parses.
        # One vectorised scan of the last chunk.
        ends, array_close = _event_ends(buf, 0, len(buf))
        structural = array_close is not None and buf[array_close] == 93
        candidates = [array_close] if structural else []
        last = buf.rfind(b"]")
        if last >= 0 and last not in candidates and not (structural and _trailer_follows(buf, array_close)):
            candidates.append(last)  # the structure was thrown off by damage (no trailer follows its ']')
        for close in candidates:
            if self._parse_trailer(buf[close + 1 :]):
                items = self._decode_region(buf, 0, close)[0] if buf[:close].strip() else []
                self._check_damage(final=True)  # the document ends as it should: damage before is skipped
                self.report.events_end_byte = self._consumed + close
                self.report.document_end_byte = self._consumed + len(buf.rstrip())
                return items, b""
        items = self._final_careful(buf, ends, array_close)
        self._check_damage(final=True)
        return items, b""

    def _final_careful(self, buf: bytes, ends: np.ndarray, close: int | None) -> list[Decoded]:
        """:meth:`_final` by the structure of the text (``ends``, ``close``: :func:`_event_ends` of ``buf``):
        events up to the ``]`` that closes the array (skipping malformed ones), the trailer up to the ``}`` that
        closes the document, and anything after that ignored (counted in ``report.trailing_bytes``, not a
        truncation). No ``]``: the file was cut short."""
        if close is None or buf[close] != 93:  # ']'
            stop = int(ends[-1]) if ends.size else 0
            items = self._decode_region(buf, 0, stop)[0] if stop else []
            self._mark_truncated(buf, sum(len(e[0]) for e in items), in_events=True)
            return items
        items = self._decode_region(buf, 0, close)[0] if buf[:close].strip() else []
        _, end = _event_ends(buf, close + 1, len(buf))
        if end is None:  # cut inside the trailer: every event is there, only trailing keys are lost
            self._mark_truncated(buf, sum(len(e[0]) for e in items), in_events=False)
            return items
        saved = dict(self.header)
        if buf[end] != 125 or not self._parse_trailer(buf[close + 1 : end + 1]):  # not the end of the events: damage
            self.header = saved
            self._trailer_damaged(self._consumed + close, len(buf) - close)
            return items
        self.report.trailing_bytes = len(buf[end + 1 :].strip())
        self.report.events_end_byte = self._consumed + close
        self.report.document_end_byte = self._consumed + end + 1
        return items

    def _mark_truncated(self, buf: bytes, recovered: int, in_events: bool) -> None:
        self.report.truncated = True
        self.report.truncated_at_byte = self._consumed + len(buf)
        if self.strict:
            if not in_events:
                raise TruncatedTraceError(f"{self.path}: truncated after the event array")
            raise TruncatedTraceError(
                f"{self.path}: truncated at byte {self.report.truncated_at_byte} "
                f"after {self.report.events_read + recovered} complete events"
            )


def decode_args(raw: bytes) -> Args:
    """Decode one ``args`` object (used by tests and tools that build events by hand)."""
    return _ARGS.decode(raw)
