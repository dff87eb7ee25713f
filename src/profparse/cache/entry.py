"""One stored trace (:class:`Entry`): its core, read at load, and the tables and results verbs add to it."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from profparse.cache.folders import unlink
from profparse.cache.frames import read_frame, write_checked
from profparse.cache.keys import file_hash, output_folder, text_file
from profparse.cache.sealed import sealed_json, short

if TYPE_CHECKING:
    import pandas as pd


class Store(Protocol):
    """What an entry needs of the cache folder holding it (:class:`profparse.cache.store.Cache`, which makes
    entries: this module cannot import it back)."""

    limit: int
    writable: bool

    def notify(self, message: str) -> None: ...

    def disable(self, exc: OSError | str) -> None: ...

    def evict(self, keep: str | None = None) -> int: ...

    def remove(self, folder: Path) -> None: ...


class Entry:
    """One stored trace: its core (read at load) and the tables added as verbs compute them."""

    def __init__(self, cache: Store, folder: Path) -> None:
        self.cache = cache
        self.folder = folder
        self.uncacheable: set[str] = set()

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
            self.cache.notify(f"warning: cached table {target} is unreadable ({short(exc)}); removed, computing it")
            unlink(target)
            return None

    def put_table(self, name: str, frame: pd.DataFrame) -> None:
        """Store a computed table (temp file + rename); one that does not read back identical is not kept."""
        import pyarrow as pa

        if not self.cache.writable or name in self.uncacheable or not self.folder.is_dir():
            return
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            if write_checked(tmp, frame):
                target = self.folder / f"table.{name}.arrow"
                os.replace(tmp, target)
                if self.cache.evict(keep=self.folder.name) > self.cache.limit:  # the entry alone outgrew it
                    unlink(target)
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
            unlink(tmp)

    def put_text(self, options: dict[str, Any], stdout: str, notes: list[str], code: int) -> None:
        """Store a verb's rendered result for ``options`` (temp file + rename, like a table)."""
        if not self.cache.writable or not self.folder.is_dir():
            return
        body = {"options": options, "stdout": stdout, "notes": notes, "code": code}
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        target = self.folder / text_file(options)
        try:
            tmp.write_text(sealed_json(body))
            os.replace(tmp, target)
            if self.cache.evict(keep=self.folder.name) > self.cache.limit:  # the entry alone outgrew it
                unlink(target)
        except FileNotFoundError:  # the entry was evicted meanwhile
            pass
        except OSError as exc:
            self.cache.disable(exc)
        finally:
            unlink(tmp)

    def put_output(self, options: dict[str, Any], body: dict[str, Any], files: Iterable[Path]) -> None:
        """Store a verb's written files (copies) and ``body`` (JSON: what it printed) for ``options``: a folder
        written under a temporary name and renamed into place; a folder already there is replaced."""
        if not self.cache.writable or not self.folder.is_dir():
            return
        target = self.folder / output_folder(options)
        tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            names = []
            for path in files:
                shutil.copyfile(path, tmp / path.name)
                names.append(path.name)
            sums = {name: file_hash(tmp / name) for name in names}
            (tmp / "result.json").write_text(sealed_json({**body, "options": options, "files": names, "sums": sums}))
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
