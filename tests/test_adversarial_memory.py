"""The memory budget reads cgroup limits (issue 33 item 5): in a 120-150 MiB memory cgroup a 60 MB trace ended
with the kernel's OOM kill (exit 137, no message), because only MemAvailable and ``ulimit -v`` were read. A fake
cgroup tree (v1 and v2) stands for the kernel's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from profparse.base.errors import OutOfMemoryError
from profparse.trace import budget

MiB = 1 << 20


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def v2_tree(tmp_path: Path, limit: str, current: int, parent_limit: str = "max") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    write(root / "user.slice" / "memory.max", parent_limit)
    write(root / "user.slice" / "memory.current", str(current))
    write(root / "user.slice" / "job" / "memory.max", limit)
    write(root / "user.slice" / "job" / "memory.current", str(current))
    proc = tmp_path / "proc_cgroup"
    write(proc, "0::/user.slice/job")
    return proc, root


def test_v2_limit_less_usage(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, str(150 * MiB), 40 * MiB)
    assert budget.cgroup_memory_left(proc, root) == 110 * MiB


def test_v2_a_parents_tighter_limit_binds(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "max", 40 * MiB, parent_limit=str(100 * MiB))
    assert budget.cgroup_memory_left(proc, root) == 60 * MiB


def test_v2_no_limit_anywhere(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "max", 40 * MiB)
    assert budget.cgroup_memory_left(proc, root) is None


def test_v1_memory_controller(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    folder = root / "memory" / "docker" / "abc"
    write(folder / "memory.limit_in_bytes", str(128 * MiB))
    write(folder / "memory.usage_in_bytes", str(100 * MiB))
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712")  # v1's "no limit"
    write(root / "memory" / "memory.usage_in_bytes", str(5000 * MiB))
    proc = tmp_path / "proc_cgroup"
    write(proc, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/")
    assert budget.cgroup_memory_left(proc, root) == 28 * MiB


def test_a_container_that_shows_its_cgroup_as_the_root(tmp_path: Path) -> None:
    """/proc/self/cgroup names a path the container's mount does not show: the mount's root is its cgroup."""
    root = tmp_path / "cgroup"
    write(root / "memory.max", str(120 * MiB))
    write(root / "memory.current", str(20 * MiB))
    proc = tmp_path / "proc_cgroup"
    write(proc, "0::/kubepods/pod1/container2")
    assert budget.cgroup_memory_left(proc, root) == 100 * MiB


def test_unreadable_files_are_no_limit(tmp_path: Path) -> None:
    assert budget.cgroup_memory_left(tmp_path / "missing", tmp_path) is None
    proc = tmp_path / "proc_cgroup"
    write(proc, "garbage line\n0::/x")
    assert budget.cgroup_memory_left(proc, tmp_path / "nothing") is None


def test_a_trace_over_the_cgroup_limit_is_exit_8_before_reading(tmp_path: Path, monkeypatch) -> None:
    proc, root = v2_tree(tmp_path, str(150 * MiB), 40 * MiB)
    monkeypatch.setattr(budget, "PROC_CGROUP", proc)
    monkeypatch.setattr(budget, "CGROUP_ROOT", root)
    monkeypatch.delenv(budget.MEMORY_ENV, raising=False)
    left, source = budget.memory_budget()
    assert (left, source) == (110 * MiB, "left under the memory limit of its cgroup")
    with pytest.raises(OutOfMemoryError, match="110.0 MiB left under the memory limit of its cgroup") as caught:
        budget.check_memory("t.json", 60e6)
    assert caught.value.exit_code == 8


def tiny_events_gzip(path: Path, events: int) -> Path:
    """A ``.json.gz`` of ``events`` one-field events (~70 bytes of JSON each): a few hundred kB on disk."""
    import gzip

    event = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1000,"dur":1}'
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(b'{"traceEvents":[' + event)
        for _ in range(events // 100_000):
            f.write((b"," + event) * 100_000)
        f.write(b"]}")
    return path


def test_many_tiny_events_are_refused_by_their_count(tmp_path: Path) -> None:
    """1 M events of ~70 bytes: 1.5x the JSON + 128 MiB says ~240 MB and passed a 300 MiB budget, but the tables
    hold every event (~730 bytes each measured, 0.9 M such events peaked at 764 MB): counted at 250 bytes per event
    the estimate is ~380 MB, and the run stops with exit 8 after the first 16 MiB of JSON."""
    from adversarial import assert_clean_failure, run_cli

    path = tiny_events_gzip(tmp_path / "tiny.json.gz", 1_000_000)
    run = run_cli("summarize", str(path), "--no-cache", env={budget.MEMORY_ENV: "300M"}, timeout=300)
    assert_clean_failure(run, 8, contains="M events")
