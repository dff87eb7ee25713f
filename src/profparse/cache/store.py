"""The cache folder (:class:`Cache`): where it lies, opening and claiming it, entry keys, reading entries and
stored results, storing a parsed trace, and size-bounded eviction."""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.base.formats import plain
from profparse.cache import keys
from profparse.cache.core import read_core, write_core
from profparse.cache.entry import Entry
from profparse.cache.folders import (
    ENTRY_NAME,
    MARKER,
    MARKER_TEXT,
    MODELS,
    RECORD_NAME,
    SUBFOLDER,
    TEMP_NAME,
    delete,
    folder_state,
    has_marker,
    inside,
    is_real_dir,
    not_own,
    not_private,
    tree_size,
    unlink,
)
from profparse.cache.replay import checked_output, checked_text
from profparse.cache.sealed import CorruptEntry, sealed_json, short

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

DIR_ENV = "PROFPARSE_CACHE_DIR"
MAX_ENV = "PROFPARSE_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
STALE_TEMP_S = 3600  # a temporary folder this old was left by a killed run

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
            if inside(root, Path(out)):
                notify(f"note: cache off: the cache folder {root} is inside the output {out}")
                return None
        for path in inputs:
            if inside(Path(path), root):
                notify(f"note: cache off: the input {path} is inside the cache folder {root}")
                return None
        folder, state = root, folder_state(root)
        if state == "foreign":  # the user's own folder: never evict or sweep in it
            if why := not_own(root):  # nor create anything in another user's (a link may point there)
                notify(f"note: cache off: the cache folder {root} {why}; set {DIR_ENV} to a folder of your own")
                return None
            folder = root / SUBFOLDER
            state = folder_state(folder)
            if state == "foreign":
                notify(
                    f"note: cache off: {root} and {folder} hold files profparse did not make (no {MARKER}); "
                    f"set {DIR_ENV} to a new folder"
                )
                return None
        if state == "ours" and (why := not_private(folder)):
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
            if not has_marker(self.root):
                # files appeared since the cache was opened: not ours to take, unless another run (or thread)
                # claimed it between the two looks (its marker is then there: the O_EXCL create below says so)
                if any(c.name != MODELS for c in os.scandir(self.root)) and not has_marker(self.root):
                    self.disable(f"{self.root} holds files profparse did not make")
                    return False
                try:
                    fd = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                except FileExistsError:  # another run marked it this instant
                    if not has_marker(self.root):
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
            why = not_private(self.root)
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
        if not self.claimed and has_marker(self.root):
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
            found = keys.content_hash(path, self.root / "stat", self._write_text)
        except OSError:
            return None
        if found is None:
            return None
        content, sid = found
        return keys.entry_name(content, options), sid

    def unchanged(self, path: str | Path, stat_id: tuple[int, ...]) -> bool:
        """Whether the file still has the stat it had when its key was made."""
        return keys.unchanged(path, stat_id)

    # -- reading --

    def get(self, name: str, path: str | Path) -> tuple[Any, Entry] | None:
        """(raw, links, attribution), Entry for the entry ``name``; None on a miss or a corrupt entry.

        Any error while reading (a flipped bit, a ``meta.json`` with wrong types, an Arrow error, a bug in an older
        entry) removes the entry and is a miss: a damaged entry never fails a run, and never fails the next."""
        folder = self.root / name
        if not is_real_dir(folder):
            return None
        entry = Entry(self, folder)
        try:
            parts = read_core(folder, str(path))
        except MemoryError:  # not the entry's fault: exit 8 as for a cold parse
            raise
        except Exception as exc:
            if not folder.exists():  # evicted by another run while it was read: a plain miss
                return None
            self.notify(f"warning: cache entry {folder} is unreadable ({short(exc)}); removed, parsing again")
            self.remove(folder)
            return None
        self._touch(name)
        return parts, entry

    def get_text(self, name: str, options: dict[str, Any]) -> dict[str, Any] | None:
        """The text a verb stored in entry ``name`` for ``options`` (``stdout``, ``notes``: its stderr lines,
        ``code``: its exit status), or None. Reads one small JSON file: no numpy, pandas or pyarrow."""
        target = self.root / name / keys.text_file(options)
        try:
            text = target.read_text()
        except OSError:  # none stored (or no cache folder at all): a miss
            return None
        try:
            stored = checked_text(text, options)
            if stored is None:
                return None
        except MemoryError:
            raise
        except Exception as exc:
            self.notify(f"warning: cached text {target} is unreadable ({short(exc)}); removed")
            unlink(target)
            return None
        self._touch(name)
        return stored

    def get_output(self, name: str, options: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
        """The files a verb stored in entry ``name`` for ``options`` (its ``result.json``, the folder holding
        them; see :meth:`Entry.put_output`), or None (none stored, or one of its files is missing)."""
        folder = self.root / name / keys.output_folder(options)
        try:
            text = (folder / "result.json").read_text()
        except OSError:
            return None
        try:
            body = checked_output(folder, text, options)
            if body is None:
                return None
        except MemoryError:
            raise
        except Exception as exc:
            self.notify(f"warning: cached output {folder} is unreadable ({short(exc)}); removed")
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

    def put(self, name: str, parsed: ParsedTrace) -> Entry | None:
        """Store a ParsedTrace's inputs as entry ``name``; the Entry (whoever wrote it), or None."""
        import pyarrow as pa

        if not self._claim():
            return None
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            meta = write_core(tmp, parsed)
            size = sum(p.stat().st_size for p in tmp.iterdir())
            if size > self.limit:
                self.notify(f"note: not cached: the entry ({size:,} bytes) exceeds {MAX_ENV}={self.limit:,}")
                return None
            meta["name"] = name
            (tmp / "meta.json").write_text(sealed_json(meta, default=plain))
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
            self.notify(f"note: not cached: {short(exc)}")
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
            unlink(tmp)

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
        delete(trash)

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
                if TEMP_NAME.fullmatch(child.name):
                    made = child.is_dir(follow_symlinks=False) or child.is_file(follow_symlinks=False)
                    if made and now - child.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S:
                        delete(Path(child.path))
                    continue
                if not (ENTRY_NAME.fullmatch(child.name) and child.is_dir(follow_symlinks=False)):
                    continue
                size = tree_size(child.path)
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
        if is_real_dir(self.root / "stat"):
            try:
                records = list(os.scandir(self.root / "stat"))
            except OSError:
                pass
        for record in records:  # stat records of hashes with no entry left
            try:
                if not (RECORD_NAME.fullmatch(record.name) and record.is_file(follow_symlinks=False)):
                    continue
                if record.stat(follow_symlinks=False).st_size and Path(record.path).read_text().strip() not in live:
                    unlink(Path(record.path))
            except (OSError, ValueError):
                continue
        return total
