"""Write outputs safely: into a temporary sibling first, moved into place only when complete.

The rules (docs/exit-codes.md): profparse only ever replaces what it can prove it wrote itself. Every output
folder holds a marker file, :data:`MARKER` (a small JSON: tool, version, verb); ``--force`` replaces a folder only
when that marker is there (an empty folder needs no ``--force``), never a folder that is or holds an input or the
current folder, and never a device, FIFO, socket or symbolic link. A file output (``annotate``) replaces
only a regular file that is not an input. Writers of one output take a lock beside it (:func:`output_lock`), so
concurrent runs to the same ``-o`` run one after the other instead of replacing each other's output.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from profparse.base.errors import OutputExistsError, OutputRefusedError, OutputWriteError, UsageError, from_oserror

MARKER = ".profparse-output"
NAME_MAX = 255
#: Called with a one-line note when a run waits for another run's lock (the CLI prints it unless --quiet).
wait_notice: Callable[[str], None] | None = None

PathLike = str | os.PathLike[str]


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def output_path(target: PathLike) -> Path:
    """``target`` as an absolute path whose folders are resolved; the last part is kept as named (it may be a
    symbolic link, which must be seen as one). ``.``, ``..`` and ``/`` are resolved fully."""
    if not str(target):
        raise UsageError("the output path is empty")
    p = Path(target)
    if p.name in ("", ".", ".."):
        return p.resolve()
    size = len(os.fsencode(p.name))
    if size > NAME_MAX:
        raise OutputWriteError(f"{p}: cannot write (file name too long: {size} bytes; the limit is {NAME_MAX})")
    return p.parent.resolve() / p.name


def _stem(name: str, room: int) -> str:
    """``name`` shortened (with a hash, so it stays unique) to leave ``room`` bytes for a temporary name's affixes."""
    if len(os.fsencode(name)) + room <= NAME_MAX:
        return name
    digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:10]
    short = os.fsencode(name)[: NAME_MAX - room - 11].decode("utf-8", "ignore")
    return f"{short}~{digest}"


TMP_ROOM = 40  # "." + "." + pid + "." + 8 random + ".partial", with margin


def _tmp_prefix(name: str) -> str:
    return f".{_stem(name, TMP_ROOM)}.{os.getpid()}."


def lock_path(target: PathLike) -> Path:
    """The lock file of an output: ``.NAME.lock`` beside it."""
    p = output_path(target)
    return p.parent / f".{_stem(p.name, 6)}.lock"


def _describe(mode: int) -> str:
    for test, what in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def read_marker(folder: PathLike) -> dict | None:
    """The marker of a folder profparse wrote, or None."""
    try:
        with open(Path(folder) / MARKER, "rb") as f:
            data = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("tool") == "profparse" else None


def write_marker(folder: PathLike, verb: str) -> None:
    from profparse.base.version import __version__

    text = json.dumps({"tool": "profparse", "version": __version__, "verb": verb}) + "\n"
    (Path(folder) / MARKER).write_text(text)


def _refuse(p: Path, why: str) -> OutputRefusedError:
    return OutputRefusedError(
        f"{p}: {why}; profparse will not replace it, even with --force (choose another output path)"
    )


def check_file_name(target: PathLike) -> None:
    """Refuse (exit 2) a file output written as a folder: ``-o newdir/`` (or ``newdir/.``).

    ``Path`` drops a trailing ``/`` and ``/.``, so without this ``report -o newdir/`` would write a file named
    ``newdir``. A file output has no default name to put inside a folder, so the name must be given.
    """
    text = os.fsdecode(target) if isinstance(target, (str, bytes)) else None
    if text and text.endswith(("/", os.sep, "/.", os.sep + ".")):
        folder = text if text.endswith(("/", os.sep)) else text[:-1]
        raise UsageError(
            f"{text}: ends with '/', so it names a folder, but this output is a file; "
            f"give a file name in it ({folder}NAME)"
        )


def _holds(folder: Path, inner: Path) -> bool:
    return inner == folder or folder in inner.parents


def check_target(
    target: PathLike, *, kind: str, verb: str | None = None, force: bool = False, inputs: Iterable[PathLike] = ()
) -> bool:
    """Refuse an output that must not be replaced; returns whether it exists (and may be replaced).

    An empty folder is taken as free: replacing it loses nothing, so it needs no ``force``.

    ``kind`` is ``"dir"`` (a folder output of ``verb``) or ``"file"``. Raises :class:`OutputRefusedError` (9)
    for what profparse did not write, :class:`OutputExistsError` (6) for its own output without ``force``.
    """
    if kind == "file":
        check_file_name(target)
    p = output_path(target)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise from_oserror(exc) from None
    mode = st.st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise _refuse(p, f"is {_describe(mode)}")
    real_inputs = [Path(os.path.realpath(i)) for i in inputs]
    if kind == "file":
        if stat.S_ISDIR(mode):
            raise _refuse(p, "is a folder, and this output is a file")
        for i in real_inputs:
            if i == p or (i.exists() and os.path.samefile(i, p)):
                raise _refuse(p, f"is the input {i}")
    else:
        if not stat.S_ISDIR(mode):
            raise _refuse(p, f"is a file, and {verb or 'this verb'} writes a folder")
        try:
            cwd = Path.cwd().resolve()
        except OSError:
            cwd = None
        if cwd is not None and _holds(p, cwd):
            raise _refuse(p, "is the current folder" if p == cwd else f"holds the current folder {cwd}")
        for i in real_inputs:
            if _holds(p, i):
                raise _refuse(p, "is the input folder" if p == i else f"holds the input {i}")
        marker = read_marker(p)
        if marker is None:
            try:
                empty = not any(os.scandir(p))
            except OSError as exc:
                raise from_oserror(exc) from None
            if not empty:
                raise _refuse(p, f"is a folder profparse did not write (no {MARKER} inside)")
            return True  # an empty folder: nothing to lose, used as if it did not exist (no --force needed)
        elif verb is not None and marker.get("verb") != verb:
            raise _refuse(p, f"holds the output of 'profparse {marker.get('verb')}', not of '{verb}'")
    if not force:
        raise OutputExistsError(f"{p}: already exists (use --force to replace it)")
    return True


def _lock_refused(lock: Path, why: str) -> OutputRefusedError:
    return OutputRefusedError(
        f"{lock}: the output's lock file {why}; profparse did not create it and will not use it "
        "(remove it, or choose another output path)"
    )


def _check_lock(lock: Path, st: os.stat_result) -> None:
    """Refuse a lock file profparse must not open or keep: anything but a regular file of this user, one link."""
    if not stat.S_ISREG(st.st_mode):
        raise _lock_refused(lock, f"is {_describe(st.st_mode)}")
    if st.st_uid != os.geteuid():
        raise _lock_refused(lock, f"belongs to another user (uid {st.st_uid})")
    if st.st_nlink != 1:
        raise _lock_refused(lock, f"has {st.st_nlink} hard links")


#: Flags of every open of a lock file: never through a symbolic link, never kept by a child, never a terminal,
#: and never blocking (a FIFO planted under the lock's name would otherwise wait for a writer).
_LOCK_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK


def _open_lock(lock: Path) -> tuple[int, bool] | None:
    """Open ``lock``: ``(fd, created)``, or None when it vanished between two looks, or was unlinked once open
    (its run finished: try again).

    A new lock is created with ``O_EXCL``, so this run knows it is its own. An existing one is used only when it is a
    regular file of this user with one link (checked before opening, so a device is never opened, and on the open
    file, so a swap in between is seen); it is locked but never written to nor removed.
    """
    try:
        return os.open(lock, _LOCK_FLAGS | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask()), True
    except FileExistsError:
        pass
    except OSError as exc:
        raise from_oserror(exc) from None
    try:
        _check_lock(lock, os.lstat(lock))
        fd = os.open(lock, _LOCK_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a symbolic link since the lstat
            raise _lock_refused(lock, "is a symbolic link") from None
        raise from_oserror(exc) from None
    try:
        st = os.fstat(fd)
        if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):  # its run finished and unlinked it since the lstat
            os.close(fd)
            return None
        _check_lock(lock, st)
    except BaseException:
        os.close(fd)
        raise
    return fd, False


def _holder(fd: int) -> str:
    """`` (pid N)`` for the run that wrote its pid into the lock, if that process is alive; else nothing."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f" (pid {text})" if text.isdigit() and _alive(int(text)) else ""


@contextmanager
def output_lock(target: PathLike) -> Iterator[Path]:
    """Hold the lock of ``target`` (``.NAME.lock`` beside it); wait while another run holds it.

    POSIX record locks (``lockf``), not ``flock``: they belong to this process only, so decoding workers forked
    while it is held do not keep it alive after this process dies (a later run would wait forever). After
    locking, the file is checked to still be the one at that path: its creator unlinks it just before unlocking,
    and a waiter that locked the unlinked file starts over.

    Only a lock this run created holds its pid and is removed afterwards (if the path still names it). A lock
    file found there (one left by a run that was killed) is used as it is and left in place; one that is not a
    regular file of this user with one link (a symbolic link planted to make the run truncate another file, a
    FIFO, a hard link) is refused (:class:`OutputRefusedError`, exit 9).
    """
    lock = lock_path(target)
    while True:
        opened = _open_lock(lock)
        if opened is None:
            continue
        fd, created = opened
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in UNLOCKABLE:  # a file system without record locks: write unlocked, as before
                    break
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if wait_notice is not None:
                    who = _holder(fd)
                    wait_notice(f"{output_path(target)}: another profparse run{who} is writing it; waiting for it")
                fcntl.lockf(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(lock))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        if created:
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        try:
            if created and os.path.samestat(os.fstat(fd), os.lstat(lock)):
                os.unlink(lock)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


#: errno values of a file system that has no record locks (some network mounts).
UNLOCKABLE = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})

#: The affixes of the temporary names this module generates after ``.NAME``: ``tempfile``'s 8 random characters
#: (lower-case letters, digits, ``_``) or ``replaced`` (:func:`atomic_dir`), between a pid and ``.partial``.
_TMP_NAME = re.compile(r"\.([1-9][0-9]{0,9})\.[a-z0-9_]{8}\.partial")
#: Linux never hands out a pid above this (PID_MAX_LIMIT); a larger number is not a pid profparse wrote.
_PID_LIMIT = 1 << 22


def clean_stale(target: PathLike) -> list[Path]:
    """Remove temporary siblings of ``target`` left by runs that died (killed mid-write); call under the lock.

    Only names this module generates, whose pid is no longer alive, and only this user's own: a regular file, or
    a folder (never followed through a link) that holds profparse's marker or nothing.
    """
    p = output_path(target)
    prefix = f".{_stem(p.name, TMP_ROOM)}"
    removed = []
    try:
        entries = list(os.scandir(p.parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        m = _TMP_NAME.fullmatch(entry.name[len(prefix) :])
        if not m or int(m.group(1)) > _PID_LIMIT or _alive(int(m.group(1))):
            continue
        path = Path(entry.path)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.geteuid():
            continue
        if stat.S_ISDIR(st.st_mode):
            if read_marker(path) is not None or _empty_or_broken_marker(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        elif stat.S_ISREG(st.st_mode):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _empty_or_broken_marker(folder: Path) -> bool:
    """A folder holding nothing, or only a marker file that is empty or not profparse's JSON (a run that died, or
    hit a full disk, while writing it): what :func:`atomic_dir` leaves at worst, so safe to remove."""
    try:
        entries = list(os.scandir(folder))
        if not entries:
            return True
        if len(entries) != 1 or entries[0].name != MARKER or not entries[0].is_file(follow_symlinks=False):
            return False
        return entries[0].stat(follow_symlinks=False).st_size < 4096
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (or cannot be told apart from one that does)."""
    if pid == os.getpid():
        return True
    if not 0 < pid <= _PID_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mkdir_parent(p: Path) -> None:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise from_oserror(exc) from None


def _translate(exc: BaseException, target: Path) -> BaseException:
    """An OSError raised while writing an output becomes its documented error (disk full, permission, ...)."""
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
        mapped = from_oserror(exc, where=str(target))
        if mapped is not exc:
            return mapped
    return exc


@contextmanager
def atomic_dir(
    target: PathLike,
    *,
    force: bool = False,
    verb: str = "parse",
    inputs: Iterable[PathLike] = (),
    owns: Sequence[str] | None = None,
) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes ``target``. On error nothing is left behind.

    With ``owns`` (the file names this run is responsible for, e.g. ``plot --kind X``'s files) an existing output
    is updated instead of replaced: the new files replace their namesakes, names in ``owns`` that were not written
    are removed, and every other file stays.
    """
    p = output_path(target)
    inputs = list(inputs)
    _mkdir_parent(p)
    with output_lock(p):
        exists = check_target(p, kind="dir", verb=verb, force=force, inputs=inputs)
        clean_stale(p)
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(p.name), suffix=".partial", dir=p.parent))
            tmp.chmod(0o777 & ~_umask())
            write_marker(tmp, verb)
        except OSError as exc:
            if tmp is not None:  # a full disk can fail the marker's write: no half folder is left
                shutil.rmtree(tmp, ignore_errors=True)
            raise from_oserror(exc, where=str(p)) from None
        try:
            yield tmp
            if not exists:
                tmp.rename(p)
            elif owns is not None:
                _merge(tmp, p, owns)
                shutil.rmtree(tmp)
            else:
                old = p.parent / f"{_tmp_prefix(p.name)}replaced.partial"
                p.rename(old)
                tmp.rename(p)
                shutil.rmtree(old, ignore_errors=True)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            mapped = _translate(exc, p)
            if mapped is exc:
                raise
            raise mapped from None


def _merge(tmp: Path, target: Path, owns: Sequence[str]) -> None:
    """Move every file of ``tmp`` into ``target`` (one atomic rename each); remove owned names not written."""
    written = set()
    for entry in os.scandir(tmp):
        os.replace(entry.path, target / entry.name)
        written.add(entry.name)
    for name in owns:
        old = target / name
        if name not in written and old.is_file() and not old.is_symlink():
            old.unlink()


@contextmanager
def atomic_file(target: PathLike, *, force: bool = False, inputs: Iterable[PathLike] = ()) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; it becomes ``target`` only if the block succeeds."""
    check_file_name(target)
    p = output_path(target)
    inputs = list(inputs)
    _mkdir_parent(p)
    with output_lock(p):
        check_target(p, kind="file", force=force, inputs=inputs)
        clean_stale(p)
        try:
            fd, name = tempfile.mkstemp(prefix=_tmp_prefix(p.name), suffix=".partial", dir=p.parent)
        except OSError as exc:
            raise from_oserror(exc) from None
        os.close(fd)
        tmp = Path(name)
        tmp.chmod(0o666 & ~_umask())
        try:
            yield tmp
            os.replace(tmp, p)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            mapped = _translate(exc, p)
            if mapped is exc:
                raise
            raise mapped from None
