"""Harness for the adversarial suite: run the CLI as a user does, in a fresh process, and check what it left.

Every adversarial test goes through :func:`run_cli` and then asserts with :func:`assert_clean_failure` (or
:func:`assert_success`): exit code, a one-line message, no traceback, nothing half-written, inputs unchanged,
no process left behind, and (optionally) time within a factor of a valid file of the same size measured in the
same run (never an absolute time).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import cli_zygote

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliRun:
    """What one CLI run did."""

    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    leftover_pids: list[int] = field(default_factory=list)


def snapshot(*roots: Path) -> dict[str, str]:
    """Path -> sha256 (or 'dir', 'other') of everything under ``roots``: compare before/after a run."""
    out: dict[str, str] = {}
    for root in roots:
        root = Path(root)
        if not root.exists() and not root.is_symlink():
            continue
        items = [root] + sorted(root.rglob("*")) if root.is_dir() else [root]
        for p in items:
            if p.is_symlink():
                out[str(p)] = f"link:{os.readlink(p)}"
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p)] = "dir"
            else:
                out[str(p)] = "other"
    return out


def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the CLI runs in its own session, so its workers share it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def _read_all(stream: IO[bytes] | None) -> Callable[[], bytes]:
    """Read ``stream`` to its end in a thread (a pipe must be drained while the process is waited for); the
    returned function waits for it and gives the bytes (b"" for no stream)."""
    if stream is None:
        return lambda: b""
    chunks: list[bytes] = []
    thread = threading.Thread(target=lambda: chunks.append(stream.read()), daemon=True)
    thread.start()

    def result() -> bytes:
        thread.join()
        stream.close()
        return b"".join(chunks)

    return result


def run_cli(
    *argv: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = None,
    cwd: Path | None = None,
    signal_after: tuple[float, int] | None = None,
    orphan_grace: float = 3.0,
    processes_before_signal: int = 0,
    fresh: bool = False,
) -> CliRun:
    """Run ``python -m profparse.cli.main ARGV`` in a new session; optionally send ``signal_after=(secs, sig)``,
    the seconds counted once its session holds ``processes_before_signal`` processes (e.g. a started pool).

    The CLI is reaped as soon as it ends (a zombie still answers ``kill(pid, 0)``, so its pool workers would take
    it for alive); then this waits up to ``orphan_grace`` seconds for processes of its session to go away and
    records any still alive in ``leftover_pids`` (then kills them, so one failing test never leaks into the next).

    The process is forked from a zygote that has done the imports (:mod:`cli_zygote`), unless the run needs a
    plain interpreter (a signal while it starts, an environment that changes start-up) or ``fresh`` asks for one.
    """
    base_env = dict(os.environ)
    base_env.pop("PROFPARSE_DEBUG", None)
    base_env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + base_env.get("PYTHONPATH", "")
    full_env = {**base_env, **(env or {})}
    cmd = [sys.executable, "-m", "profparse.cli.main", *argv]
    start = time.perf_counter()
    proc: subprocess.Popen[bytes] | cli_zygote.ZygoteProcess
    if cli_zygote.suits(full_env, base_env, stdin, stdout, signal_after, fresh):
        proc, out_stream, err_stream = cli_zygote.spawn(list(argv), full_env, base_env, cwd)
        readers = [_read_all(out_stream), _read_all(err_stream)]
    else:
        proc = subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        readers = [_read_all(stream) for stream in (proc.stdout, proc.stderr)]
    timed_out = False
    try:
        if signal_after is not None:
            delay, sig = signal_after
            deadline = time.monotonic() + timeout
            while len(_session_pids(proc.pid)) < processes_before_signal and time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                time.sleep(0.005)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.perf_counter() - start
    leftovers: list[int] = []
    deadline = time.monotonic() + orphan_grace
    while True:
        leftovers = [p for p in _session_pids(proc.pid) if p != proc.pid]
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for p in leftovers:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = (reader() for reader in readers)
    return CliRun(
        argv=list(argv),
        code=proc.returncode,
        stdout=(out or b"").decode("utf-8", "replace"),
        stderr=(err or b"").decode("utf-8", "replace"),
        seconds=seconds,
        timed_out=timed_out,
        leftover_pids=leftovers,
    )


def partial_leftovers(*folders: Path) -> list[Path]:
    """Temporary outputs (``*.partial``, ``*.old-*``, lock files) left in ``folders``."""
    found = []
    for folder in folders:
        folder = Path(folder)
        if folder.is_dir():
            found += [
                p for p in folder.iterdir() if ".partial" in p.name or ".old-" in p.name or p.name.endswith(".lock")
            ]
    return found


def assert_clean_failure(
    run: CliRun,
    code: int,
    *,
    contains: str | None = None,
    before: dict[str, str] | None = None,
    after: dict[str, str] | None = None,
    folders: tuple[Path, ...] = (),
) -> None:
    """Exit ``code``, one non-empty line ``profparse: ...`` on stderr, no traceback, nothing changed or left."""
    assert not run.timed_out, f"{run.argv}: did not finish in time ({run.seconds:.1f} s)"
    assert run.code == code, f"{run.argv}: exit {run.code}, expected {code}; stderr: {run.stderr!r}"
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("profparse: error:") or line.startswith("profparse: ")]
    assert "Traceback" not in run.stderr, run.stderr
    assert errors, f"{run.argv}: no 'profparse: ' message on stderr: {run.stderr!r}"
    last = lines[-1]
    assert last.startswith("profparse: ") and len(last) > len("profparse: error: "), f"empty message: {last!r}"
    if contains is not None:
        assert contains.lower() in run.stderr.lower(), f"{contains!r} not in {run.stderr!r}"
    if before is not None:
        assert after == before, "files changed"
    assert not partial_leftovers(*folders), partial_leftovers(*folders)
    assert not run.leftover_pids, f"{run.argv}: processes left behind: {run.leftover_pids}"


def assert_success(run: CliRun, *, folders: tuple[Path, ...] = ()) -> None:
    assert not run.timed_out, f"{run.argv}: did not finish in time ({run.seconds:.1f} s)"
    assert run.code == 0, f"{run.argv}: exit {run.code}; stderr: {run.stderr!r}"
    assert "Traceback" not in run.stderr, run.stderr
    assert not partial_leftovers(*folders), partial_leftovers(*folders)
    assert not run.leftover_pids, f"{run.argv}: processes left behind: {run.leftover_pids}"


def assert_time_within(bad: CliRun, good: CliRun, factor: float = 5.0, slack: float = 2.0) -> None:
    """The bad input took at most ``factor`` x the valid one of the same size (+ ``slack`` s for start-up)."""
    assert bad.seconds <= factor * good.seconds + slack, (
        f"{bad.argv}: {bad.seconds:.2f} s vs {good.seconds:.2f} s for a valid file of the same size"
    )


def start_pool_run(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start the CLI in a session of its own and return once its worker pool is starting: the parent, the
    resource tracker, the forkserver and the first worker are alive (or it ended, or 60 s passed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "profparse.cli.main", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(_session_pids(proc.pid)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return proc
