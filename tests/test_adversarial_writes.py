"""Writes that fail half-way leave nothing behind: a full disk while the output folder's marker is written, and the
``.partial`` folder such a run left before this fix; a lock unlinked by the finishing run between a waiter's open
and its check is a reason to retry, not a planted lock."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profparse.base import files
from profparse.base.errors import NoSpaceError, OutputRefusedError
from profparse.base.files import MARKER, atomic_dir, clean_stale
from profparse.cli.main import main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "qwen2_tiny_cpu_nostack_syncload.json.gz"


def full_disk_marker(folder, verb: str) -> None:
    """What a full disk does to ``write_marker``: the file is created, its write fails."""
    (Path(folder) / MARKER).touch()
    raise OSError(errno.ENOSPC, "No space left on device")


def dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_a_full_disk_at_the_marker_leaves_no_partial_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "write_marker", full_disk_marker)
    target = tmp_path / "out"
    with pytest.raises(NoSpaceError) as caught, atomic_dir(target):
        pytest.fail("the block must not run")
    assert str(target) in str(caught.value)  # the message names the output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no .out.PID.xxxxxxxx.partial, no lock


@pytest.mark.skipif(not SAMPLE.exists(), reason="no sample_traces/")
def test_parse_on_a_full_disk_is_exit_10_and_leaves_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(files, "write_marker", full_disk_marker)
    out = tmp_path / "out"
    out.parent.mkdir(exist_ok=True)
    assert main(["parse", str(SAMPLE), "-o", str(out), "--no-cache", "-q"]) == 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left on device" in err[0] and str(out) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("marker", [b"", b'{"tool": "prof', b"\x00" * 100], ids=["empty", "cut", "nul"])
def test_a_partial_folder_with_only_a_broken_marker_is_cleaned(tmp_path: Path, marker: bytes) -> None:
    stale = tmp_path / f".out.{dead_pid()}.abcdefgh.partial"
    stale.mkdir()
    (stale / MARKER).write_bytes(marker)
    assert clean_stale(tmp_path / "out") == [stale] and not stale.exists()


def test_a_partial_folder_with_more_than_a_broken_marker_is_kept(tmp_path: Path) -> None:
    """Look-alikes stay: a broken marker beside another file, a marker that is a folder, a live run's folder."""
    pid = dead_pid()
    beside = tmp_path / f".out.{pid}.abcdefgh.partial"
    beside.mkdir()
    (beside / MARKER).write_bytes(b"")
    (beside / "notes.txt").write_text("mine")
    folder_marker = tmp_path / f".out.{pid}.bcdefghi.partial"
    (folder_marker / MARKER).mkdir(parents=True)
    live = tmp_path / f".out.{files.os.getpid()}.cdefghij.partial"
    live.mkdir()
    (live / MARKER).write_bytes(b"")
    assert clean_stale(tmp_path / "out") == []
    assert beside.is_dir() and folder_marker.is_dir() and live.is_dir()


def test_a_lock_unlinked_between_open_and_check_is_retried(tmp_path: Path, monkeypatch) -> None:
    """The finishing run unlinks its lock just as a waiter opens it: the waiter sees 0 links and starts over,
    never "profparse did not create it" (exit 9)."""
    target = tmp_path / "out"
    lock = files.lock_path(target)
    lock.write_text("4242\n")  # the finishing run's lock, still there when the waiter looks
    real_open = os.open
    unlinked = []

    def open_then_unlink(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if Path(path) == lock and not flags & os.O_CREAT and not unlinked:
            os.unlink(lock)  # the finishing run, between this open and the fstat
            unlinked.append(True)
        return fd

    monkeypatch.setattr(os, "open", open_then_unlink)
    with files.output_lock(target) as held:
        assert unlinked and held == lock and lock.read_text() == f"{os.getpid()}\n"  # its own lock now
    assert not lock.exists()


def test_a_hard_linked_lock_is_still_refused(tmp_path: Path) -> None:
    target = tmp_path / "out"
    lock = files.lock_path(target)
    lock.write_text("")
    os.link(lock, tmp_path / "other")
    with pytest.raises(OutputRefusedError, match="2 hard links"), files.output_lock(target):
        pass
