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


def test_a_cache_dir_linked_to_another_users_folder_creates_nothing_there(tmp_path: Path, monkeypatch) -> None:
    """``PROFPARSE_CACHE_DIR`` a link to a folder of another user that holds files: cache off with a note, and no
    ``profparse-cache/`` made inside it (it was)."""
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    other = tmp_path / "shared"
    other.mkdir()
    (other / "theirs.txt").write_text("theirs")
    os.chown(other, 12345, 12345)
    link = tmp_path / "cache-link"
    link.symlink_to(other, target_is_directory=True)
    monkeypatch.setenv(store.DIR_ENV, str(link))
    notes: list[str] = []
    profparse.load(small_trace(tmp_path / "trace.json"), notify=notes.append)
    assert sorted(p.name for p in other.iterdir()) == ["theirs.txt"]
    assert any("cache off" in n and "another user (uid 12345)" in n for n in notes), notes


def test_a_cache_dir_linked_to_the_users_own_folder_is_followed(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "disk" / "cache"
    target.mkdir(parents=True, mode=0o700)
    link = tmp_path / "cache-link"
    link.symlink_to(target, target_is_directory=True)
    monkeypatch.setenv(store.DIR_ENV, str(link))
    notes: list[str] = []
    trace = small_trace(tmp_path / "trace.json")
    profparse.load(trace, notify=notes.append)
    assert (target / folders.MARKER).is_file() and link.is_symlink()  # the data lies in the target
    assert profparse.load(trace, notify=notes.append).cache is not None  # and is read back from there
    assert not [n for n in notes if "cache off" in n], notes
