"""The cache's ownership of its folder: it only writes, evicts and sweeps in a folder it made, marked by
:data:`MARKER`, and only removes names it generates (:data:`ENTRY_NAME`, :data:`TEMP_NAME`, :data:`RECORD_NAME`),
regular files and real folders, never following a link."""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from pathlib import Path

#: The file that makes a folder the cache's own: a cache directory tag (https://bford.info/cachedir/, so backup
#: tools skip the folder) whose exact text says profparse wrote it; another tool's tag is not profparse's.
MARKER = "CACHEDIR.TAG"
MARKER_TEXT = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This folder is profparse's parsed-trace cache (docs/cache.md); profparse may delete anything in it.\n"
)
#: Where the cache keeps its data when the configured folder already holds files it did not make.
SUBFOLDER = "profparse-cache"
#: The capture's built models live beside the entries (``profparse.capture.model``); the cache never touches them.
MODELS = "models"
# the only names the cache ever removes: entries, temporaries (uuid4().hex), stat records
ENTRY_NAME = re.compile(r"e-[0-9a-f]{32}-[0-9a-f]{16}")
TEMP_NAME = re.compile(r"\.tmp-[0-9a-f]{32}")
RECORD_NAME = re.compile(r"[0-9a-f]{32}")


def folder_state(folder: Path) -> str:
    """``"ours"`` (holds :data:`MARKER`), ``"new"`` (absent, not a folder, or an empty folder of the user's: the
    first write claims it, or fails and turns caching off) or ``"foreign"`` (holds files profparse did not make,
    or an empty folder of another user's). A ``models`` folder (the capture's models) alone leaves a folder new."""
    try:
        st = os.stat(folder)
        if not stat.S_ISDIR(st.st_mode):
            return "new"
        if has_marker(folder):
            return "ours"
        if st.st_uid != os.getuid():
            return "foreign"
        with os.scandir(folder) as children:
            if not any(child.name != MODELS for child in children):
                return "new"
        # another run (or thread) may have marked it since the first look: its files are the cache's then
        return "ours" if has_marker(folder) else "foreign"
    except OSError:
        return "new"


def has_marker(folder: Path) -> bool:
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


def not_own(folder: Path) -> str | None:
    """Why ``folder`` (followed through a link) is not the user's own, or None."""
    try:
        uid = os.stat(folder).st_uid
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    target = f"(a link to {os.path.realpath(folder)}) " if os.path.islink(folder) else ""
    return f"{target}belongs to another user (uid {uid})" if uid != os.getuid() else None


def not_private(folder: Path) -> str | None:
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


def is_real_dir(path: Path) -> bool:
    """A folder itself, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def is_real_file(path: Path) -> bool:
    """A regular file itself, not a symbolic link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def delete(path: Path) -> None:
    """Remove what the cache made at ``path``: a folder with what it holds (links inside are removed, never
    followed), or a file or link itself."""
    if is_real_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        unlink(path)


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both resolved as far as they exist)."""
    try:
        path, folder = path.resolve(), folder.resolve()
    except (OSError, RuntimeError):
        return False
    return path == folder or folder in path.parents


def unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def tree_size(path: str) -> int:
    """Bytes of the files under ``path`` (an entry, with its stored outputs' folders)."""
    total = 0
    for child in os.scandir(path):
        if child.is_dir(follow_symlinks=False):
            total += tree_size(child.path)
        else:
            total += child.stat(follow_symlinks=False).st_size
    return total
