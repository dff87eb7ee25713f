"""What names an entry and what it stores: the content hash of a trace (with its ``stat/`` record), the code
fingerprint, the parse options, and the file names of a verb's stored results.

numpy, pandas and pyarrow are never imported here: finding an entry (the key, a stored summary text:
summarize_cmd) must not pay their imports, most of a cached summarize's time (docs/performance.md)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import xxhash

from profparse.cache.folders import RECORD_NAME
from profparse.cache.sealed import digest_rest

FORMAT_VERSION = 2  # 2: every stored file carries its checksum
HASH_DIGITS = 32  # file_hash's hex digits (a stat/ record of another length is from an older profparse)
RACY_NS = 2_000_000_000
LIBRARIES = ("numpy", "pandas", "pyarrow", "msgspec")  # whose versions decide the parsed tables


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of what decides the cached outputs: profparse's sources (the report's assets too) and version, the
    format, the libraries.

    A library counts by where its ``__init__.py`` lies and that file's size and mtime, found without importing
    it (any reinstall or upgrade rewrites it): importing numpy/pandas/pyarrow for ``__version__`` was half of a
    warm summarize's time, and ``importlib.metadata`` is slow too."""
    from profparse.base.version import __version__

    h = hashlib.blake2b(digest_size=16)
    for text in (__version__, str(FORMAT_VERSION)):
        h.update(text.encode() + b"\0")
    h.update(library_stamp(LIBRARIES).encode() + b"\0")
    package = Path(__file__).resolve().parents[1]  # the profparse package: this file is cache/__init__.py
    # the report's css/js are written into every cached page, so they count as sources
    sources = [*package.rglob("*.py"), *package.rglob("assets/*.css"), *package.rglob("assets/*.js")]
    for source in sorted(sources):
        h.update(str(source.relative_to(package)).encode() + b"\0")
        h.update(source.read_bytes())
    return h.hexdigest()


def file_hash(path: str | Path) -> str:
    """XXH3-128 of a file's bytes, streamed (32 hex digits).

    Non-cryptographic on purpose: it tells a user's own files apart (an accidental collision of 128 bits is out
    of reach), and ~20x faster than blake2b: it is paid on every file's first run."""
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        digest_rest(f, h)
    return h.hexdigest()


#: content hashes this process computed, by stat id, of files older than RACY_NS (as the stat/ records): a
#: summarize that misses its stored text and then parses (api.load keys the file again) does not hash twice even
#: where the cache folder is read-only. A file written less than RACY_NS ago is hashed each time: a rewrite within
#: the same clock tick, same size, leaves its stat unchanged.
_HASHED: dict[tuple[int, ...], str] = {}


def load_options(include_marks: bool, strict: bool, peak_tflops: float | None) -> dict[str, Any]:
    """The options an entry's key holds (what :func:`profparse.api.load` parses with)."""
    options: dict[str, Any] = {"include_marks": include_marks, "strict": strict}
    if peak_tflops is not None:  # changes the efficiency tables: its own entry (the default keeps older keys)
        options["peak_tflops"] = float(peak_tflops)
    return options


def options_digest(options: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(options, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


def text_file(options: dict[str, Any]) -> str:
    """The file name of a stored text (a verb's rendered result) for the verb's options."""
    return f"text.{options_digest(options)}.json"


def output_folder(options: dict[str, Any]) -> str:
    """The folder name of a verb's stored files (and their ``result.json``) for the verb's options."""
    return f"out.{options_digest(options)}"


def as_stored(options: dict[str, Any]) -> Any:
    """``options`` as they read back from a stored JSON file (what a stored result is compared with)."""
    return json.loads(json.dumps(options, sort_keys=True, default=str))


def library_stamp(names: Iterable[str]) -> str:
    """Where each library's ``__init__.py`` lies, its size and mtime (changed by any reinstall), found without
    importing it: part of the key of what a library renders (plot's figures: matplotlib)."""
    import importlib.util

    parts = []
    for library in names:
        spec = importlib.util.find_spec(library)
        origin = spec.origin if spec is not None else None
        try:
            st = os.stat(origin) if origin else None
        except OSError:
            st = None
        parts.append(f"{library}={origin}:{st and st.st_size}:{st and st.st_mtime_ns}")
    return ";".join(parts)


def stat_id(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file's versions apart without reading it (a ``stat/`` record's key)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def content_hash(
    path: str | Path, stat_root: Path, record: Callable[[Path, str], None]
) -> tuple[str, tuple[int, ...]] | None:
    """The content hash of a regular file and its stat id, or None (not a regular file, or changed while hashed).

    The hash is read from the file's ``stat/`` record under ``stat_root`` when there is one; else computed, and
    ``record(record_path, hash)`` is called to store it when the file's times are more than :data:`RACY_NS` old
    (git's "racy" rule: a write later than that gives a different ctime, which no user-space call can set back).
    Raises OSError when the file cannot be read."""
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        return None
    sid = stat_id(before)
    record_path = stat_root / hashlib.blake2b(repr(sid).encode(), digest_size=16).hexdigest()
    try:
        content = record_path.read_text().strip()
    except OSError:
        content = ""
    if len(content) != HASH_DIGITS or not RECORD_NAME.fullmatch(content):  # none, older, or damaged
        content = _HASHED.get(sid) or file_hash(path)
        after = os.stat(path)
        if stat_id(after) != sid:
            return None  # changed while hashed
        if time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > RACY_NS:
            record(record_path, content)
            _HASHED[sid] = content  # not for a racy file: rewritten within one clock tick, its stat is equal
    return content, sid


def entry_name(content: str, options: dict[str, Any]) -> str:
    """The name of the entry of a file's ``content`` hash parsed with ``options`` by this code."""
    config = hashlib.blake2b(
        (code_fingerprint() + json.dumps(options, sort_keys=True)).encode(), digest_size=8
    ).hexdigest()
    return f"e-{content}-{config}"


def unchanged(path: str | Path, sid: tuple[int, ...]) -> bool:
    """Whether the file still has the stat id ``sid``."""
    try:
        return stat_id(os.stat(path)) == sid
    except OSError:
        return False
