"""Streaming decoder for Kineto Chrome traces (``.json`` or ``.json.gz``).

The ``traceEvents`` array is cut into chunks of whole events and each chunk is decoded with msgspec into typed
structs that keep only the fields profparse uses, so memory stays bounded by the chunk size, not the file size.
A file cut short yields every complete event before the cut and is reported as truncated.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from profparse.errors import InputNotFoundError, TraceFormatError, TruncatedTraceError

CHUNK_BYTES = 1 << 20  # small chunks keep the decoded objects in cache and the allocator reusing memory
MAX_HEADER_BYTES = 256 << 20
MAX_EVENT_BYTES = 64 << 20  # a single event larger than this is hostile or corrupt: refuse, keep memory bounded

Num = int | float


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
    },
):
    """The ``args`` keys profparse reads; all others are skipped without being materialised."""

    correlation: int | None = None
    external_id: int | None = None
    sequence_number: int | None = None
    fwd_thread_id: int | None = None
    stream: int | None = None
    device: int | None = None
    bytes: int | None = None
    mem_bytes: int | None = None
    total_allocated: int | None = None
    total_reserved: int | None = None
    device_type: int | None = None
    device_id: int | None = None
    addr: int | None = None
    python_id: int | None = None
    python_parent_id: int | None = None
    name: str | None = None


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


class FloatText(str):
    """The text of a JSON float, as written in the file (``ts`` of :class:`FastEvent`)."""

    __slots__ = ()


class FastEvent(msgspec.Struct, gc=False):
    """:class:`Event` with ``ts`` kept as written: ``int``, :class:`FloatText` or None.

    The text keeps nanosecond digits that a float64 of microseconds loses, so one decoding pass serves both the
    float and the exact timestamp paths. A chunk whose ``ts`` values have any other type is decoded again with
    :class:`Event` and repaired event by event.
    """

    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: Any = None
    dur: Num | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None


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
_FAST = msgspec.json.Decoder(list[FastEvent], float_hook=FloatText)
_FAST_TS_TYPES = frozenset({int, FloatText, type(None)})
_GET_TS = attrgetter("ts")
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ONE_STRICT = msgspec.json.Decoder(Event)
_ONE_LOOSE = msgspec.json.Decoder(LooseEvent)
_ARGS = msgspec.json.Decoder(Args)
_HEADER = msgspec.json.Decoder(dict[str, Any])

Decoded = tuple[list[Event] | list[FastEvent], bytes | None]

_BLANKS = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.lstrip() removes
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BYTE_POS = re.compile(r"at byte (\d+)")


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


def _integer(value: Any) -> int | None:
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
                clean[field_name] = raw if field_name == "name" and isinstance(raw, str) else _integer(raw)
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


def open_trace(path: str | Path) -> BinaryIO:
    """Open a trace for binary reading, gunzipping when the file starts with the gzip magic bytes."""
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file")
    if p.is_dir():
        raise InputNotFoundError(f"{p}: is a directory, expected a trace file")
    try:
        handle = p.open("rb")
    except OSError as exc:
        raise InputNotFoundError(f"{p}: cannot open ({exc.strerror})") from None
    magic = handle.read(2)
    handle.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


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

    def _read(self, stream: BinaryIO) -> bytes:
        try:
            block = stream.read(self.chunk_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{self.path}: corrupt compressed data ({exc})") from None
        self.report.bytes_read += len(block)
        return block

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
        read the file again with :meth:`chunks_with_text` (which then tries shorter cuts or reports corruption).
        ``None`` is yielded once before the end of the file is decoded: the caller must then count the events of
        every body so far into ``report.events_read`` (messages about the end quote that count).
        """
        return self._stream(defer=True)

    def _stream(self, defer: bool) -> Iterator[memoryview | Decoded | None]:
        with open_trace(self.path) as stream:
            buf = self._read(stream)
            if not buf.strip():
                raise TraceFormatError(f"{self.path}: file is empty")
            match = _EVENTS_KEY.search(buf)
            while match is None:
                if len(buf) > MAX_HEADER_BYTES:
                    raise TraceFormatError(f"{self.path}: no traceEvents array in the first 256 MB")
                block = self._read(stream)
                if not block:
                    self._no_events_array(buf)
                buf += block
                match = _EVENTS_KEY.search(buf)
            self._parse_header(buf[: match.start()])
            self._consumed = match.end()
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
                if eof:
                    events, buf = self._final(buf)
                else:
                    events, buf = self._complete_prefix(buf)
                if events[0]:
                    self.report.events_read += len(events[0])
                    yield events
                del events

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
                events, _ = self._final(bytes(work[:used]))
                if events[0]:
                    self.report.events_read += len(events[0])
                    yield events
                return
            used += got
            cut = next(self._boundaries(work, used, used), None)
            if cut is None:
                if used > 2 * self.chunk_bytes:
                    raise ReadSequentially("no event boundary in two chunks")  # the sequential reader knows
                continue
            self._consumed += cut + 1
            body = memoryview(work)[:cut]
            yield body
            body.release()
            start = cut  # the rest starts after blanks and one comma
            while start < used and work[start] in _BLANKS:
                start += 1
            if start < used and work[start] == 44:  # ','
                start += 1
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
        """Parse what follows the event array (``, "traceName": ...}``); True when it closes the document."""
        rest = tail.strip()
        if rest == b"}":
            return True
        if not rest.startswith(b",") or not rest.endswith(b"}"):
            return False
        try:
            extra = _HEADER.decode(b"{" + rest[1:])
        except msgspec.DecodeError:
            return False
        self.header.update(extra)
        return True

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

    def _decode(self, body: bytes) -> Decoded:
        """Decode ``body`` (events separated by commas, no brackets); fall back per event on type errors.

        The usual result is a list of :class:`FastEvent` and the JSON text; after a fallback, a list of
        :class:`Event` and None.
        """
        return self._decode_data(b"[" + body + b"]")

    def _decode_data(self, data: bytes | memoryview) -> Decoded:
        """:meth:`_decode` of a JSON array (``[`` + events + ``]``), e.g. a view of shared memory."""
        try:
            fast = _FAST.decode(data)
        except msgspec.ValidationError:
            pass
        else:
            if set(map(type, map(_GET_TS, fast))) <= _FAST_TS_TYPES:
                return fast, data
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

    def _error_position(self, exc: Exception) -> int | None:
        found = _BYTE_POS.search(str(exc))
        return int(found.group(1)) - 1 if found else None  # minus the '[' we added

    def _complete_prefix(self, buf: bytes) -> tuple[Decoded, bytes]:
        """Decode the longest prefix of whole events; return them and the unread rest."""
        tried = 0
        for cut in self._boundaries(buf, len(buf)):
            try:
                events = self._decode(buf[:cut])
            except msgspec.DecodeError as exc:
                pos = self._error_position(exc)
                tried += 1
                if pos is not None and pos < cut - 1 and tried > 2:
                    self._corrupt(pos)
                continue
            self._consumed += cut + 1
            rest = buf[cut:].lstrip()
            return events, rest[1:] if rest.startswith(b",") else rest
        if len(buf) > max(MAX_EVENT_BYTES, 2 * self.chunk_bytes):
            raise TraceFormatError(
                f"{self.path}: an event larger than {MAX_EVENT_BYTES >> 20} MB near byte {self._consumed} "
                "(corrupt or hostile input)"
            )
        return ([], None), buf

    def _corrupt(self, pos: int) -> None:
        raise TraceFormatError(f"{self.path}: malformed JSON near byte {self._consumed + pos}")

    def _final(self, buf: bytes) -> tuple[Decoded, bytes]:
        """Decode what is left at end of file: the last events, ``]`` and the trailer, or a truncated tail."""
        close = len(buf)
        last_close = buf.rfind(b"]")
        first_error: Exception | None = None
        while True:
            close = buf.rfind(b"]", 0, close)
            if close < 0:
                break
            saved = dict(self.header)
            if self._parse_trailer(buf[close + 1 :]):
                body = buf[:close].strip()
                try:
                    return (self._decode(body) if body else ([], None)), b""
                except msgspec.DecodeError as exc:  # that ']' was inside the trailer: look further back
                    self.header = saved
                    first_error = first_error or exc
        if first_error is not None and not self._looks_truncated(buf):
            pos = self._error_position(first_error)
            self._corrupt(pos if pos is not None else 0)
        if last_close >= 0:  # cut inside the trailer: every event is there, only trailing keys are lost
            try:
                events = self._decode(buf[:last_close].strip())
            except msgspec.DecodeError:
                pass
            else:
                self.report.truncated = True
                self.report.truncated_at_byte = self._consumed + len(buf)
                if self.strict:
                    raise TruncatedTraceError(f"{self.path}: truncated after the event array")
                return events, b""
        return self._truncated(buf), b""

    @staticmethod
    def _looks_truncated(buf: bytes) -> bool:
        """A document that ends with '}' was written to the end; anything else was cut short."""
        return not buf.rstrip().endswith(b"}")

    def _truncated(self, buf: bytes) -> Decoded:
        self.report.truncated = True
        events: Decoded = ([], None)
        stripped = buf.rstrip()
        candidates = [len(stripped)] if stripped.endswith(b"}") else []
        candidates += list(self._boundaries(buf, len(buf)))
        for cut in candidates:
            try:
                events = self._decode(buf[:cut])
            except msgspec.DecodeError:
                continue
            break
        self.report.truncated_at_byte = self._consumed + len(buf)
        if self.strict:
            raise TruncatedTraceError(
                f"{self.path}: truncated at byte {self.report.truncated_at_byte} "
                f"after {self.report.events_read + len(events[0])} complete events"
            )
        return events


def decode_args(raw: bytes) -> Args:
    """Decode one ``args`` object (used by tests and tools that build events by hand)."""
    return _ARGS.decode(raw)
