"""Errors profparse reports to users, each with its documented exit code (see docs/exit-codes.md)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path


class ProfparseError(Exception):
    """Base class: a problem with the user's input or request, reported as one line."""

    exit_code = 1


class UsageError(ProfparseError):
    """Bad command-line use (unknown option values, conflicting flags)."""

    exit_code = 2


class InputNotFoundError(ProfparseError):
    """The input path does not exist or is not the kind of path expected."""

    exit_code = 3


class TraceFormatError(ProfparseError):
    """The input is not a readable Kineto trace (not JSON, corrupt gzip, no traceEvents, ...)."""

    exit_code = 4


class TruncatedTraceError(TraceFormatError):
    """The trace ends before its event array is closed (raised only with ``strict=True``)."""

    exit_code = 5


class OutputExistsError(ProfparseError):
    """An output already exists and ``--force`` was not given."""

    exit_code = 6


class PartialFailureError(ProfparseError):
    """Some ranks of a multi-rank run failed; the others were written."""

    exit_code = 7


class OutOfMemoryError(ProfparseError):
    """The input needs more memory than this machine (or process limit) has; the message says how much."""

    exit_code = 8


class OutputRefusedError(ProfparseError):
    """The output path names something profparse will not replace, even with ``--force``: a folder it did not
    write (no marker), one that holds an input or the current folder, a device, FIFO, socket or symbolic link."""

    exit_code = 9


class NoSpaceError(ProfparseError):
    """The disk (or quota) filled up while writing an output or standard output; nothing was left half-written."""

    exit_code = 10


class OutputWriteError(ProfparseError):
    """An output cannot be written: permission denied, read-only file system, a name too long, a parent that is a
    file, standard output closed."""

    exit_code = 11


#: Codes of errors that are the output's fault: a worker that meets one fails the whole run.
OUTPUT_EXIT_CODES = frozenset({OutputRefusedError.exit_code, NoSpaceError.exit_code, OutputWriteError.exit_code})

#: errno values that mean "the disk is full" (a quota counts too).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: errno values of a path a user named that cannot be used (as an input: exit 3; as an output: exit 11).
PATH_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENOENT,
        errno.ELOOP,
        errno.EEXIST,
        errno.ENOTEMPTY,
        errno.EBUSY,
        errno.EXDEV,
        errno.ETXTBSY,
        errno.EBADF,
    }
)


def is_no_space(exc: BaseException) -> bool:
    """True for a disk-full error, also pyarrow's (an OSError without errno, the reason only in its message)."""
    if not isinstance(exc, OSError):
        return False
    return exc.errno in NO_SPACE_ERRNOS or "no space left on device" in str(exc).lower()


def _is_under(name: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> bool:
    try:
        path = Path(os.path.realpath(name))
        return any(path == r or r in path.parents for r in (Path(os.path.realpath(x)) for x in roots))
    except (OSError, ValueError):
        return False


def from_oserror(exc: OSError, *, inputs: Iterable[str | os.PathLike[str]] = (), where: str | None = None) -> Exception:
    """The documented error for an ``OSError`` that reached the command line (the one place that maps them).

    Disk full -> :class:`NoSpaceError` (10); a path error on an input -> :class:`InputNotFoundError` (3); on any
    other path (an output) -> :class:`OutputWriteError` (11). Anything else is returned unchanged (a bug: exit 70).
    """
    name = exc.filename if exc.filename is not None else where
    prefix = f"{name}: " if name is not None else ""
    reason = (exc.strerror or str(exc)).strip()
    if is_no_space(exc):
        return NoSpaceError(f"{prefix}no space left on device (free some space or write elsewhere)")
    if exc.errno == errno.ENOMEM:
        return MemoryError()
    if exc.errno not in PATH_ERRNOS:
        return exc
    if reason.lower() == os.strerror(errno.ENAMETOOLONG).lower() and name is not None:
        longest = max((len(os.fsencode(part)) for part in Path(name).parts), default=0)
        reason = f"file name too long: a name of {longest} bytes; the limit is usually 255"
    if exc.filename is not None and _is_under(exc.filename, inputs):
        return InputNotFoundError(f"{prefix}cannot read ({reason})")
    return OutputWriteError(f"{prefix}cannot write ({reason})")


def error_for_code(code: int, message: str) -> ProfparseError:
    """A :class:`ProfparseError` of the class whose exit code is ``code`` (to re-raise a worker's error)."""
    classes = [ProfparseError, *_subclasses(ProfparseError)]
    for cls in classes:
        if cls.exit_code == code:
            return cls(message)
    return ProfparseError(message)


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def install_hint(extra: str) -> str:
    """How to install the optional dependencies of ``extra``: from a checkout (how profparse is installed from its
    repository) or from a package index."""
    return f"pip install -e '.[{extra}]' (from a checkout) or pip install 'profparse[{extra}]'"
