"""The memory budget reads cgroup limits (issue 33 item 5): in a 120-150 MiB memory cgroup a 60 MB trace ended
with the kernel's OOM kill (exit 137, no message), because only MemAvailable and ``ulimit -v`` were read. A fake
cgroup tree (v1 and v2) stands for the kernel's files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
    hold every event (~730 bytes each measured, 0.9 M such events peaked at 764 MB): counted per event (250 bytes)
    and per op (550 more) the estimate is ~890 MiB, and the run stops with exit 8 after the first 16 MiB of JSON."""
    from adversarial import assert_clean_failure, run_cli

    path = tiny_events_gzip(tmp_path / "tiny.json.gz", 1_000_000)
    run = run_cli("summarize", str(path), "--no-cache", env={budget.MEMORY_ENV: "300M"}, timeout=300)
    assert_clean_failure(run, 8, contains="M events")


# -- the estimate counts events and distinct strings (issue 33 item 5) -----------------------------------------------


def write_trace(path: Path, events: list[str]) -> Path:
    path.write_text('{"traceEvents":[' + ",".join(events) + "]}")
    return path


def op(i: int, name: str = "aten::add", tid: int = 1, cat: str = "cpu_op") -> str:
    return f'{{"ph":"X","cat":"{cat}","name":"{name}","pid":1,"tid":{tid},"ts":{1000 + 2 * i},"dur":1}}'


def estimate_after(path: Path, monkeypatch, capsys) -> tuple[float, str]:
    """The estimate (MiB) that reading ``path`` checks with its exact counts, and its debug line."""
    from profparse.trace.events import read_trace

    monkeypatch.setenv(budget.DEBUG_ENV, "1")
    monkeypatch.delenv(budget.MEMORY_ENV, raising=False)
    read_trace(path, workers=1)
    line = [x for x in capsys.readouterr().err.splitlines() if "memory estimate [after]" in x][-1]
    return float(line.split("]: ")[1].split(" MiB")[0]), line


N = 20_000


def test_the_estimate_counts_every_event_and_op(tmp_path: Path, monkeypatch, capsys) -> None:
    """20 k tiny ops (~70 bytes of JSON each): the JSON says 2 MiB, the events 250 + 550 bytes each."""
    mib, line = estimate_after(write_trace(tmp_path / "t.json", [op(i) for i in range(N)]), monkeypatch, capsys)
    assert f"events {N:,}, ops {N:,}" in line
    expected = budget.NEED_FIXED + (budget.NEED_PER_EVENT + budget.NEED_PER_OP) * N
    assert abs(mib * MiB - expected) < 0.1 * MiB  # the distinct strings ("X", "cpu_op", "aten::add") are nothing


def test_unique_names_add_per_string_and_per_character(tmp_path: Path, monkeypatch, capsys) -> None:
    same, _ = estimate_after(write_trace(tmp_path / "s.json", [op(i) for i in range(N)]), monkeypatch, capsys)
    names = [f"aten::unique_{i:07d}" for i in range(N)]  # 20 characters each
    path = write_trace(tmp_path / "u.json", [op(i, name) for i, name in enumerate(names)])
    unique, line = estimate_after(path, monkeypatch, capsys)
    assert f"strings {N + 2:,}" in line  # the names, "X" and "cpu_op"
    grown = (unique - same) * MiB
    assert abs(grown - (budget.NEED_PER_STRING + 20 * budget.NEED_PER_CHAR) * (N - 1)) < 0.1 * MiB


def test_python_functions_and_gpu_events_are_counted(tmp_path: Path, monkeypatch, capsys) -> None:
    events = [op(i, cat="python_function") for i in range(N)] + [op(i, cat="kernel", tid=7) for i in range(N)]
    mib, line = estimate_after(write_trace(tmp_path / "p.json", events), monkeypatch, capsys)
    assert f"ops 0, python {N:,}, gpu {N:,}" in line
    per_event = 2 * budget.NEED_PER_EVENT + budget.NEED_PER_PYTHON + budget.NEED_PER_GPU
    assert abs(mib * MiB - budget.NEED_FIXED - per_event * N) < 0.1 * MiB


def test_a_gzip_bomb_of_14_m_tiny_events_stops_early(tmp_path: Path) -> None:
    """14 M one-field ops in a few MB of .json.gz: ~800 bytes of memory each, ~11 GiB in all; under a 2 GiB budget
    the first check (16 MiB inflated) stops it, in seconds, with the count in the message (projected from the
    events decoded so far: the last MiB read is not decoded yet, so it says a few percent less)."""
    import gzip
    import re

    from adversarial import assert_clean_failure, run_cli

    event = b',{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1000,"dur":1}'
    block = gzip.compress(event * 100_000, compresslevel=9)  # one member, written 140 times (gzip reads them all)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents":[{}') + block * 140 + gzip.compress(b"]}"))
    assert path.stat().st_size < 8 << 20
    run = run_cli("summarize", str(path), "--no-cache", env={budget.MEMORY_ENV: "2G"}, timeout=120)
    assert_clean_failure(run, 8, contains=" M events")
    assert 12.5 <= float(re.search(r"about ([\d.]+) M events", run.stderr).group(1)) <= 14.5, run.stderr
    assert run.seconds < 30, run.seconds


def own_memory_cgroup() -> Path | None:
    """A new child of this process's memory cgroup (v2 or v1), where it can be made (root, a writable tree)."""
    try:
        lines = budget.PROC_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers and (budget.CGROUP_ROOT / "cgroup.controllers").exists():
            base, limit_file = budget.CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):
            base, limit_file = budget.CGROUP_ROOT / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / path.strip("/") / f"profparse-test-{os.getpid()}"
        try:
            folder.mkdir()
        except OSError:
            continue
        if (folder / limit_file).exists() and (folder / "cgroup.procs").exists():
            return folder
        folder.rmdir()
    return None


def test_a_run_in_a_memory_cgroup_below_the_estimate_is_exit_8_not_the_oom_kill(tmp_path: Path) -> None:
    """300 k ops with unique names (26 MB of JSON): 1.5x the JSON + 128 MiB (~165 MiB) fits a 300 MiB cgroup, the
    run does not (~410 MiB peak): the kernel's OOM kill (SIGKILL, after 19 s) before; the check while reading
    counts the events and names and stops with exit 8 in about a second."""
    from adversarial import CliRun, assert_clean_failure

    folder = own_memory_cgroup()
    if folder is None:
        pytest.skip("cannot make a memory cgroup here")
    try:
        names = [f"aten::unique_{i:07d}" for i in range(300_000)]
        path = write_trace(tmp_path / "u.json", [op(i, name) for i, name in enumerate(names)])
        limit = folder / ("memory.max" if (folder / "memory.max").exists() else "memory.limit_in_bytes")
        limit.write_text(str(300 * MiB))
        env = {k: v for k, v in os.environ.items() if k not in (budget.MEMORY_ENV, "PROFPARSE_DEBUG")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
        argv = ["summarize", str(path), "--no-cache", "-q"]
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "profparse.cli.main", *argv],
            capture_output=True,
            env=env,
            timeout=300,
            preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())),
        )
        run = CliRun(argv, proc.returncode, proc.stdout.decode(), proc.stderr.decode(), time.perf_counter() - start)
        assert_clean_failure(run, 8, contains="left under the memory limit of its cgroup")
        assert run.seconds < 30, run.seconds
    finally:
        folder.rmdir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_heap_top_is_kept_between_chunks() -> None:
    """With profparse's allocator settings, a buffer the size of a decoded chunk, filled and freed again and again,
    faults its pages in once, not each time: the heap's top is kept (:data:`budget.TRIM_THRESHOLD`; with glibc's
    128 KiB, fixed once the mmap threshold is set, it was given back after each). Counted in a fresh interpreter,
    as the command sets them at its start."""
    script = """
import resource
from profparse.trace import budget
budget.map_big_allocations()
buffers = [bytearray(1 << 10) for _ in range(64)]  # heap in use below the buffer
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    chunk = bytearray(3 << 19)  # 1.5 MiB: a decoded chunk's columns
    chunk[::4096] = b"x" * len(range(0, len(chunk), 4096))  # every page written
    del chunk
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    pages = (3 << 19) // 4096
    assert int(run.stdout) < 5 * pages  # about once, not once per buffer
