"""Finding the rank files in a folder and giving each its rank (distributedInfo, file name, position)."""

from __future__ import annotations

import json
import re
import stat
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profparse.base.errors import InputNotFoundError, ProfparseError, UsageError

RANK_SOURCES = ("distributedInfo", "file name", "sorted position")
RANK_FROM = {
    "auto": ("distributedInfo", "file name"),
    "name": ("file name",),
    "position": (),
}
TRACE_SUFFIXES = (".json", ".json.gz")
SKIP_NAMES = {"manifest.json"}  # written next to trace.json.gz by ``profparse capture``
PEEK_BYTES = 1 << 20

_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)
_EVENTS_KEY = b'"traceEvents"'
_DIST_INFO = re.compile(r'"distributedInfo"\s*:\s*(?=\{)')
_WORKER_NAME = re.compile(r"(?:^|[^a-z])worker[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)


def _natural_key(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name))


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (after symbolic links), e.g. ``a FIFO``; None for a file.

    Only ``stat``: nothing is opened, so a FIFO with no writer cannot block the run."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "a broken symbolic link" if path.is_symlink() else "unreadable"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"a symbolic link to {kind}" if path.is_symlink() else kind


def find_rank_files(folder: str | Path, skipped: list[str] | None = None) -> list[Path]:
    """The trace files (``*.json``, ``*.json.gz``) directly in ``folder``, in natural sort order.

    Entries named like trace files that are not regular files (a folder ``rank1.json``, a FIFO, a link to a
    device) are left out; ``skipped`` receives ``name (what it is)`` for each."""
    folder = Path(folder)
    if not folder.exists():
        raise InputNotFoundError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise InputNotFoundError(f"{folder}: not a folder")
    try:
        entries = list(folder.iterdir())
    except OSError as exc:
        raise InputNotFoundError(f"{folder}: cannot list ({exc.strerror})") from None
    named = [
        p
        for p in entries
        if p.name.lower().endswith(TRACE_SUFFIXES) and not p.name.startswith(".") and p.name not in SKIP_NAMES
    ]
    files, others = [], []
    for path in sorted(named, key=lambda p: _natural_key(p.name)):
        kind = _not_a_file(path)
        if kind is None:
            files.append(path)
        else:
            others.append(f"{path.name} ({kind})")
    if skipped is not None:
        skipped.extend(others)
    if not files:
        more = f"; skipped, not regular files: {_listed(others)}" if others else ""
        raise InputNotFoundError(f"{folder}: no trace files (*.json, *.json.gz) in this folder{more}")
    return files


def _listed(items: Sequence[str], shown: int = 5) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def rank_from_name(name: str) -> int | None:
    """The rank a file name states (``rank-3.…``, ``rank3``, ``trace_rank_3``, ``worker3``), else None."""
    for pattern in (_RANK_NAME, _WORKER_NAME):
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def valid_rank(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    value = int(value)
    return value if 0 <= value < 1 << 31 else None


def peek_rank(path: str | Path) -> int | None:
    """``distributedInfo.rank`` from the header before ``traceEvents`` (reads at most 1 MB), else None.

    Reads in small blocks so that a file cut short or corrupt further on still yields its header; a file that
    cannot be read at all returns None here, and its task reports the error.
    """
    from profparse.trace.source import open_trace

    buf = b""
    try:
        with open_trace(path) as stream:
            read = getattr(stream, "read1", stream.read)
            while len(buf) < PEEK_BYTES and _EVENTS_KEY not in buf:
                block = read(64 << 10)
                if not block:
                    break
                buf += block
    except (ProfparseError, OSError, EOFError, zlib.error):
        pass
    return _header_rank(buf)


def _header_rank(buf: bytes) -> int | None:
    head = buf.split(_EVENTS_KEY, 1)[0].decode("utf-8", errors="replace")
    match = _DIST_INFO.search(head)
    if not match:
        return None
    try:
        info, _ = json.JSONDecoder().raw_decode(head, match.end())
    except (ValueError, RecursionError):  # a header nested thousands deep states no rank; the file's read says why
        return None
    return valid_rank(info.get("rank")) if isinstance(info, dict) else None


@dataclass(frozen=True)
class RankFile:
    """One input file and the rank it was given (``source``: distributedInfo, file name or sorted position)."""

    path: str
    rank: int
    source: str


def assign_ranks(paths: Sequence[str | Path], rank_from: str = "auto") -> list[RankFile]:
    """Give each file a rank: from ``distributedInfo``, else its name, else the lowest rank left, in sorted order.

    ``rank_from``: ``auto`` (that order), ``name`` (ignore ``distributedInfo``) or ``position`` (sorted position
    only). Two files that state the same rank are an error: renumber them with ``rank_from="position"``.
    """
    if rank_from not in RANK_FROM:
        raise UsageError(f"unknown rank source {rank_from!r}; expected one of {', '.join(RANK_FROM)}")
    sources = RANK_FROM[rank_from]
    stated: list[tuple[int, str] | None] = []
    for path in paths:
        found = None
        for source in sources:
            rank = peek_rank(path) if source == "distributedInfo" else rank_from_name(Path(path).name)
            if rank is not None:
                found = (rank, source)
                break
        stated.append(found)
    claims: dict[int, list[str]] = {}
    for path, found in zip(paths, stated, strict=True):
        if found is not None:
            claims.setdefault(found[0], []).append(f"{Path(path).name} ({found[1]})")
    clashes = {rank: names for rank, names in claims.items() if len(names) > 1}
    if clashes:
        rank, names = min(clashes.items())
        more = f" and {len(clashes) - 1} more ranks" if len(clashes) > 1 else ""
        raise UsageError(
            f"rank {rank} is stated by {len(names)} files: {', '.join(names[:4])}{more}; "
            "use --rank-from position (or name) to number the files in sorted order"
        )
    free = (r for r in range(1 << 31) if r not in claims)
    out = []
    for path, found in zip(paths, stated, strict=True):
        rank, source = found if found is not None else (next(free), "sorted position")
        out.append(RankFile(path=str(path), rank=rank, source=source))
    return out


def describe_sources(files: Sequence[RankFile]) -> str:
    """``ranks 0-3 from distributedInfo`` or ``ranks 0-4: distributedInfo 3, file name 2``."""
    ranks = sorted(f.rank for f in files)
    span = ranks_text(ranks)
    counts = {s: sum(f.source == s for f in files) for s in RANK_SOURCES}
    used = {s: n for s, n in counts.items() if n}
    if len(used) == 1:
        return f"{span} from {next(iter(used))}"
    return f"{span}: {', '.join(f'{s} {n}' for s, n in used.items())}"


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-63`` (consecutive), ``ranks 0, 2, 5`` (the first 8, then ``...``)."""
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"ranks {shown}{', ...' if len(ranks) > 8 else ''}"


def prepare(folder: str | Path, rank_from: str = "auto", notify: Callable[[str], None] | None = None) -> list[RankFile]:
    """The files of ``folder`` with their ranks (see :func:`assign_ranks`); ``notify`` receives one note naming
    the entries skipped because they are not regular files (:func:`find_rank_files`)."""
    skipped: list[str] = []
    files = find_rank_files(folder, skipped)
    if skipped and notify is not None:
        entries = "entry that is not a regular file" if len(skipped) == 1 else "entries that are not regular files"
        notify(f"{folder}: skipped {len(skipped)} {entries}: {_listed(skipped)}")
    return assign_ranks(files, rank_from)
