"""Checking a verb's stored result before it is replayed: its text (``stdout``, ``notes``, exit ``code``) or its
written files (``result.json`` and their checksums)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profparse.cache.folders import is_real_file
from profparse.cache.keys import as_stored, file_hash
from profparse.cache.sealed import CorruptEntry, json_digest

#: Exit codes a stored result may carry (docs/exit-codes.md, 0 to 11): a text claiming any other is not replayed.
REPLAYABLE_CODES = frozenset(range(12))


def unsafe_for_terminal(stdout: str, options: dict[str, Any]) -> bool:
    """Whether a stored text holds what a fresh run of these options never prints: a text or markdown rendering
    goes through :func:`profparse.base.formats.terminal_safe` (JSON and CSV keep names exact)."""
    from profparse.base.formats import PLAIN_FORMATS, terminal_safe

    return options.get("format") not in PLAIN_FORMATS and terminal_safe(stdout) != stdout


def checked_text(text: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """A stored text's body (``stdout``, ``notes``, ``code``) when it is the one for ``options``; None when it is
    another options' text (a digest collision); :class:`CorruptEntry` when it cannot be replayed."""
    stored = json.loads(text)
    if not isinstance(stored, dict) or stored.pop("checksum", None) != json_digest(stored):
        raise CorruptEntry("it does not match its checksum")
    if stored.get("options") != as_stored(options):  # another options' text (a digest collision)
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
    if unsafe_for_terminal(stored["stdout"], options):
        raise CorruptEntry("it holds terminal control characters that profparse never prints")
    return stored


def checked_output(folder: Path, text: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """A stored output's ``result.json`` body (``text``) with its files in ``folder`` checked; None when it is
    another options' or one of its files is missing (drawn again); :class:`CorruptEntry` when damaged."""
    body = json.loads(text)
    if not isinstance(body, dict) or body.pop("checksum", None) != json_digest(body):
        raise CorruptEntry("result.json does not match its checksum")
    files, sums = body.get("files"), body.get("sums")
    if (
        not isinstance(files, list)
        or body.get("options") != as_stored(options)
        or not isinstance(body.get("notes"), list)
        or not isinstance(sums, dict)
    ):
        return None
    for f in files:
        if not (isinstance(f, str) and "/" not in f and f not in (".", "..") and is_real_file(folder / f)):
            return None  # a file missing: drawn again
        if file_hash(folder / f) != sums.get(f):
            raise CorruptEntry(f"{f} does not match its checksum")
    return body
