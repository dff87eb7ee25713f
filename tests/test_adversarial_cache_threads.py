"""The cache from several threads at once (issue 33 item 9): another thread marks a new cache folder between this
one's look for the marker and its look at the folder's files. That folder is the cache's (never "files profparse
did not make": cache off, or an orphan ``profparse-cache/`` inside it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_adversarial_cache import small_trace

import profparse
from profparse.cache import folders, store


def marked_by_another_thread_after_first_look(monkeypatch: pytest.MonkeyPatch, module: object, root: Path) -> None:
    """``module.has_marker`` answers False once, and the other thread writes the marker right after."""
    real = folders.has_marker
    calls = []

    def has_marker(folder: Path) -> bool:
        calls.append(folder)
        if len(calls) == 1:
            answer = real(folder)
            root.mkdir(mode=0o700, exist_ok=True)
            (root / folders.MARKER).write_bytes(folders.MARKER_TEXT)
            (root / "stat").mkdir()  # and its first write
            return answer
        return real(folder)

    monkeypatch.setattr(module, "has_marker", has_marker)


def test_a_folder_marked_between_the_two_looks_is_the_caches(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    marked_by_another_thread_after_first_look(monkeypatch, folders, root)
    assert folders.folder_state(root) == "ours"


def test_a_claim_racing_another_threads_claim_keeps_the_cache_on(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "cache"
    notes: list[str] = []
    cache = store.Cache(root, 1 << 30, notes.append)
    marked_by_another_thread_after_first_look(monkeypatch, store, root)
    assert cache._claim() and cache.writable and cache.claimed
    assert notes == [] and sorted(p.name for p in root.iterdir()) == [folders.MARKER, "stat"]


def load_together(trace: Path, threads: int) -> tuple[list[str], list[BaseException]]:
    """``profparse.load(trace)`` from ``threads`` threads released at once; their notes and errors."""
    notes: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def load() -> None:
        try:
            barrier.wait()
            profparse.load(trace, notify=notes.append)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    started = [threading.Thread(target=load) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(120)
    return notes, errors


def test_four_threads_loading_into_a_new_cache_folder(tmp_path: Path, monkeypatch) -> None:
    trace = small_trace(tmp_path / "trace.json")
    for attempt in range(5):
        root = tmp_path / f"cache-{attempt}"
        monkeypatch.setenv(store.DIR_ENV, str(root))
        notes, errors = load_together(trace, 4)
        assert errors == [] and not [n for n in notes if "cache off" in n], notes
        assert not (root / folders.SUBFOLDER).exists() and (root / folders.MARKER).is_file()
        assert os.stat(root).st_mode & 0o777 == 0o700
