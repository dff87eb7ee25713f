"""The structure of JSON text found by scanning its bytes (vectorised with numpy where it matters): candidate
event boundaries, ends of whole events, which bytes lie inside strings, where an array closes, and in-place
repairs of text msgspec refuses (lone surrogate escapes, NaN / Infinity)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

_BLANKS = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.lstrip() removes
BYTE_POSITION = re.compile(r"\(byte (\d+)\)")  # where msgspec says a decode error is
_NONFINITE = re.compile(rb"(?<=[:,\[])(\s*)-?(?:NaN|Infinity)(?=\s*[,}\]])")  # written by Python's json module
_SCAN_BLOCK = 1 << 22
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # a surrogate escape, \ud800 to \udfff
_REPLACEMENT = b"\\ufffd"  # as long as the escape it replaces: offsets stay valid


def event_ends(buf: bytes | bytearray, start: int, stop: int) -> tuple[np.ndarray, int | None]:
    """Structure of ``buf[start:stop]``, which starts outside any string at nesting depth 0: the positions just
    after each ``}`` that closes a top-level value (ends of whole events), and the position of the first closing
    bracket without its opening one (the ``]`` that closes the event array), or None.

    Vectorised (numpy, in 4 MiB blocks): used only after a decode error, where the candidate boundaries of
    :func:`event_boundaries` (any ``},{``) may lie inside a string or a nested value.
    """
    ends: list[np.ndarray] = []
    depth, in_string, backslashes = 0, 0, 0
    pos = start
    while pos < stop:
        end = min(pos + _SCAN_BLOCK, stop)
        a = np.frombuffer(buf, dtype=np.uint8, count=end - pos, offset=pos)
        inside, in_string, backslashes = inside_strings(a, in_string, backslashes)
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


def inside_strings(a: np.ndarray, in_string: int, backslashes: int) -> tuple[np.ndarray, int, int]:
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


def unmatched_close(buf: bytes | bytearray, start: int, state: list[int]) -> int | None:
    """The position of the first closing bracket of ``buf[start:]`` without its opening one, outside strings, or
    None. ``state`` (depth, inside a string, backslashes before) is where the text before ``buf[start]`` left the
    scan, and is updated: the scan goes on in the next block of a stream. Vectorised like :func:`event_ends`."""
    depth, in_string, backslashes = state
    pos = start
    while pos < len(buf):
        end = min(pos + _SCAN_BLOCK, len(buf))
        a = np.frombuffer(buf, dtype=np.uint8, count=end - pos, offset=pos)
        inside, in_string, backslashes = inside_strings(a, in_string, backslashes)
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


def trailer_follows(buf: bytes | bytearray, close: int) -> bool:
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


def closing_bracket(buf: bytes | bytearray, pos: int, stop: int, exc: Exception) -> int | None:
    """Where the event array closes in ``buf[pos:stop]`` (events decoded as ``[`` + that text + ``]``), when
    ``exc`` says so: msgspec read a whole array and found more after it, and what follows its ``]`` ends a
    document (:func:`trailer_follows`); else None. msgspec found the bracket with the strings skipped, so this
    costs nothing while the events go on."""
    message = str(exc)
    if "trailing characters" not in message:
        return None
    found = BYTE_POSITION.search(message)
    if found is None:
        return None
    trailing = pos + int(found.group(1)) - 2  # msgspec counts from 1, and the '[' put in front
    if not pos < trailing < stop:
        return None
    close = buf.rfind(b"]", pos, trailing)
    if close < 0 or bytes(buf[close + 1 : trailing]).strip(b" \t\r\n"):
        return None
    return close if trailer_follows(buf, close) else None


def repair_surrogates(buf: bytearray, start: int, stop: int) -> int:
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


def after_separator(buf: bytes | bytearray, pos: int, stop: int) -> int:
    """``pos`` moved past blanks and at most one comma (and the blanks after it)."""
    while pos < stop and buf[pos] in _BLANKS:
        pos += 1
    if pos < stop and buf[pos] == 44:  # ','
        pos += 1
        while pos < stop and buf[pos] in _BLANKS:
            pos += 1
    return pos


def event_boundaries(buf: bytes | bytearray, limit: int, size: int | None = None) -> Iterator[tuple[int, int]]:
    """Each ``}`` ``,`` ``{`` before ``limit``, last first, as (just after the ``}``, the ``{``): a candidate end of
    a whole event and the start of the next. ``size``: the bytes of ``buf`` in use (default: all)."""
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
                yield idx + 1, j
        end = idx


def quote_nonfinite(region: bytes) -> tuple[bytes | None, int]:
    """``region`` with every NaN / Infinity / -Infinity value outside strings quoted, and how many; (None, 0)
    when it holds none."""
    matches = list(_NONFINITE.finditer(region))
    if not matches:
        return None, 0
    inside, _, _ = inside_strings(np.frombuffer(region, dtype=np.uint8), 0, 0)
    keep = [m for m in matches if not inside[m.start()]]
    if not keep:
        return None, 0
    parts, last = [], 0
    for m in keep:
        parts += [region[last : m.start()], m.group(1), b'"', region[m.start(1) + len(m.group(1)) : m.end()], b'"']
        last = m.end()
    parts.append(region[last:])
    return b"".join(parts), len(keep)
