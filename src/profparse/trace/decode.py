"""Streaming decoder for Kineto Chrome traces (``.json`` or ``.json.gz``).

The ``traceEvents`` array is cut into chunks of whole events and each chunk is decoded with msgspec into typed
structs that keep only the fields profparse uses, so memory stays bounded by the chunk size, not the file size.
A file cut short (``.json`` or ``.json.gz``) yields every complete event before the cut and is reported as
truncated. Malformed events in the middle are skipped and counted (:mod:`profparse.trace.recovery`).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from profparse.base.errors import OutOfMemoryError, TraceFormatError, TruncatedTraceError
from profparse.trace.budget import Tally, check_memory, resident_bytes
from profparse.trace.recovery import ChunkDecoder
from profparse.trace.scan import after_separator, event_boundaries, event_ends, trailer_follows, unmatched_close
from profparse.trace.schema import Decoded, Event, FastEvent
from profparse.trace.source import BOM, Gunzip, open_trace

CHUNK_BYTES = 1 << 20  # small chunks keep the decoded objects in cache and the allocator reusing memory
MAX_HEADER_BYTES = 256 << 20
MAX_EVENT_BYTES = 64 << 20  # a single event larger than this is hostile or corrupt: refuse, keep memory bounded
# at most this many events decoded at once (counted as '{' bytes, at least one per event): a chunk of Kineto
# events holds 4,000-6,000 of them (7,000-11,000 '{'), but a chunk of tiny events ('{}') holds ~50x more, whose
# objects and columns at once went far above the estimate (NEED_PER_JSON_BYTE); this many take a few MB
MAX_CHUNK_EVENTS = 1 << 14
# the memory need is projected from what was read at this much JSON (a plain file's size is known: its events'
# density decides early; a .json.gz's inflated size is not, and its first MiB say little about the rest) and at
# every doubling after
FIRST_CHECK_PLAIN = 4 << 20
FIRST_CHECK_GZIP = 16 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_HEADER = msgspec.json.Decoder(dict[str, Any])
_TRAILER_RAW = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


def ends_like_json(fd: int, size: int) -> bool:
    """Whether the file ends, blanks aside, with the ``}`` that closes a JSON document (its last 64 KiB read)."""
    tail = os.pread(fd, min(size, 64 << 10), max(size - (64 << 10), 0)).rstrip()
    return tail.endswith(b"}")


class ReadSequentially(Exception):
    """Raised by :meth:`TraceDecoder.bodies` where only :meth:`TraceDecoder.chunks_with_text` can go on."""


class TraceDecoder(ChunkDecoder):
    """Iterate over a trace's events in decoded chunks; ``header`` holds the top-level keys.

    Usage::

        decoder = TraceDecoder(path)
        for events in decoder.chunks():
            ...
        decoder.header, decoder.report
    """

    def __init__(self, path: str | Path, *, chunk_bytes: int = CHUNK_BYTES, strict: bool = False) -> None:
        super().__init__(str(path), strict=strict)
        self.chunk_bytes = chunk_bytes
        self.header: dict[str, Any] = {}
        self._retry_at = 0  # a long event is pending: decode again once the buffer holds this many bytes
        self._stream_handle: BinaryIO | None = None
        self._disk_bytes = 0
        self._memory_checked_at = 0  # bytes read when the memory need was last projected
        self._size_says_little = False  # a plain file that does not end as a JSON document: check what is read
        self._array_closed = False  # what follows the event array is counted, never held: no memory check then
        self._scan_at = 0  # a buffer without an event boundary is scanned for the array's end at this size
        #: what was read so far holds (the table builder's counts), for the memory checks while reading; None:
        #: only the events this decoder counted
        self.tally: Callable[[], Tally] | None = None
        self._resident_at_start = 0  # this process's memory when reading began: what it holds for the trace is more

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
        the machine has (:func:`memory_budget`). Checked at 4 MiB of JSON (16 MiB of a .json.gz, inflated) and
        every doubling after, so a gzip bomb is stopped after reading a few MiB per GiB it would inflate to, long
        before it fills the memory."""
        read = self.report.bytes_read
        step = self._memory_checked_at + (64 << 20) if self._size_says_little else 2 * self._memory_checked_at
        first = FIRST_CHECK_GZIP if isinstance(stream, Gunzip) else FIRST_CHECK_PLAIN
        if self._array_closed or read < max(first, step):
            return
        self._memory_checked_at = read
        if isinstance(stream, Gunzip):
            consumed = stream.compressed_offset()
            projected = read * self._disk_bytes / consumed if consumed > 0 else read
        else:
            projected = read if self._size_says_little else max(self._disk_bytes, read)
        tally = self.tally() if self.tally is not None else Tally(events=self.report.events_read)
        self.check_memory_for(projected, tally.scaled(projected / read), stage="while")  # at the same rate

    def _check_plain_size(self, stream: BinaryIO) -> None:
        """A plain file's JSON size is known: decide before reading. Unless the file does not end as a JSON
        document does (bytes after the document, or cut short): its size then says little (20 GB of junk after a
        small trace), and the bytes read are checked instead, every 64 MiB, until the event array closes."""
        try:
            self.check_memory_for(self._disk_bytes)
        except OutOfMemoryError:
            if ends_like_json(stream.fileno(), self._disk_bytes):
                raise
            self._size_says_little = True

    def check_memory_for(self, json_bytes: float, tally: Tally | None = None, stage: str = "before") -> None:
        """Raise :class:`OutOfMemoryError` when ``json_bytes`` of JSON holding ``tally`` need more memory than
        there is (what this process took since reading began counts as held)."""
        held = max(resident_bytes() - self._resident_at_start, 0) if stage != "before" else 0
        check_memory(self.path, json_bytes, self._disk_bytes if self._gzip else None, tally, held=held, stage=stage)

    def check_memory_after(self, tally: Tally) -> None:
        """The check with the exact counts once every event is read: the JSON up to the event array's end."""
        end = self.report.events_end_byte
        self.check_memory_for(end if end is not None else self.report.bytes_read, tally, stage="after")

    @property
    def _gzip(self) -> bool:
        return isinstance(self._stream_handle, Gunzip)

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
        with :meth:`decode_body` gives the same events. If one fails with ``msgspec.DecodeError``, the caller must
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
            self._resident_at_start = resident_bytes()
            self._disk_bytes = os.fstat(stream.raw.fileno() if isinstance(stream, Gunzip) else stream.fileno()).st_size
            if not isinstance(stream, Gunzip):
                self._check_plain_size(stream)
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
            if not buf.lstrip().startswith((b"{", b"[")):  # NULs, binary: no JSON, decided at the first block
                self._no_events_array(buf[:4096])
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
        """Candidate ends of events (:func:`~profparse.trace.scan.event_boundaries`) that split ``buf[:size]`` into
        pieces of at most :data:`MAX_CHUNK_EVENTS` events, in order; [] when it holds fewer (as a trace's chunks do).

        Events are counted as ``{`` bytes: every event has one, and counting them is a few hundred times cheaper
        than a scan of the structure (:func:`event_ends`). A cut may lie inside an event (a ``},{`` in a
        string): decoding then stops at the last whole event before it, and the next piece goes on from there."""
        a = np.frombuffer(buf, dtype=np.uint8, count=size)
        if np.count_nonzero(a == 123) <= MAX_CHUNK_EVENTS:
            return []
        cuts: list[int] = []
        for limit in np.flatnonzero(a == 123)[MAX_CHUNK_EVENTS::MAX_CHUNK_EVENTS].tolist():
            cut = next(event_boundaries(buf, limit, size), (None,))[0]
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
            start = after_separator(work, stop, len(buf))
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
            cut = next(event_boundaries(work, used, used), (None,))[0]
            if cut is None:
                if used > 2 * self.chunk_bytes:
                    raise ReadSequentially("no event boundary in two chunks")  # the sequential reader knows
                continue
            start = 0
            for end in [*self._piece_cuts(work, cut), cut]:  # many tiny events: a bounded number per body
                body = memoryview(work)[start:end]
                yield body
                body.release()
                start = after_separator(work, end, used)
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
        self._array_closed = True
        state = [0, 0, 0]
        pieces: list[bytes] = []
        held = 0
        data, pos = rest, 1
        while True:
            end = unmatched_close(data, pos, state)
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

    def _complete_prefix(self, buf: bytes) -> tuple[list[Decoded], bytes]:
        """Decode the longest prefix of whole events (skipping malformed ones); return them and the unread rest.

        The usual case is one decode up to the last ``},{``. After an error, :meth:`_decode_region` finds out
        what went wrong once; a long event still being read is tried again only when the buffer has doubled, so
        the bytes of even a 64 MB event are decoded a few times at most.
        """
        if len(buf) < self._retry_at:
            return [], buf
        cut = next(event_boundaries(buf, len(buf)), (None,))[0]
        if cut is None:
            start = len(buf) - len(buf.lstrip())  # blanks before the next event go (a whitespace bomb stays small)
            self._consumed += start
            buf = buf[start:]
            if len(buf) > max(self._scan_at, 2 * self.chunk_bytes):
                # long without a boundary: a long event, or the array closed and a long trailer follows (a long
                # string, say); scanned again only once the buffer doubled, so each byte a few times at most
                self._scan_at = 2 * len(buf)
                _, close = event_ends(buf, 0, len(buf))
                if close is not None and buf[close] == 93 and trailer_follows(buf, close):
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
        stop = after_separator(buf, stop, len(buf))
        self._consumed += stop
        rest = buf[stop:]
        self._retry_at = 2 * len(rest) if stop < cut else 0
        self._check_damage(final=False)
        return items, rest

    def _final(self, buf: bytes) -> tuple[list[Decoded], bytes]:
        """Decode what is left at end of file: the last events, ``]`` and the trailer, or a truncated tail."""
        # The ']' closing the events: where the structure closes the array when the text is intact (the last ']'
        # of the text may close an array of the trailer: Kineto writes ``"INFO": ["...", ...]`` after the events),
        # else the last ']' (a damaged event can put a bracket that closes early); the first whose trailer parses.
        # One vectorised scan of the last chunk.
        ends, array_close = event_ends(buf, 0, len(buf))
        structural = array_close is not None and buf[array_close] == 93
        candidates = [array_close] if structural else []
        last = buf.rfind(b"]")
        if last >= 0 and last not in candidates and not (structural and trailer_follows(buf, array_close)):
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
        """:meth:`_final` by the structure of the text (``ends``, ``close``: :func:`event_ends` of ``buf``):
        events up to the ``]`` that closes the array (skipping malformed ones), the trailer up to the ``}`` that
        closes the document, and anything after that ignored (counted in ``report.trailing_bytes``, not a
        truncation). No ``]``: the file was cut short."""
        if close is None or buf[close] != 93:  # ']'
            stop = int(ends[-1]) if ends.size else 0
            items = self._decode_region(buf, 0, stop)[0] if stop else []
            self._mark_truncated(buf, sum(len(e[0]) for e in items), in_events=True)
            return items
        items = self._decode_region(buf, 0, close)[0] if buf[:close].strip() else []
        _, end = event_ends(buf, close + 1, len(buf))
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
