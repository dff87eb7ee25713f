"""Adversarial locks and output names (issue 25 item 1 and the ``-o newdir/`` nit).

An output's lock file ``.NAME.lock`` sits in the output's folder, where anyone who can write there may have put
something under that name first: a symbolic link to a file the runner can write, a hard link, a FIFO, a file of
another user, a file of the user's own. profparse uses only a regular file of this user with one link, writes
its pid only into a lock it created, and removes only that one. Stale temporary names are removed only when they
are names profparse generates, and only this user's own. Every run is a fresh CLI process (tests/adversarial.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from adversarial import CliRun, assert_clean_failure, assert_success, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

from profparse.base.files import MARKER, read_marker

REFUSED, USAGE = 9, 2
OTHER_UID = 54321  # a user id nobody on the test machine runs as


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """tmp/trace.json.gz (a small training trace) and tmp/keep.txt (a file of the user's own)."""
    b = TraceBuilder()
    for step in range(2):
        training_step(b, step, step * 100)
    b.write(tmp_path / "trace.json.gz")
    (tmp_path / "keep.txt").write_text("the user's own notes")
    return tmp_path


#: verb -> (argv before -o, output name); report and annotate write a file, parse and plot a folder.
VERBS = {
    "report": (["report"], "out.html"),
    "annotate": (["annotate"], "out.json.gz"),
    "parse": (["parse"], "tables"),
    "plot": (["plot", "--kind", "stages", "--format", "svg"], "plots"),
}


def run_verb(verb: str, work: Path, out: str | Path, *extra: str) -> CliRun:
    head, _ = VERBS[verb]
    return run_cli(head[0], str(work / "trace.json.gz"), *head[1:], "-o", str(out), "-q", "--no-cache", *extra)


def lock_of(work: Path, verb: str) -> Path:
    return work / f".{VERBS[verb][1]}.lock"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- what is planted under the lock's name -----------------------------------------------------------------------


@pytest.mark.parametrize("verb", list(VERBS))
def test_symlink_lock_never_truncates_its_target(work, verb):
    """A link planted at ``.NAME.lock`` made the run truncate its target to a pid (exit 0); now exit 9, untouched."""
    lock = lock_of(work, verb)
    lock.symlink_to("keep.txt")
    before = snapshot(work)
    run = run_verb(verb, work, work / VERBS[verb][1])
    assert_clean_failure(run, REFUSED, contains="lock file is a symbolic link", before=before, after=snapshot(work))
    assert str(lock) in run.stderr


def test_dangling_symlink_lock_creates_nothing(work):
    """A link to a name that does not exist made the run create that file; now nothing is created."""
    lock = lock_of(work, "report")
    lock.symlink_to(work / "created-through-the-link")
    before = snapshot(work)
    run = run_verb("report", work, work / "out.html")
    assert_clean_failure(run, REFUSED, contains="symbolic link", before=before, after=snapshot(work))
    assert not (work / "created-through-the-link").exists()


def test_hard_linked_lock_is_refused(work):
    """A hard link to the user's file at ``.NAME.lock``: truncated to a pid, then unlinked; now exit 9, untouched."""
    os.link(work / "keep.txt", lock_of(work, "report"))
    before = snapshot(work)
    run = run_verb("report", work, work / "out.html")
    assert_clean_failure(run, REFUSED, contains="2 hard links", before=before, after=snapshot(work))


def test_fifo_lock_is_refused_without_waiting(work):
    """A FIFO at ``.NAME.lock`` is never opened (it could block): exit 9 at once, the FIFO left where it was."""
    lock = lock_of(work, "annotate")
    os.mkfifo(lock)
    before = snapshot(work)
    run = run_cli("annotate", str(work / "trace.json.gz"), "-o", str(work / "out.json.gz"), "-q", timeout=60)
    assert_clean_failure(run, REFUSED, contains="a FIFO", before=before, after=snapshot(work))


def test_folder_lock_is_refused(work):
    (lock_of(work, "parse")).mkdir()
    before = snapshot(work)
    run = run_verb("parse", work, work / "tables")
    assert_clean_failure(run, REFUSED, contains="lock file is a folder", before=before, after=snapshot(work))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_lock_of_another_user_is_refused(work):
    lock = lock_of(work, "report")
    lock.write_text("")
    os.chown(lock, OTHER_UID, OTHER_UID)
    before = snapshot(work)
    run = run_verb("report", work, work / "out.html")
    assert_clean_failure(run, REFUSED, contains="belongs to another user", before=before, after=snapshot(work))
    assert lock.stat().st_uid == OTHER_UID


@pytest.mark.parametrize("verb", ["report", "parse"])
def test_planted_regular_lock_is_used_and_kept(work, verb):
    """A regular lock file of the user's own (a killed run's, or any) is locked but neither written nor removed."""
    lock = lock_of(work, verb)
    lock.write_text("not profparse's: keep me\n")
    out = work / VERBS[verb][1]
    run = run_verb(verb, work, out)
    assert_success(run)
    assert out.exists() and lock.read_text() == "not profparse's: keep me\n"


def test_stale_lock_of_a_killed_run_is_kept_and_runs_still_take_turns(work):
    """Three runs sharing a pre-existing lock (none of them created it) still serialize, and none removes it."""
    lock = lock_of(work, "parse")
    lock.write_text(f"{dead_pid()}\n")
    original = lock.read_bytes()
    out = work / "tables"
    runs: list[CliRun | None] = [None] * 3

    def one(i: int) -> None:
        runs[i] = run_verb("parse", work, out, "--force")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in runs:
        assert r is not None
        assert_success(r)
    assert read_marker(out)["verb"] == "parse" and (out / "events.parquet").read_bytes()[:4] == b"PAR1"
    assert lock.read_bytes() == original


def test_own_lock_is_removed_afterwards(work):
    assert_success(run_verb("report", work, work / "out.html"))
    assert not lock_of(work, "report").exists()


# -- stale temporary names ---------------------------------------------------------------------------------------


def test_only_generated_temporary_names_are_cleaned(work):
    """``.NAME.PID.xxxxxxxx.partial`` of a dead run is removed; names profparse never generates are not."""
    pid = dead_pid()
    ours = work / f".out.html.{pid}.a1b2_c3d.partial"  # tempfile's 8 characters: a killed run's
    ours.write_text("half a page")
    lookalikes = [
        work / f".out.html.{pid}.Backup.partial",  # 6 characters, upper case: never generated
        work / f".out.html.{pid}.my_notes_v2.partial",  # 11 characters
    ]
    for p in lookalikes:
        p.write_text("the user's")
    assert_success(run_verb("report", work, work / "out.html"))
    assert not ours.exists()
    assert all(p.read_text() == "the user's" for p in lookalikes)


def test_temporary_name_with_a_huge_number_is_not_a_pid(work):
    """A number too large for a C long in a temporary's name made the run exit 70; it is simply not ours."""
    huge = work / ".out.html.99999999999999999999.abcdefgh.partial"
    huge.write_text("the user's")
    assert_success(run_verb("report", work, work / "out.html"))
    assert huge.read_text() == "the user's"


def test_temporary_names_that_are_links_are_not_followed(work):
    pid = dead_pid()
    target = work / "elsewhere"
    target.mkdir()
    (target / MARKER).write_text('{"tool": "profparse", "verb": "parse"}')
    (target / "data.bin").write_text("x")
    link = work / f".tables.{pid}.abcdefgh.partial"
    link.symlink_to(target)
    before = snapshot(target)
    assert_success(run_verb("parse", work, work / "tables"))
    assert link.is_symlink() and snapshot(target) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_temporary_names_of_another_user_are_kept(work):
    pid = dead_pid()
    theirs = work / f".out.html.{pid}.abcdefgh.partial"
    theirs.write_text("another user's")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert_success(run_verb("report", work, work / "out.html"))
    assert theirs.read_text() == "another user's"


# -- -o newdir/ ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["report", "annotate"])
@pytest.mark.parametrize("suffix", ["/", "/."])
def test_file_output_ending_in_slash_is_a_usage_error(work, verb, suffix):
    """``report -o newdir/`` wrote a file named ``newdir``; a file output named as a folder is now exit 2."""
    before = snapshot(work)
    run = run_verb(verb, work, f"{work / 'newdir'}{suffix}")
    assert_clean_failure(run, USAGE, contains="names a folder", before=before, after=snapshot(work))
    assert not (work / "newdir").exists()


@pytest.mark.parametrize("verb", ["parse", "plot"])
def test_folder_output_ending_in_slash_is_that_folder(work, verb):
    run = run_verb(verb, work, f"{work / 'newdir'}/")
    assert_success(run, folders=(work,))
    assert (work / "newdir").is_dir() and read_marker(work / "newdir")["verb"] == verb
