"""Opening a trace file: regular files only, gunzipped when compressed (a cut gzip stream reads up to the cut)."""

from __future__ import annotations

import stat
import zlib
from pathlib import Path
from typing import BinaryIO

from profparse.base.errors import InputNotFoundError, TraceFormatError

BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark: accepted at the start, as JSON readers do


class Gunzip:
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

    def __enter__(self) -> Gunzip:
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

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the inflated stream; with ``n`` negative, all that is left (as a file's read)."""
        if n < 0:
            parts = []
            while part := self.read(1 << 20):
                parts.append(part)
            return b"".join(parts)
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
        return Gunzip(handle, str(p))  # type: ignore[return-value]
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
