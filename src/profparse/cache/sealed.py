"""Every file the cache stores carries its checksum: Arrow files a trailer (:func:`seal`), JSON files a field
(:func:`sealed_json`); a file that does not match is a :class:`CorruptEntry`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

_CHUNK = 1 << 20
#: The end of every stored Arrow file: XXH3-128 of the bytes before it, then this tag.
_SEAL_TAG = b"ppxxh3v1"
_SEAL_BYTES = 16 + len(_SEAL_TAG)


class CorruptEntry(Exception):
    """A cache entry that does not read back."""


def digest_rest(f: BinaryIO, digest: Any) -> None:
    """Feed what is left of the open file ``f`` to ``digest``, in chunks (never the whole file in memory)."""
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):
        digest.update(view[:n])


def seal(path: Path) -> None:
    """Append the file's XXH3-128 and :data:`_SEAL_TAG`: a flipped bit anywhere in it is then found on reading
    (LZ4 and Arrow decoding miss most of them: a flip in a literal or a value decodes to another value)."""
    digest = xxhash.xxh3_128()
    with open(path, "r+b", buffering=0) as f:
        digest_rest(f, digest)
        f.write(digest.digest() + _SEAL_TAG)


def sealed_payload(path: Path, verify: bool = True) -> Any:
    """The Arrow bytes of a sealed file, memory-mapped (no copy), after checking its checksum."""
    import pyarrow as pa

    source = pa.memory_map(str(path))  # not closed here: the buffers handed out keep the mapping alive
    data = source.read_buffer()
    if data.size < _SEAL_BYTES or data[data.size - len(_SEAL_TAG) :].to_pybytes() != _SEAL_TAG:
        raise CorruptEntry(f"{path.name} has no checksum")
    payload = data.slice(0, data.size - _SEAL_BYTES)
    if verify:
        stored = data[payload.size : payload.size + 16].to_pybytes()
        if xxhash.xxh3_128_digest(memoryview(payload)) != stored:
            raise CorruptEntry(f"{path.name} does not match its checksum")
    return payload


def json_digest(body: dict[str, Any]) -> str:
    """XXH3-128 of ``body`` as JSON reads it back (keys sorted): the checksum of a stored JSON file."""
    return xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True).encode())


def sealed_json(body: dict[str, Any], default: Callable[[Any], Any] = str) -> str:
    """``body`` as JSON with its ``checksum`` field (of the body as it reads back: integer keys as strings,
    other objects as ``default`` makes them; a ``checksum`` it holds, from a stored body, is replaced)."""
    plain = json.loads(json.dumps(body, sort_keys=True, default=default))
    plain.pop("checksum", None)
    return json.dumps({**plain, "checksum": json_digest(plain)}, sort_keys=True)


def short(exc: BaseException) -> str:
    """The first line of an error (what a warning about an unreadable file quotes)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
