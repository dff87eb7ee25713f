"""Decoding a chunk of event text into structs, with damage recovery.

A malformed event in the middle is skipped and counted: after a decode error the decoder finds the error's position
(from msgspec's message, or by search), keeps the events before it and resynchronises at the next event boundary
once, so every byte is decoded a bounded number of times whatever the damage (linear time). Events with odd field
types are decoded one by one and repaired (:func:`profparse.trace.schema.coerce_event`).
"""

from __future__ import annotations

import re

import msgspec

from profparse.base.errors import TraceFormatError
from profparse.trace.scan import (
    BYTE_POSITION,
    after_separator,
    closing_bracket,
    event_ends,
    quote_nonfinite,
    repair_surrogates,
)
from profparse.trace.schema import (
    Decoded,
    DecodeReport,
    Event,
    FastEvent,
    LooseEvent,
    coerce_event,
    fast_chunk,
    own_text_args,
)

MAX_SKIPPED_FRACTION = 0.01  # more of the events' bytes malformed than this: too damaged for totals to mean much
_STRICT = msgspec.json.Decoder(list[Event])
_FAST = msgspec.json.Decoder(list[FastEvent])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ONE_STRICT = msgspec.json.Decoder(Event)
_ONE_LOOSE = msgspec.json.Decoder(LooseEvent)
_NEXT_EVENT = re.compile(rb"}\s*,\s*{")  # a plausible start of the next event, to resynchronise after an error
_NONFINITE_AT = re.compile(rb"-?(?:NaN|Infinity)")


class ChunkDecoder:
    """Decode chunks of a trace's event text, skipping malformed events (counted in ``report``); the base of
    :class:`profparse.trace.decode.TraceDecoder`, and what a worker process decodes a chunk with."""

    def __init__(self, path: str, *, strict: bool = False) -> None:
        self.path = path
        self.strict = strict
        self.report = DecodeReport(path=path)
        self._consumed = 0  # bytes of the decompressed stream before the current buffer
        self._close_in_region: int | None = None  # set by _decode_region: where the event array closed

    def decode_body(self, body: bytes | bytearray) -> Decoded:
        """Decode ``body`` (events separated by commas, no brackets); fall back per event on type errors.

        The usual result is a list of :class:`FastEvent` and the JSON text; after a fallback, a list of
        :class:`Event` and None.
        """
        return self.decode_array(b"[" + body + b"]")

    def decode_array(self, data: bytes | memoryview) -> Decoded:
        """:meth:`decode_body` of a JSON array (``[`` + events + ``]``), e.g. a view of shared memory."""
        try:
            fast = _FAST.decode(data)
        except msgspec.ValidationError:
            pass
        else:
            chunk = fast_chunk(fast)
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
            pos = after_separator(buf, pos, stop)
            if pos >= stop:
                return items, stop
            try:
                items.append(self._decode_span(buf, pos, stop, copy_texts))
                return items, stop
            except msgspec.DecodeError as exc:
                close = None if final else closing_bracket(buf, pos, stop, exc)
                if close is not None:  # the event array ends inside the region: decode the events before it
                    if buf[pos:close].strip():
                        items += self._decode_region(buf, pos, close, repair=repair)[0]
                    self._close_in_region = close
                    return items, close
                if surrogates:
                    surrogates = False
                    fixed = repair_surrogates(buf, pos, stop)  # in place: ``buf`` is this reader's copy
                    if fixed:
                        self.report.lone_surrogates += fixed
                        continue
                err = self._error_offset(buf, pos, stop, exc)
            copy_texts = False
            ends, _ = event_ends(buf, pos, stop) if err is None else (None, None)
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
                ends, _ = event_ends(buf, pos, err)
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
        """:meth:`decode_body` of ``buf[pos:stop]`` without copying it: the bytes just before and after are set to
        ``[`` and ``]`` for the call, then restored. A decode that fails after a few bytes then costs a few bytes,
        not a copy of the rest of the chunk (garbage with an error every few bytes stays linear).

        ``ts`` (:class:`FastEvent`) and text ``args`` (shapes, collective args) decode as msgspec.Raw views into
        the decoded buffer, which is reused afterwards: with ``copy_texts`` the span is decoded from a copy (one
        memcpy per chunk, which costs too little to see; copying each Raw on its own after decoding made decoding
        nearly twice as slow). Without (a retry after an error,
        so that a region is copied once at most), the Raw values are given their own bytes if a decode kept any.
        """
        if pos < 1 or stop >= len(buf):
            return self.decode_body(bytes(buf[pos:stop]))
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
                        own_text_args(decoded[0])
                    view.release()
            events, text = decoded
        finally:
            buf[pos - 1], buf[stop] = before, after
        return events, (None if text is None else bytes(buf[pos:stop]).join((b"[", b"]")))

    def _repair_nonfinite(self, buf: bytes | bytearray, start: int, stop: int) -> bytes | None:
        """``buf[start:stop]`` with every NaN / Infinity / -Infinity value (outside strings) quoted: then repaired
        like any numeric string, into a non-finite float (an event with a non-finite ts or dur is dropped and
        counted; an ``args`` id becomes missing)."""
        fixed, count = quote_nonfinite(bytes(buf[start:stop]))
        self.report.nonfinite_values += count
        return fixed

    def _error_offset(self, buf: bytes | bytearray, pos: int, stop: int, exc: Exception) -> int | None:
        """Where in ``buf`` decoding ``buf[pos:stop]`` failed; None when it failed because the text ends inside
        a value (the candidate end ``stop`` was not the end of an event)."""
        message = str(exc)
        if "truncated" in message:
            return None
        found = BYTE_POSITION.search(message)
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
        ends, _ = event_ends(buf, pos, stop)
        good, bad, step = -1, len(ends), 1
        while good + step < len(ends):  # gallop: ends[good] decodes, find a failing one
            try:
                self.decode_body(buf[pos : ends[good + step]])
                good += step
                step *= 2
            except msgspec.DecodeError:
                bad = good + step
                break
        while bad - good > 1:
            mid = (good + bad) // 2
            try:
                self.decode_body(buf[pos : ends[mid]])
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

    def _trailer_damaged(self, where: int, size: int) -> None:
        """The text after the ``]`` taken for the end of the events is no trailer: skipped as damage."""
        self.report.drop("malformed JSON (skipped to the next event)")
        self.report.skipped_bytes += size
        if self.report.malformed_at_byte is None:
            self.report.malformed_at_byte = where
