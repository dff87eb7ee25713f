"""The demo model's build folder: a killed build's leftovers are removed, nothing else of the user's is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from profparse.capture.model import _clean_stale


def _aged(path: Path, hours: float = 48.0) -> Path:
    old = time.time() - hours * 3600
    os.utime(path, (old, old), follow_symlinks=False)
    return path


def test_only_a_killed_builds_own_folders_are_removed(tmp_path: Path) -> None:
    """Leftovers named as the build names them go; look-alikes, links and young folders stay."""
    parent = tmp_path / "models"
    parent.mkdir()
    leftover = _aged(_mkdir(parent / ".demo.tmp-4242-0123abcd"))
    replaced = _aged(_mkdir(parent / ".demo.old-17-deadbeef"))
    users = _mkdir(parent / ".demo.backup")
    (users / "weights.safetensors").write_bytes(b"mine")
    _aged(users)
    elsewhere = _mkdir(tmp_path / "elsewhere")
    (elsewhere / "keep.txt").write_text("keep")
    link = parent / ".demo.tmp-1-abcdef12"
    link.symlink_to(elsewhere, target_is_directory=True)
    _aged(link)
    young = _mkdir(parent / ".demo.tmp-5-00000000")
    _clean_stale(parent, "demo")
    assert not leftover.exists() and not replaced.exists()
    assert (users / "weights.safetensors").read_bytes() == b"mine"
    assert link.is_symlink() and (elsewhere / "keep.txt").read_text() == "keep"
    assert young.is_dir()


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
