"""Adversarial steps and ranks: repeated or huge step numbers, rank folders with odd entries and headers, the
worker pool's temporaries and its size, and a dataset that keeps what its ranks ran on.

Each case runs the CLI in a fresh process (tests/adversarial.py) and asserts the exit code, the message, and that
nothing is left behind.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from adversarial import REPO, _session_pids, assert_clean_failure, assert_success, run_cli, snapshot, start_pool_run
from tracebuilder import TraceBuilder, slow_rank_folder, training_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc, FIFOs and /dev (Linux)")


def steps_trace(path: Path, numbers: list[int | str], *, duplicate_first: bool = False) -> Path:
    """One training step per entry of ``numbers`` (``ProfilerStep#<n>``), 10 us apart; optionally the first
    ProfilerStep event twice (same ts and dur, as a writer that flushed it twice)."""
    b = TraceBuilder()
    t = 1000.0
    for number in numbers:
        t = training_step(b, number, t) + 10  # type: ignore[arg-type]
    if duplicate_first:
        first = next(e for e in b.events if str(e.get("name", "")).startswith("ProfilerStep#"))
        b.events.append(dict(first))
    return b.write(path)


# -- item 6: repeated and huge step numbers -----------------------------------------------------------------------


STEP_CASES = {
    "restarted": ([1, 2, 3, 1, 2, 3], [1, 2, 3, 4, 5, 6], "renumbered"),
    "beyond_int64": ([1, 2, 10**25], [1, 2, 3], "too large"),
    "five_thousand_digits": ([1, "9" * 5000, 2], [1, 3, 2], "too large"),
    "duplicated_event": ([1, 2, 3], [1, 2, 3], "duplicated ProfilerStep event ignored"),
}


def summary_json(run) -> dict:
    assert_success(run)
    return json.loads(run.stdout)


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_repeated_step_numbers_are_kept_apart(tmp_path, case):
    """A restarted ``ProfilerStep#N`` counter, a duplicated step event or a number beyond int64 exited 70 in
    summarize, parse and report ("cannot reindex on an axis with duplicate labels", OverflowError): now every
    step window gets its own number, a warning says which were renumbered, and every step adds up as before."""
    numbers, expected, said = STEP_CASES[case]
    trace = steps_trace(tmp_path / "t.json", numbers, duplicate_first=case == "duplicated_event")
    plain = steps_trace(tmp_path / "plain.json", [1])
    before = snapshot(trace)
    data = summary_json(run_cli("summarize", str(trace), "--format", "json", "--no-cache"))
    assert said in json.dumps(data["warnings"]), data["warnings"]
    assert data["steps"]["numbers"] == expected
    one = summary_json(run_cli("summarize", str(plain), "--format", "json", "--no-cache", "-q"))["step_totals"][0]
    # every step is the same step of training_step: its figures are those of a trace with one step
    # (but ``steady``: the first of several steps is warm-up, a lone step is not)
    assert [{**s, "step": 0, "steady": None} for s in data["step_totals"]] == [
        {**one, "step": 0, "steady": None}
    ] * len(expected)
    for total in data["step_totals"]:  # the stages of each step add up to its totals
        rows = [r for r in data["per_step"] if r["step"] == total["step"]]
        assert sum(r["host_wall_ns"] for r in rows) == total["host_wall_ns"] > 0
        assert sum(r["gpu_busy_ns"] for r in rows) == total["gpu_busy_ns"] > 0
    parse = run_cli("parse", str(trace), "-o", str(tmp_path / "out"), "--no-cache")
    assert_success(parse, folders=(tmp_path,))
    assert said in parse.stderr
    steps = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert steps["step"].tolist() == expected
    warnings = pd.read_parquet(tmp_path / "out" / "warnings.parquet")
    assert "repeated_steps" in set(warnings["check"])
    report = run_cli("report", str(trace), "-o", str(tmp_path / "r.html"), "--no-cache")
    assert_success(report, folders=(tmp_path,))
    assert (tmp_path / "r.html").stat().st_size > 0
    assert snapshot(trace) == before


# -- item 13: the pool's temporaries -----------------------------------------------------------------------------


def rank_folder(folder: Path, count: int, steps: int = 3) -> Path:
    """``count`` small rank traces ``rank<r>.json`` (distributedInfo says the same rank)."""
    folder.mkdir(parents=True)
    for rank in range(count):
        b = TraceBuilder()
        b.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": count}
        t = 0.0
        for step in range(steps):
            t = training_step(b, step, t) + 10
        b.write(folder / f"rank{rank}.json")
    return folder


@pytest.mark.parametrize("verb", ["parse", "summarize"])
def test_parallel_ranks_leave_nothing_in_tmpdir(tmp_path, verb):
    """Every ``-j N`` run left the forkserver's ``pymp-*`` folder (with its socket) in $TMPDIR: multiprocessing
    removes it at exit, which the CLI skips (os._exit). A pymp folder that was there before is not touched."""
    folder = rank_folder(tmp_path / "in", 3)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    theirs = tmpdir / "pymp-someone_else"  # another program's: stays
    theirs.mkdir()
    (theirs / "listener-x").write_text("")
    out = ("-o", str(tmp_path / "out")) if verb == "parse" else ()
    env = {"TMPDIR": str(tmpdir), "PROFPARSE_FORCE_JOBS": "1"}  # two workers even on a one-CPU machine
    run = run_cli(verb, str(folder), *out, "-j", "2", "--no-cache", env=env)
    assert_success(run, folders=(tmp_path,))
    assert "parsing in 2 processes" in run.stderr, run.stderr
    assert sorted(p.name for p in tmpdir.rglob("*")) == ["listener-x", "pymp-someone_else"]


def test_parallel_ranks_under_a_tmpdir_too_long_for_a_socket(tmp_path):
    """The forkserver listens on a socket in $TMPDIR/pymp-*: under a $TMPDIR of 120 bytes its path passed the
    107 bytes AF_UNIX allows, and every -j N run was an internal error (exit 70). The pool then works from a
    short folder of its own in /tmp, removed afterwards, and leaves $TMPDIR as it was."""
    folder = rank_folder(tmp_path / "in", 2)
    tmpdir = tmp_path / "t"
    tmpdir = tmpdir / ("x" * max(1, 120 - len(str(tmpdir))))
    tmpdir.mkdir(parents=True)
    env = {"TMPDIR": str(tmpdir), "PROFPARSE_FORCE_JOBS": "1"}
    run = run_cli("summarize", str(folder), "-j", "2", "--no-cache", env=env)
    assert_success(run, folders=(tmp_path,))
    assert "parsing in 2 processes" in run.stderr, run.stderr
    assert list(tmpdir.iterdir()) == []


def interrupt_pool_run(tmp_path: Path, sig: int) -> tuple[int, str, list[int], Path]:
    """Parse a slow rank folder with -j 2, send ``sig`` to profparse alone once its worker pool is starting (not
    after a fixed time: on a quiet machine the run can end first); return its exit code, stderr, the processes of
    its session still alive a second later (killed) and its $TMPDIR."""
    folder = slow_rank_folder(tmp_path / "in")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), TMPDIR=str(tmpdir), PROFPARSE_FORCE_JOBS="1")
    argv = ["parse", str(folder), "-o", str(tmp_path / "out"), "-j", "2", "-q", "--no-cache"]
    proc = start_pool_run(argv, env)
    assert proc.poll() is None, "the run ended before its worker pool started"
    proc.send_signal(sig)
    try:
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        time.sleep(1.0)
        left = [p for p in _session_pids(proc.pid) if p != proc.pid]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return proc.returncode, err, left, tmpdir


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_parallel_ranks_leave_nothing_in_tmpdir(tmp_path, sig):
    """Ctrl-C or SIGTERM while the workers parse: exit 130/143, one line, no pymp folder and no process left."""
    code, err, left, tmpdir = interrupt_pool_run(tmp_path, sig)
    assert code == (130 if sig == signal.SIGINT else 143), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert left == [] and not (tmp_path / "out").exists()
    assert list(tmpdir.iterdir()) == []


def test_sigterm_while_the_pool_starts(tmp_path):
    """SIGTERM (to profparse alone, as ``kill PID``) while the pool's first worker is being forked: that worker,
    not yet known to the pool, looked for the pool's semaphores after the parent had let go of them and printed a
    traceback. The pool now starts with SIGTERM held, as it held Ctrl-C: exit 143, one line, nothing left."""
    code, err, left, tmpdir = interrupt_pool_run(tmp_path, signal.SIGTERM)
    assert code == 143, err
    assert err.strip().splitlines() == ["profparse: terminated (SIGTERM); nothing was left half-written"], err
    assert left == []
    assert list(tmpdir.iterdir()) == [] and not (tmp_path / "out").exists()


# -- item 11: -j bounded by the CPUs -------------------------------------------------------------------------------


@pytest.fixture
def one_cpu():
    """This process (and the CLI runs it starts) on one CPU only."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity here")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_jobs_are_bounded_by_the_cpus(tmp_path, one_cpu, monkeypatch):
    """``-j 4`` on 4 ranks started 4 workers on a one-CPU machine: now one, with a note; PROFPARSE_FORCE_JOBS=1
    keeps 4. The library's parse_ranks is bounded the same way."""
    folder = rank_folder(tmp_path / "in", 4, steps=1)
    capped = run_cli("summarize", str(folder), "-j", "4", "--no-cache")
    assert_success(capped)
    assert "parsing in this process (-j 4 lowered to the 1 CPU this process may use; PROFPARSE_FORCE_JOBS=1" in (
        capped.stderr
    ), capped.stderr
    forced = run_cli("summarize", str(folder), "-j", "4", "--no-cache", env={"PROFPARSE_FORCE_JOBS": "1"})
    assert_success(forced)
    assert "parsing in 4 processes\n" in forced.stderr, forced.stderr
    assert capped.stdout == forced.stdout
    default = run_cli("summarize", str(folder), "--no-cache")
    assert "parsing in this process\n" in default.stderr, default.stderr

    from profparse.ranks import scheduling

    used: list[int] = []
    monkeypatch.setattr(scheduling, "run_local", lambda tasks, jobs, on_done: used.append(jobs) or [])
    monkeypatch.delenv("PROFPARSE_FORCE_JOBS", raising=False)
    scheduling.run_tasks([object()] * 4, jobs=4)  # type: ignore[list-item]
    monkeypatch.setenv("PROFPARSE_FORCE_JOBS", "1")
    scheduling.run_tasks([object()] * 4, jobs=4)  # type: ignore[list-item]
    assert used == [1, 4]


# -- nits: odd entries, odd rank numbers, the devices of a dataset ------------------------------------------------


def test_rank_entries_that_are_not_regular_files_are_skipped_with_a_note(tmp_path):
    """A folder named rank1.json, a FIFO (no writer: opening it would block), a link to a device and a broken
    link were left out silently: now one note names them, and the run never opens them."""
    folder = rank_folder(tmp_path / "in", 1)
    (folder / "rank1.json").mkdir()
    os.mkfifo(folder / "rank2.json")
    (folder / "rank3.json").symlink_to("/dev/zero")
    (folder / "rank4.json.gz").symlink_to(tmp_path / "missing.json.gz")
    before = snapshot(folder)
    run = run_cli("summarize", str(folder), "--no-cache", timeout=60)
    assert_success(run)
    assert (
        "skipped 4 entries that are not regular files: rank1.json (a folder), rank2.json (a FIFO), "
        "rank3.json (a symbolic link to a device), rank4.json.gz (a broken symbolic link)"
    ) in run.stderr, run.stderr
    assert "1 rank traces" in run.stderr
    assert snapshot(folder) == before
    only_odd = tmp_path / "odd"
    only_odd.mkdir()
    os.mkfifo(only_odd / "rank0.json")
    run = run_cli("parse", str(only_odd), "-o", str(tmp_path / "out"), timeout=60)
    assert_clean_failure(run, 3, contains="skipped, not regular files: rank0.json (a FIFO)", folders=(tmp_path,))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stated", [True, False, 1.5, -1, 2**40, "1"])
def test_distributed_info_rank_that_is_not_a_rank_number(tmp_path, stated):
    """``distributedInfo.rank: true`` was rank 1 in a single trace's summary (bool is an int in Python), and in
    a folder the rank note said "distributedInfo says rank 1"; likewise false, negative and huge numbers. None of
    them is a rank: the trace has no rank, and a folder's note says the value is not a rank number."""
    b = TraceBuilder()
    b.header["distributedInfo"] = {"backend": "nccl", "rank": stated, "world_size": 2}
    training_step(b, 1, 0)
    trace = b.write(tmp_path / "t.json")
    data = summary_json(run_cli("summarize", str(trace), "--format", "json", "--no-cache"))
    assert data["rank"] is None
    folder = tmp_path / "in"
    folder.mkdir()
    b.write(folder / "a.json")
    run = run_cli("summarize", str(folder), "--no-cache")
    assert_success(run)
    assert "ranks 0 from" not in run.stderr and "rank 0 from sorted position" in run.stderr, run.stderr
    said = json.dumps(stated)
    assert f"distributedInfo.rank {said} is not a rank number" in run.stderr, run.stderr
    assert "distributedInfo says rank" not in run.stderr


def gpu_rank_folder(folder: Path) -> Path:
    """Two ranks of a real GPU trace (the MI250 one in sample_traces/gpu), ranks from distributedInfo."""
    source = REPO / "sample_traces" / "gpu" / "mi250_minitoy.json.gz"
    with gzip.open(source) as f:
        doc = json.load(f)
    folder.mkdir()
    for rank in (0, 1):
        copy = {**doc, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}}
        (folder / f"host{rank}.json").write_text(json.dumps(copy))
    return folder


def devices_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("  devices:"))


def test_a_parsed_dataset_keeps_the_ranks_devices(tmp_path):
    """``summarize`` of a dataset ``parse DIR`` wrote said "devices: no GPU" for GPU ranks: the dataset did not
    keep them. Now the ``ranks`` table has a ``devices`` column, read back as the folder's run shows them."""
    folder = gpu_rank_folder(tmp_path / "in")
    direct = run_cli("summarize", str(folder), "-q", "--no-cache")
    assert_success(direct)
    assert "no GPU" not in devices_line(direct.stdout) and "(2 of 2 ranks)" in devices_line(direct.stdout)
    out = tmp_path / "out"
    assert_success(run_cli("parse", str(folder), "-o", str(out), "-q", "--no-cache"), folders=(tmp_path,))
    again = run_cli("summarize", str(out), "-q")
    assert_success(again)
    assert devices_line(again.stdout) == devices_line(direct.stdout)
    name = devices_line(direct.stdout).removeprefix("  devices: ").split(" (")[0]  # the trace's deviceProperties
    table = pd.read_parquet(out / "ranks")
    assert [set(d) for d in table["devices"]] == [{name}, {name}]


def test_a_dataset_written_before_devices_were_kept_still_reads(tmp_path):
    """A dataset whose ``ranks`` table has no ``devices`` column (written by an earlier profparse) reads as
    before: no devices, no error."""
    folder = gpu_rank_folder(tmp_path / "in")
    out = tmp_path / "out"
    assert_success(run_cli("parse", str(folder), "-o", str(out), "-q", "--no-cache"), folders=(tmp_path,))
    part = out / "ranks" / "part-0.parquet"
    pd.read_parquet(part).drop(columns="devices").to_parquet(part, index=False)
    run = run_cli("summarize", str(out), "-q")
    assert_success(run)
    assert devices_line(run.stdout) == "  devices: no GPU"
