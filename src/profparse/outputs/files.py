"""Write outputs safely: into a temporary sibling first, moved into place only when complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from profparse.errors import OutputExistsError, ProfparseError


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextmanager
def atomic_dir(target: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target``. On error nothing is left behind."""
    target = Path(target)
    if target.exists() and not force:
        raise OutputExistsError(f"{target}: already exists (use --force to replace it)")
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=parent))
        tmp.chmod(0o777 & ~_umask())
    except OSError as exc:
        raise ProfparseError(f"{target}: cannot create output ({exc.strerror})") from None
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(target: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; it becomes ``target`` only if the block succeeds."""
    target = Path(target)
    if target.exists() and not force:
        raise OutputExistsError(f"{target}: already exists (use --force to replace it)")
    if target.is_dir():
        raise ProfparseError(f"{target}: is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=parent)
    except OSError as exc:
        raise ProfparseError(f"{target}: cannot create output ({exc.strerror})") from None
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
