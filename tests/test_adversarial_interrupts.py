"""Ctrl-C at any moment, from the first import to the last write: exit 130, one line, nothing left behind."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from adversarial import assert_clean_failure, assert_success, run_cli, snapshot
from conftest import SAMPLE_TRACES

TRACE = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"


def _before_profparse(stderr: str) -> bool:
    """Nothing printed, or only Python's traceback of an interrupt in runpy's frames (no profparse line ran)."""
    if not stderr:
        return True
    frames = [line for line in stderr.splitlines() if line.strip().startswith("File ")]
    return stderr.rstrip().endswith("KeyboardInterrupt") and all("<frozen " in line for line in frames)


@pytest.mark.parametrize("verb", ["summarize", "parse"])
def test_ctrl_c_at_any_moment(tmp_path: Path, verb: str) -> None:
    if not TRACE.is_file():
        pytest.skip(f"{TRACE} not present")
    out = tmp_path / "out"
    # --no-cache: every run does the whole run's work (a cached second run ends long before 75 % of the first)
    argv = [verb, str(TRACE), "--no-cache"] + (["-o", str(out), "-q"] if verb == "parse" else [])
    whole = run_cli(*argv, fresh=True)  # timed as the signalled runs below start: in a plain interpreter
    assert_success(whole, folders=(tmp_path,))
    before = snapshot(TRACE)
    # from the modules' loading to the end of the work, as shares of a whole run's time. A signal in the
    # interpreter's own start-up, before profparse's first line runs, is Python's: it ends the process by the
    # signal (exit -2, nothing written; at most a KeyboardInterrupt traceback of runpy's frames alone, when it
    # lands between the imports of the packages), which is skipped below.
    for share in (0.08, 0.15, 0.3, 0.5, 0.75):
        if out.exists():
            shutil.rmtree(out)
        run = run_cli(*argv, signal_after=(share * whole.seconds, signal.SIGINT))
        if run.code == 0:  # the work was done before the signal took effect (a run can be faster than the
            assert_success(run, folders=(tmp_path,))  # measured one, or be past main() when it comes): whole
            assert verb != "parse" or (out / "events.parquet").is_file()
            continue
        if run.code == -signal.SIGINT and _before_profparse(run.stderr) and not out.exists():  # Python's start-up
            continue
        after = snapshot(TRACE)
        assert_clean_failure(run, 130, contains="interrupted", before=before, after=after, folders=(tmp_path,))
        assert not out.exists(), f"Ctrl-C at {share:.0%} left {out}"


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_sigterm_leaves_nothing_half_written(tmp_path: Path, share: float) -> None:
    if not TRACE.is_file():
        pytest.skip(f"{TRACE} not present")
    out = tmp_path / "out"
    argv = ["parse", str(TRACE), "-o", str(out), "-q", "--no-cache"]
    whole = run_cli(*argv, fresh=True)  # timed as the signalled runs below start: in a plain interpreter
    assert_success(whole, folders=(tmp_path,))
    shutil.rmtree(out)
    run = run_cli(*argv, signal_after=(share * whole.seconds, signal.SIGTERM))
    if run.code == 0:  # the work was done before the signal took effect (a run can be faster than the measured
        assert_success(run, folders=(tmp_path,))  # one, or end between the wait and the signal): then it is whole
        assert (out / "events.parquet").is_file()
        return
    assert_clean_failure(run, 143, contains="terminated", folders=(tmp_path,))
    assert not out.exists()


def test_error_lines_escape_control_characters(tmp_path: Path) -> None:
    missing = tmp_path / "trace\x1b[31mred\x07.json"
    run = run_cli("summarize", str(missing))
    assert_clean_failure(run, 3)
    assert "\x1b" not in run.stderr and "\x07" not in run.stderr and "\\x1b[31mred\\x07" in run.stderr


_LOST_SIGNAL = """
import signal, sys, time, weakref
from profparse.cli import main, summarize_cmd

def run(args):
    class Held:
        pass

    def raises(ref, error=ValueError if sys.argv[1] == "plain" else KeyboardInterrupt):
        raise error("in a callback")

    if sys.argv[1] != "plain":
        main._signalled = signal.SIGINT  # as the handler does when the Ctrl-C arrives
    held = Held()
    ref = weakref.ref(held, raises)
    del held  # the callback's exception is one Python ignores, as a Ctrl-C landing in the import system's
    time.sleep(3)
    return 0

def mine(signum, frame):
    pass

signal.signal(signal.SIGALRM, mine)  # a program's own: back after main
summarize_cmd.run = run
code = main.main(["summarize", "trace.json"])
print(signal.getsignal(signal.SIGALRM) is mine, sys.unraisablehook is sys.__unraisablehook__)
sys.exit(code)
"""


@pytest.mark.parametrize("kind", ["signal", "plain"])
def test_a_signal_lost_in_a_callback_is_raised_again(tmp_path: Path, kind: str) -> None:
    """A Ctrl-C that lands in code whose exceptions Python ignores (a weakref callback of the import system: seen
    in a CI run) was lost, with "Exception ignored" and a traceback on stderr, and the run went on to exit 0. It
    is raised again a moment later: the run ends as any Ctrl-C does. Another ignored exception is Python's to print.
    Either way the program's own SIGALRM handler and Python's hook are back after ``main``."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOST_SIGNAL, kind], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    if kind == "signal":
        assert proc.returncode == 130, proc.stderr
        assert proc.stderr.strip() == "profparse: interrupted", proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert "Exception ignored" in proc.stderr and "ValueError: in a callback" in proc.stderr
    assert proc.stdout.split() == ["True", "True"]
