"""A user-level cache of parsed traces, so that a second verb on the same trace does not read the JSON again.

One entry per (trace content, profparse code, parse options), a folder of Arrow IPC files (LZ4-compressed:
an event table takes a tenth of the space, for a little more time per warm load; docs/cache.md) plus
``meta.json``:

- ``events.arrow`` (the raw event table), ``links.arrow`` and ``attribution.arrow`` (their per-row arrays),
  ``links.threads.arrow`` and ``attribution.steps.arrow``, and in ``meta.json`` the header, the decode report,
  track names and the rules: everything :class:`profparse.api.ParsedTrace` is built from;
- ``table.<name>.arrow``: each table a verb computed (stage summary, kernels, ops, warnings, analyses), added
  as it is computed, so the next verb reads it instead of computing it.

Key: XXH3-128 of the file's bytes, and a blake2b of profparse's version, :data:`FORMAT_VERSION`, the source of every
profparse module and the versions of numpy/pandas/pyarrow/msgspec (so an edited checkout never reads stale
tables), and the options that change results (``include_marks``, ``strict``). XXH3 hashes a trace ~20x faster
than blake2b did (a tenth of a first ``parse``); a ``stat/`` record (device, inode, size, mtime_ns,
ctime_ns -> hash) skips it when the file is unchanged, and is only written when the file's times are more
than :data:`RACY_NS` old (git's "racy" rule: a write later than that gives a different ctime, which no
user-space call can set back).

Ownership: the cache only writes, evicts and sweeps in a folder it made, marked by :data:`MARKER` (mode 0700,
owned by the user); a configured folder that already holds other files gets a :data:`SUBFOLDER` of its own, and
only names the cache generates (:data:`_ENTRY_NAME`, :data:`_TEMP_NAME`, :data:`_RECORD_NAME`), regular files
and real folders, are ever removed.

Safety: every file and the entry folder are written under a temporary name in the cache folder and renamed
into place (readers never see half an entry; of two writers of one entry the first rename wins, the second
is discarded); each table is checked to read back identical before it is kept; every stored file carries an
XXH3-128 checksum (Arrow files a trailer, JSON files a field); an entry that does not read back (truncated,
flipped bits, wrong types) is removed with a warning and the trace is parsed again; any OSError while writing
(read-only folder, full disk) turns caching off for the run with a note, never an error.
Size-bounded: past ``PROFPARSE_CACHE_MAX_BYTES`` (default 2 GiB; 0 turns the cache off) the least recently
used entries are removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import xxhash

if TYPE_CHECKING:
    import pandas as pd

# numpy, pandas and pyarrow are imported inside the functions that use them: finding an entry (the key, a stored
# summary text: summarize_cmd) must not pay their imports, most of a cached summarize's time (docs/performance.md).

FORMAT_VERSION = 2  # 2: every stored file carries its checksum
HASH_DIGITS = 32  # file_hash's hex digits (a stat/ record of another length is from an older profparse)
DIR_ENV = "PROFPARSE_CACHE_DIR"
MAX_ENV = "PROFPARSE_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
RACY_NS = 2_000_000_000
STALE_TEMP_S = 3600  # a temporary folder this old was left by a killed run
_CHUNK = 1 << 20
LIBRARIES = ("numpy", "pandas", "pyarrow", "msgspec")  # whose versions decide the parsed tables
_CORE = ("events.arrow", "links.arrow", "links.threads.arrow", "attribution.arrow", "attribution.steps.arrow")

#: The file that makes a folder the cache's own: a cache directory tag (https://bford.info/cachedir/, so backup
#: tools skip the folder) whose exact text says profparse wrote it; another tool's tag is not profparse's.
MARKER = "CACHEDIR.TAG"
MARKER_TEXT = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This folder is profparse's parsed-trace cache (docs/cache.md); profparse may delete anything in it.\n"
)
#: Where the cache keeps its data when the configured folder already holds files it did not make.
SUBFOLDER = "profparse-cache"
# the only names the cache ever removes: entries, temporaries (uuid4().hex), stat records
_ENTRY_NAME = re.compile(r"e-[0-9a-f]{32}-[0-9a-f]{16}")
_TEMP_NAME = re.compile(r"\.tmp-[0-9a-f]{32}")
_RECORD_NAME = re.compile(r"[0-9a-f]{32}")
#: Exit codes a stored result may carry (docs/exit-codes.md, 0 to 11): a text claiming any other is not replayed.
REPLAYABLE_CODES = frozenset(range(12))
#: The end of every stored Arrow file: XXH3-128 of the bytes before it, then this tag.
_SEAL_TAG = b"ppxxh3v1"
_SEAL_BYTES = 16 + len(_SEAL_TAG)

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"profparse: {message}", file=sys.stderr)


def cache_root() -> Path:
    """``$PROFPARSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/profparse``, else ``~/.cache/profparse``."""
    env = os.environ.get(DIR_ENV, "").strip()
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "profparse"


def max_bytes(notify: Notify = _stderr) -> int:
    text = os.environ.get(MAX_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
        if value < 0:
            raise ValueError
    except ValueError:
        notify(f"note: {MAX_ENV}={text!r} is not a byte count; using {DEFAULT_MAX_BYTES}")
        return DEFAULT_MAX_BYTES
    return value


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of what decides the parsed tables: profparse's sources and version, the format, the libraries.

    A library counts by where its ``__init__.py`` lies and that file's size and mtime, found without importing
    it (any reinstall or upgrade rewrites it): importing numpy/pandas/pyarrow for ``__version__`` was half of a
    warm summarize's time, and ``importlib.metadata`` is slow too."""
    from profparse.base.version import __version__

    h = hashlib.blake2b(digest_size=16)
    for text in (__version__, str(FORMAT_VERSION)):
        h.update(text.encode() + b"\0")
    h.update(library_stamp(LIBRARIES).encode() + b"\0")
    package = Path(__file__).resolve().parents[1]  # the profparse package: this file is cache/__init__.py
    for source in sorted(package.rglob("*.py")):
        h.update(str(source.relative_to(package)).encode() + b"\0")
        h.update(source.read_bytes())
    return h.hexdigest()


def file_hash(path: str | Path) -> str:
    """XXH3-128 of a file's bytes, streamed (32 hex digits).

    Non-cryptographic on purpose: it tells a user's own files apart (an accidental collision of 128 bits is out
    of reach), and ~20x faster than blake2b: it is paid on every file's first run."""
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        _digest_rest(f, h)
    return h.hexdigest()


def _digest_rest(f: BinaryIO, digest: Any) -> None:
    """Feed what is left of the open file ``f`` to ``digest``, in chunks (never the whole file in memory)."""
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):
        digest.update(view[:n])


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


def _options_digest(options: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(options, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


def _text_file(options: dict[str, Any]) -> str:
    """The file name of a stored text (a verb's rendered result) for the verb's options."""
    return f"text.{_options_digest(options)}.json"


def _output_folder(options: dict[str, Any]) -> str:
    """The folder name of a verb's stored files (and their ``result.json``) for the verb's options."""
    return f"out.{_options_digest(options)}"


def _as_stored(options: dict[str, Any]) -> Any:
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


def _stat_id(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# -- Arrow files ----------------------------------------------------------------------------------------------------


#: rows per record batch of a stored frame: a whole event table converted at once raised the peak of a first
#: ``parse`` by over half the JSON's size (its all-NULL args columns, which take no memory in pandas, materialised
#: too); converting a batch at a time keeps one batch of it
BATCH_ROWS = 1 << 18


def write_frame(path: Path, frame: pd.DataFrame) -> None:
    """One DataFrame as an Arrow IPC file (a zero-row frame still as one batch, so categories survive), a long one
    without object columns one :data:`BATCH_ROWS` slice at a time (every slice has the same Arrow types); sealed
    with its checksum (:func:`_seal`)."""
    import pyarrow as pa

    if len(frame) <= BATCH_ROWS or any(str(t) == "object" for t in frame.dtypes):
        slices = [frame]
    else:
        slices = [frame.iloc[start : start + BATCH_ROWS] for start in range(0, len(frame), BATCH_ROWS)]
    first = pa.Table.from_pandas(slices[0], preserve_index=None)
    schema = first.schema
    batches = first.combine_chunks().to_batches() or [pa.RecordBatch.from_pandas(frame, preserve_index=None)]
    del first
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
        del batches
        for part in slices[1:]:
            writer.write_table(pa.Table.from_pandas(part, preserve_index=None, schema=schema))
    _seal(path)


def _seal(path: Path) -> None:
    """Append the file's XXH3-128 and :data:`_SEAL_TAG`: a flipped bit anywhere in it is then found on reading
    (LZ4 and Arrow decoding miss most of them: a flip in a literal or a value decodes to another value)."""
    digest = xxhash.xxh3_128()
    with open(path, "r+b", buffering=0) as f:
        _digest_rest(f, digest)
        f.write(digest.digest() + _SEAL_TAG)


def _sealed_payload(path: Path, verify: bool = True) -> Any:
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


def read_frame(path: Path) -> pd.DataFrame:
    """A frame :func:`write_frame` stored, checked against its checksum.

    The file is memory-mapped and the decoded Arrow buffers become the frame's columns without a second copy
    (``split_blocks``: no consolidation into 2-D blocks; ``self_destruct``: each column's Arrow buffers are
    released as it is converted), and a frame of several batches is decoded one column at a time (joining a
    column's batches copies it: one column at a time, never the whole table): a warm load must not need more
    memory than parsing the JSON. Numeric columns are then read-only views, which pandas copies on write.

    The buffers come from the C library's allocator, which hands a freed large block back to the system at once:
    Arrow's default (mimalloc) kept tens of MB more resident after reading a large event table."""
    import pandas as pd
    import pyarrow as pa

    pool = pa.system_memory_pool()
    payload = _sealed_payload(path)
    reader = pa.ipc.open_file(payload, memory_pool=pool)
    fields = len(reader.schema)
    if reader.num_record_batches <= 1 or fields <= 1:
        table = reader.read_all()
        del reader
        frame = table.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True)
        del table  # self_destruct leaves the table unusable: drop it
        return frame
    del reader
    columns = []
    for i in range(fields):
        options = pa.ipc.IpcReadOptions(included_fields=[i])
        part = pa.ipc.open_file(payload, options=options, memory_pool=pool).read_all()
        columns.append(part.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True))
        del part
    return pd.concat(columns, axis=1)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Identical values, dtypes, columns and index (what a cached table must give back)."""
    return (
        a.shape == b.shape
        and list(a.columns) == list(b.columns)
        and [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes]
        and a.index.equals(b.index)
        and a.equals(b)
    )


def _arrays_frame(obj: Any) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any]]:
    """Split a dataclass into its per-row arrays (one frame), its DataFrames and its other (JSON) fields."""
    import numpy as np
    import pandas as pd

    arrays, frames, rest = {}, {}, {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        elif isinstance(value, pd.DataFrame):
            frames[f.name] = value
        else:
            rest[f.name] = value
    return pd.DataFrame(arrays, copy=False), frames, rest  # views: no copy of the arrays


class CorruptEntry(Exception):
    """A cache entry that does not read back."""


# -- the cache ------------------------------------------------------------------------------------------------------


class Cache:
    """The cache folder; every write failure turns it off for this process with one note.

    ``root`` is where the data lies: the configured folder, or its :data:`SUBFOLDER` when the configured one
    holds files the cache did not make (``configured``). ``claimed``: ``root`` holds :data:`MARKER`; until then
    it is absent or empty, and the first write creates and marks it (:meth:`_claim`)."""

    def __init__(
        self,
        root: Path,
        limit: int,
        notify: Notify = _stderr,
        *,
        claimed: bool = False,
        configured: Path | None = None,
    ) -> None:
        self.root = root
        self.limit = limit
        self.notify = notify
        self.writable = True
        self.claimed = claimed
        self.configured = configured or root

    @classmethod
    def open(
        cls, notify: Notify = _stderr, inputs: Iterable[str | Path] = (), outputs: Iterable[str | Path] = ()
    ) -> Cache | None:
        """The user's cache, or None (turned off, or it would lie inside an output or hold an input)."""
        limit = max_bytes(notify)
        if limit == 0:
            return None
        try:
            root = cache_root().absolute()
        except RuntimeError:  # no home folder
            return None
        for out in outputs:
            if _inside(root, Path(out)):
                notify(f"note: cache off: the cache folder {root} is inside the output {out}")
                return None
        for path in inputs:
            if _inside(Path(path), root):
                notify(f"note: cache off: the input {path} is inside the cache folder {root}")
                return None
        folder, state = root, _folder_state(root)
        if state == "foreign":  # the user's own folder: never evict or sweep in it
            folder = root / SUBFOLDER
            state = _folder_state(folder)
            if state == "foreign":
                notify(
                    f"note: cache off: {root} and {folder} hold files profparse did not make (no {MARKER}); "
                    f"set {DIR_ENV} to a new folder"
                )
                return None
        if state == "ours" and (why := _not_private(folder)):
            notify(f"note: cache off: the cache folder {folder} {why}")
            return None
        return cls(folder, limit, notify, claimed=state == "ours", configured=root)

    def _claim(self) -> bool:
        """Make ``root`` the cache's own before the first write: created (or an empty folder of the user's
        taken), mode 0700, :data:`MARKER` written. Whether it is ours; on failure caching is off for the run."""
        if self.claimed:
            return True
        if not self.writable:
            return False
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _has_marker(self.root):
                if any(os.scandir(self.root)):  # files appeared since the cache was opened: not ours to take
                    self.disable(f"{self.root} holds files profparse did not make")
                    return False
                try:
                    fd = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                except FileExistsError:  # another run marked it this instant
                    if not _has_marker(self.root):
                        self.disable(f"{self.root / MARKER} is not profparse's")
                        return False
                else:
                    try:
                        os.write(fd, MARKER_TEXT)
                    finally:
                        os.close(fd)
                    os.chmod(self.root, 0o700)
                    if self.root != self.configured:
                        self.notify(
                            f"note: {self.configured} holds files profparse did not make; "
                            f"the cache keeps its data in {self.root}"
                        )
            why = _not_private(self.root)
            if why:
                self.disable(f"the folder {why}")
                return False
        except OSError as exc:
            self.disable(exc)
            return False
        self.claimed = True
        return True

    def _owned(self) -> bool:
        """Whether ``root`` holds :data:`MARKER` (another run may have claimed it since this one opened it)."""
        if not self.claimed and _has_marker(self.root):
            self.claimed = True
        return self.claimed

    def disable(self, exc: OSError | str) -> None:
        if self.writable:
            why = exc if isinstance(exc, str) else (exc.strerror or str(exc))
            self.notify(f"note: cache off for this run: cannot write {self.root} ({why})")
        self.writable = False

    # -- keys --

    def key(self, path: str | Path, options: dict[str, Any]) -> tuple[str, tuple[int, ...]] | None:
        """The entry name of a regular file's content with these options (and its stat), or None."""
        try:
            before = os.stat(path)
            if not stat.S_ISREG(before.st_mode):
                return None
            sid = _stat_id(before)
            record = self.root / "stat" / hashlib.blake2b(repr(sid).encode(), digest_size=16).hexdigest()
            try:
                content = record.read_text().strip()
            except OSError:
                content = ""
            if len(content) != HASH_DIGITS or not _RECORD_NAME.fullmatch(content):  # none, older, or damaged
                content = _HASHED.get(sid) or file_hash(path)
                after = os.stat(path)
                if _stat_id(after) != sid:
                    return None  # changed while hashed
                if time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > RACY_NS:
                    self._write_text(record, content)
                    _HASHED[sid] = content  # not for a racy file: rewritten within one clock tick, its stat is equal
        except OSError:
            return None
        config = hashlib.blake2b(
            (code_fingerprint() + json.dumps(options, sort_keys=True)).encode(), digest_size=8
        ).hexdigest()
        return f"e-{content}-{config}", sid

    def unchanged(self, path: str | Path, stat_id: tuple[int, ...]) -> bool:
        """Whether the file still has the stat it had when its key was made."""
        try:
            return _stat_id(os.stat(path)) == stat_id
        except OSError:
            return False

    # -- reading --

    def get(self, name: str, path: str | Path) -> tuple[Any, Entry] | None:
        """(raw, links, attribution), Entry for the entry ``name``; None on a miss or a corrupt entry.

        Any error while reading (a flipped bit, a ``meta.json`` with wrong types, an Arrow error, a bug in an older
        entry) removes the entry and is a miss: a damaged entry never fails a run, and never fails the next."""
        folder = self.root / name
        if not _is_real_dir(folder):
            return None
        entry = Entry(self, folder)
        try:
            parts = entry.read_core(str(path))
        except MemoryError:  # not the entry's fault: exit 8 as for a cold parse
            raise
        except Exception as exc:
            if not folder.exists():  # evicted by another run while it was read: a plain miss
                return None
            self.notify(f"warning: cache entry {folder} is unreadable ({_short(exc)}); removed, parsing again")
            self.remove(folder)
            return None
        self._touch(name)
        return parts, entry

    def get_text(self, name: str, options: dict[str, Any]) -> dict[str, Any] | None:
        """The text a verb stored in entry ``name`` for ``options`` (``stdout``, ``notes``: its stderr lines,
        ``code``: its exit status), or None. Reads one small JSON file: no numpy, pandas or pyarrow."""
        target = self.root / name / _text_file(options)
        try:
            text = target.read_text()
        except OSError:  # none stored (or no cache folder at all): a miss
            return None
        try:
            stored = json.loads(text)
            if not isinstance(stored, dict) or stored.pop("checksum", None) != _json_digest(stored):
                raise CorruptEntry("it does not match its checksum")
            if stored.get("options") != _as_stored(options):  # another options' text (a digest collision)
                return None
            if not (
                isinstance(stored.get("stdout"), str)
                and isinstance(stored.get("notes"), list)
                and all(isinstance(n, str) for n in stored["notes"])
                and type(stored.get("code")) is int
            ):
                raise CorruptEntry("wrong types")
            if stored["code"] not in REPLAYABLE_CODES:
                raise CorruptEntry(f"exit code {stored['code']} is not one a result can have")
            if _unsafe_for_terminal(stored["stdout"], options):
                raise CorruptEntry("it holds terminal control characters that profparse never prints")
        except MemoryError:
            raise
        except Exception as exc:
            self.notify(f"warning: cached text {target} is unreadable ({_short(exc)}); removed")
            _unlink(target)
            return None
        self._touch(name)
        return stored

    def get_output(self, name: str, options: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
        """The files a verb stored in entry ``name`` for ``options`` (its ``result.json``, the folder holding
        them; see :meth:`Entry.put_output`), or None (none stored, or one of its files is missing)."""
        folder = self.root / name / _output_folder(options)
        try:
            text = (folder / "result.json").read_text()
        except OSError:
            return None
        try:
            body = json.loads(text)
            if not isinstance(body, dict) or body.pop("checksum", None) != _json_digest(body):
                raise CorruptEntry("result.json does not match its checksum")
            files, sums = body.get("files"), body.get("sums")
            if (
                not isinstance(files, list)
                or body.get("options") != _as_stored(options)
                or not isinstance(body.get("notes"), list)
                or not isinstance(sums, dict)
            ):
                return None
            for f in files:
                if not (isinstance(f, str) and "/" not in f and f not in (".", "..") and _is_real_file(folder / f)):
                    return None  # a file missing: drawn again
                if file_hash(folder / f) != sums.get(f):
                    raise CorruptEntry(f"{f} does not match its checksum")
        except MemoryError:
            raise
        except Exception as exc:
            self.notify(f"warning: cached output {folder} is unreadable ({_short(exc)}); removed")
            self.remove(folder)
            return None
        self._touch(name)
        return body, folder

    def _touch(self, name: str) -> None:
        """Mark entry ``name`` as just used (its ``meta.json``'s mtime orders eviction)."""
        try:
            os.utime(self.root / name / "meta.json")
        except OSError:
            pass

    # -- writing --

    def put(self, name: str, parsed: Any) -> Entry | None:
        """Store a ParsedTrace's inputs as entry ``name``; the Entry (whoever wrote it), or None."""
        import pyarrow as pa

        if not self._claim():
            return None
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            meta = _write_core(tmp, parsed)
            size = sum(p.stat().st_size for p in tmp.iterdir())
            if size > self.limit:
                self.notify(f"note: not cached: the entry ({size:,} bytes) exceeds {MAX_ENV}={self.limit:,}")
                return None
            meta["name"] = name
            (tmp / "meta.json").write_text(_sealed_json(meta, default=_plain))
            try:
                os.rename(tmp, self.root / name)
            except OSError:
                if not (self.root / name / "meta.json").exists():
                    raise
                # another run stored the same entry first: keep theirs
        except OSError as exc:
            self.disable(exc)
            return None
        except (CorruptEntry, TypeError, ValueError, pa.ArrowException, MemoryError) as exc:  # cannot be stored
            self.notify(f"note: not cached: {_short(exc)}")
            return None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=name)
        return Entry(self, self.root / name)

    def _write_text(self, target: Path, text: str) -> None:
        if not self._claim():
            return
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, target)
        except OSError as exc:
            self.disable(exc)
        finally:
            _unlink(tmp)

    def remove(self, folder: Path) -> None:
        """Take an entry away atomically (rename, then delete): a reader sees all of it or none. Only in a
        folder the cache owns."""
        if not self._owned():
            return
        trash = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            os.rename(folder, trash)
        except OSError:
            return
        _delete(trash)

    def evict(self, keep: str | None = None) -> int:
        """Remove least recently used entries until the cache fits its limit (``keep`` stays); clear leftovers
        of killed runs. The bytes left. Only in a folder the cache owns, and only names it generates (a real
        folder or a regular file; a symbolic link is never followed)."""
        entries = []
        total = 0
        now = time.time()
        if not self._owned():
            return 0
        try:
            children = list(os.scandir(self.root))
        except OSError:
            return 0
        for child in children:
            try:
                if _TEMP_NAME.fullmatch(child.name):
                    made = child.is_dir(follow_symlinks=False) or child.is_file(follow_symlinks=False)
                    if made and now - child.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S:
                        _delete(Path(child.path))
                    continue
                if not (_ENTRY_NAME.fullmatch(child.name) and child.is_dir(follow_symlinks=False)):
                    continue
                size = _tree_size(child.path)
                used = os.stat(os.path.join(child.path, "meta.json"), follow_symlinks=False).st_mtime
            except OSError:
                continue
            entries.append((used, child.name, size))
            total += size
        for _, name, size in sorted(entries):
            if total <= self.limit:
                break
            if name != keep:
                self.remove(self.root / name)
                total -= size
        live = {name.split("-")[1] for _, name, _ in entries if (self.root / name).exists()}
        records = []
        if _is_real_dir(self.root / "stat"):
            try:
                records = list(os.scandir(self.root / "stat"))
            except OSError:
                pass
        for record in records:  # stat records of hashes with no entry left
            try:
                if not (_RECORD_NAME.fullmatch(record.name) and record.is_file(follow_symlinks=False)):
                    continue
                if record.stat(follow_symlinks=False).st_size and Path(record.path).read_text().strip() not in live:
                    _unlink(Path(record.path))
            except (OSError, ValueError):
                continue
        return total


class Entry:
    """One stored trace: its core (read at load) and the tables added as verbs compute them."""

    def __init__(self, cache: Cache, folder: Path) -> None:
        self.cache = cache
        self.folder = folder
        self.uncacheable: set[str] = set()

    def read_core(self, path: str) -> Any:
        from profparse.stages.attribute import Attribution
        from profparse.stages.rules import StageRule
        from profparse.trace.decode import DecodeReport
        from profparse.trace.events import RawTrace
        from profparse.trace.link import Links

        meta = json.loads((self.folder / "meta.json").read_text())
        if not isinstance(meta, dict) or meta.pop("checksum", None) != _json_digest(meta):
            raise CorruptEntry("meta.json does not match its checksum")
        if meta.get("format") != FORMAT_VERSION or meta.get("name") != self.folder.name:
            raise CorruptEntry("meta.json is not this entry's")
        for name, size in meta["files"].items():
            if name not in _CORE or (self.folder / name).stat().st_size != size:
                raise CorruptEntry(f"{name} has the wrong size")
        frames = {name: read_frame(self.folder / name) for name in _CORE}
        rows = meta["rows"]
        events = frames["events.arrow"]
        if len(events) != rows or len(frames["links.arrow"]) != rows or len(frames["attribution.arrow"]) != rows:
            raise CorruptEntry("row counts differ")
        events.attrs.update(meta["events_attrs"])
        report = DecodeReport(**{**meta["report"], "path": path})
        raw = RawTrace(
            path=path,
            events=events,
            header=meta["header"],
            report=report,
            process_names={int(k): v for k, v in meta["process_names"]},
            thread_names={(int(p), int(t)): v for p, t, v in meta["thread_names"]},
            pid_labels={int(k): v for k, v in meta["pid_labels"]},
            tid_labels={int(k): v for k, v in meta["tid_labels"]},
        )
        arrays = frames["links.arrow"]
        links = Links(**{c: arrays[c].to_numpy() for c in arrays.columns}, threads=frames["links.threads.arrow"])
        arrays = frames["attribution.arrow"]
        rest = meta["attribution"]
        rules = [
            StageRule(**{**r, "kinds": None if r["kinds"] is None else tuple(r["kinds"])}) for r in rest.pop("rules")
        ]
        attribution = Attribution(
            **{c: arrays[c].to_numpy() for c in arrays.columns},
            **rest,
            rules=rules,
            steps=frames["attribution.steps.arrow"],
        )
        return raw, links, attribution

    def table(self, name: str) -> pd.DataFrame | None:
        """A stored table, or None (not stored yet; an unreadable file, whatever the error, is removed with a
        warning)."""
        target = self.folder / f"table.{name}.arrow"
        try:
            return read_frame(target)
        except FileNotFoundError:
            return None
        except MemoryError:
            raise
        except Exception as exc:
            self.cache.notify(f"warning: cached table {target} is unreadable ({_short(exc)}); removed, computing it")
            _unlink(target)
            return None

    def put_table(self, name: str, frame: pd.DataFrame) -> None:
        """Store a computed table (temp file + rename); one that does not read back identical is not kept."""
        import pyarrow as pa

        if not self.cache.writable or name in self.uncacheable or not self.folder.is_dir():
            return
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            if _write_checked(tmp, frame):
                target = self.folder / f"table.{name}.arrow"
                os.replace(tmp, target)
                if self.cache.evict(keep=self.folder.name) > self.cache.limit:  # the entry alone outgrew it
                    _unlink(target)
                    self.uncacheable.add(name)
            else:
                self.uncacheable.add(name)
        except FileNotFoundError:  # the entry was evicted meanwhile
            pass
        except OSError as exc:
            self.cache.disable(exc)
        except (pa.ArrowException, TypeError, ValueError, MemoryError):  # a column Arrow cannot hold; no memory
            self.uncacheable.add(name)
        finally:
            _unlink(tmp)

    def put_text(self, options: dict[str, Any], stdout: str, notes: list[str], code: int) -> None:
        """Store a verb's rendered result for ``options`` (temp file + rename, like a table)."""
        if not self.cache.writable or not self.folder.is_dir():
            return
        body = {"options": options, "stdout": stdout, "notes": notes, "code": code}
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        target = self.folder / _text_file(options)
        try:
            tmp.write_text(_sealed_json(body))
            os.replace(tmp, target)
            if self.cache.evict(keep=self.folder.name) > self.cache.limit:  # the entry alone outgrew it
                _unlink(target)
        except FileNotFoundError:  # the entry was evicted meanwhile
            pass
        except OSError as exc:
            self.cache.disable(exc)
        finally:
            _unlink(tmp)

    def put_output(self, options: dict[str, Any], body: dict[str, Any], files: Iterable[Path]) -> None:
        """Store a verb's written files (copies) and ``body`` (JSON: what it printed) for ``options``: a folder
        written under a temporary name and renamed into place; a folder already there is replaced."""
        if not self.cache.writable or not self.folder.is_dir():
            return
        target = self.folder / _output_folder(options)
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            names = []
            for path in files:
                shutil.copyfile(path, tmp / path.name)
                names.append(path.name)
            sums = {name: file_hash(tmp / name) for name in names}
            (tmp / "result.json").write_text(_sealed_json({**body, "options": options, "files": names, "sums": sums}))
            if target.exists():
                self.cache.remove(target)
            os.rename(tmp, target)
            if self.cache.evict(keep=self.folder.name) > self.cache.limit:  # the entry alone outgrew it
                self.cache.remove(target)
        except FileNotFoundError:  # the entry was evicted meanwhile
            pass
        except OSError as exc:
            self.cache.disable(exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _tree_size(path: str) -> int:
    """Bytes of the files under ``path`` (an entry, with its stored outputs' folders)."""
    total = 0
    for child in os.scandir(path):
        if child.is_dir(follow_symlinks=False):
            total += _tree_size(child.path)
        else:
            total += child.stat(follow_symlinks=False).st_size
    return total


def _json_digest(body: dict[str, Any]) -> str:
    """XXH3-128 of ``body`` as JSON reads it back (keys sorted): the checksum of a stored JSON file."""
    return xxhash.xxh3_128_hexdigest(json.dumps(body, sort_keys=True).encode())


def _sealed_json(body: dict[str, Any], default: Callable[[Any], Any] = str) -> str:
    """``body`` as JSON with its ``checksum`` field (of the body as it reads back: integer keys as strings,
    other objects as ``default`` makes them; a ``checksum`` it holds, from a stored body, is replaced)."""
    plain = json.loads(json.dumps(body, sort_keys=True, default=default))
    plain.pop("checksum", None)
    return json.dumps({**plain, "checksum": _json_digest(plain)}, sort_keys=True)


def _unsafe_for_terminal(stdout: str, options: dict[str, Any]) -> bool:
    """Whether a stored text holds what a fresh run of these options never prints: a text or markdown rendering
    goes through :func:`profparse.base.formats.terminal_safe` (JSON and CSV keep names exact)."""
    from profparse.base.formats import PLAIN_FORMATS, terminal_safe

    return options.get("format") not in PLAIN_FORMATS and terminal_safe(stdout) != stdout


_FULL_CHECK_CELLS = 1 << 20


def _write_checked(path: Path, frame: pd.DataFrame) -> bool:
    """Write ``frame``; whether it reads back the same. A big frame without object columns is checked by its
    schema only (dtypes, columns): Arrow holds such columns losslessly, and reading back the event table to
    compare values was ~40% of the time that storing it took."""
    import pyarrow as pa

    write_frame(path, frame)
    if frame.size <= _FULL_CHECK_CELLS or any(str(t) == "object" for t in frame.dtypes):
        return _same(frame, read_frame(path))
    empty = pa.ipc.open_file(_sealed_payload(path, verify=False)).schema.empty_table().to_pandas()
    return list(empty.columns) == list(frame.columns) and [str(t) for t in empty.dtypes] == [
        str(t) for t in frame.dtypes
    ]


def _write_core(folder: Path, parsed: Any) -> dict[str, Any]:
    """Write a ParsedTrace's raw table, links and attribution into ``folder``; the JSON rest as a dict."""
    raw = parsed.raw
    link_arrays, link_frames, _ = _arrays_frame(parsed.links)
    attr_arrays, attr_frames, attr_rest = _arrays_frame(parsed.attribution)
    files = {
        "events.arrow": raw.events,
        "links.arrow": link_arrays,
        "links.threads.arrow": link_frames["threads"],
        "attribution.arrow": attr_arrays,
        "attribution.steps.arrow": attr_frames["steps"],
    }
    for name, frame in files.items():
        if not _write_checked(folder / name, frame):
            raise CorruptEntry(f"{name} does not read back identical")
    attr_rest["rules"] = [dataclasses.asdict(r) for r in attr_rest["rules"]]
    return {
        "format": FORMAT_VERSION,
        "rows": len(raw.events),
        "files": {name: (folder / name).stat().st_size for name in files},
        "events_attrs": dict(raw.events.attrs),
        "header": raw.header,
        "report": dataclasses.asdict(raw.report),
        "process_names": list(raw.process_names.items()),
        "thread_names": [(p, t, v) for (p, t), v in raw.thread_names.items()],
        "pid_labels": list(raw.pid_labels.items()),
        "tid_labels": list(raw.tid_labels.items()),
        "attribution": attr_rest,
    }


def _plain(value: Any) -> Any:
    """JSON for the numpy scalars a header or attribution may hold."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _folder_state(folder: Path) -> str:
    """``"ours"`` (holds :data:`MARKER`), ``"new"`` (absent, not a folder, or an empty folder of the user's: the
    first write claims it, or fails and turns caching off) or ``"foreign"`` (holds files profparse did not make,
    or an empty folder of another user's)."""
    try:
        st = os.stat(folder)
        if not stat.S_ISDIR(st.st_mode):
            return "new"
        if _has_marker(folder):
            return "ours"
        if st.st_uid != os.getuid():
            return "foreign"
        with os.scandir(folder) as children:
            return "foreign" if any(children) else "new"
    except OSError:
        return "new"


def _has_marker(folder: Path) -> bool:
    """Whether ``folder`` holds :data:`MARKER`: a regular file (not a link) of the user's with its exact text."""
    for _ in range(50):
        try:
            fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return False
            text = os.read(fd, len(MARKER_TEXT) + 1)
        except OSError:
            return False
        finally:
            os.close(fd)
        if text == MARKER_TEXT:
            return True
        if not MARKER_TEXT.startswith(text):
            return False
        time.sleep(0.01)  # another run created it and is writing it this instant
    return False


def _not_private(folder: Path) -> str | None:
    """Why ``folder`` cannot be trusted with the cache (what another user could plant there), or None."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o}; chmod 700 it)"
    return None


def _is_real_dir(path: Path) -> bool:
    """A folder itself, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_real_file(path: Path) -> bool:
    """A regular file itself, not a symbolic link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _delete(path: Path) -> None:
    """Remove what the cache made at ``path``: a folder with what it holds (links inside are removed, never
    followed), or a file or link itself."""
    if _is_real_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _unlink(path)


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both resolved as far as they exist)."""
    try:
        path, folder = path.resolve(), folder.resolve()
    except (OSError, RuntimeError):
        return False
    return path == folder or folder in path.parents


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
