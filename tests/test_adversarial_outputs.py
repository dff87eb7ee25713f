"""Adversarial outputs (issue 11 points 1, 7, 8 and 10): what ``-o`` may name, full disks, odd stdouts, races.

Every run is a fresh CLI process (tests/adversarial.py); each case checks the exit code, the one-line message,
that the inputs and every other file are untouched (a snapshot before and after), and that nothing is left
(no ``.partial`` folder, no lock file, no process).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from adversarial import (
    REPO,
    CliRun,
    assert_clean_failure,
    assert_success,
    partial_leftovers,
    run_cli,
    snapshot,
)
from tracebuilder import TraceBuilder, training_step

from profparse.base import files
from profparse.base.files import MARKER, read_marker

REFUSED, EXISTS, NO_SPACE, CANNOT_WRITE, USAGE, NOT_FOUND = 9, 6, 10, 11, 2, 3


def build_trace(path: Path, steps: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    b = TraceBuilder()
    for step in range(steps):
        training_step(b, step, step * 100)
    return b.write(path)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """tmp/data/in/trace.json.gz and tmp/data/ranks/rank{0,1}.json.gz, and an unrelated file beside them."""
    data = tmp_path / "data"
    build_trace(data / "in" / "trace.json.gz")
    (data / "in" / "notes.txt").write_text("the user's own notes")
    for rank in range(2):
        build_trace(data / "ranks" / f"rank{rank}.json.gz")
    return tmp_path


def no_leftovers(*folders: Path) -> None:
    """No temporary output and no lock file in ``folders``."""
    assert not partial_leftovers(*folders), partial_leftovers(*folders)
    for folder in folders:
        locks = [p.name for p in Path(folder).iterdir() if p.name.endswith(".lock")]
        assert not locks, locks


def verb_args(verb: str, work: Path) -> list[str]:
    trace = work / "data" / "in" / "trace.json.gz"
    return {
        "parse": ["parse", str(trace)],
        "plot": ["plot", str(trace), "--kind", "stages", "--format", "svg"],
        "annotate": ["annotate", str(trace)],
        "parse-ranks": ["parse", str(work / "data" / "ranks"), "-j", "1"],
        "parse-ranks-pool": ["parse", str(work / "data" / "ranks"), "-j", "2"],  # ranks in worker processes
    }[verb]


# -- 1. data loss: -o that holds an input, the current folder, a folder profparse did not write --------------------


@pytest.mark.parametrize("verb", ["parse", "plot"])
@pytest.mark.parametrize("where", ["input folder", "its parent", "an ancestor"])
@pytest.mark.parametrize("force", [False, True])
def test_output_holding_the_input_is_refused(work, verb, where, force):
    target = {
        "input folder": work / "data" / "in",
        "its parent": work / "data",
        "an ancestor": work,
    }[where]
    before = snapshot(work)
    run = run_cli(*verb_args(verb, work), "-o", str(target), "-q", *(["--force"] if force else []))
    assert_clean_failure(run, REFUSED, contains="holds the input", before=before, after=snapshot(work))
    no_leftovers(work, work / "data", work / "data" / "in")


@pytest.mark.parametrize("force", [False, True])
def test_rank_folder_itself_is_refused(work, force):
    ranks = work / "data" / "ranks"
    before = snapshot(work)
    run = run_cli(*verb_args("parse-ranks", work), "-o", str(ranks), "-q", *(["--force"] if force else []))
    assert_clean_failure(run, REFUSED, contains="is the input folder", before=before, after=snapshot(work))
    no_leftovers(work / "data", ranks)


@pytest.mark.parametrize("verb", ["parse", "plot"])
def test_dot_with_force_is_refused(work, verb):
    """``-o .`` names the folder the run is in: refused wherever that is, input inside or not."""
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x")
    for cwd in (work / "data" / "in", elsewhere):
        before = snapshot(work)
        run = run_cli(*verb_args(verb, work), "-o", ".", "--force", "-q", cwd=cwd)
        assert_clean_failure(run, REFUSED, contains="current folder", before=before, after=snapshot(work))
        no_leftovers(cwd, cwd.parent)
    before = snapshot(work)
    run = run_cli(*verb_args(verb, work), "-o", "..", "--force", "-q", cwd=elsewhere)
    assert_clean_failure(run, REFUSED, contains="holds the current folder", before=before, after=snapshot(work))


@pytest.mark.parametrize("verb", ["parse", "plot"])
def test_folder_profparse_did_not_write_is_never_replaced(work, verb):
    mine = work / "mine"
    (mine / "deep").mkdir(parents=True)
    (mine / "deep" / "thesis.tex").write_text("months of work")
    before = snapshot(work)
    for force in ([], ["--force"]):
        run = run_cli(*verb_args(verb, work), "-o", str(mine), "-q", *force)
        assert_clean_failure(run, REFUSED, contains="did not write", before=before, after=snapshot(work))
    no_leftovers(work)


def test_other_verbs_output_is_not_replaced(work):
    """A plot folder is profparse's, but not parse's: parse --force does not replace it."""
    plots = work / "plots"
    assert_success(run_cli(*verb_args("plot", work), "-o", str(plots), "-q"), folders=(work,))
    assert read_marker(plots)["verb"] == "plot"
    before = snapshot(work)
    run = run_cli(*verb_args("parse", work), "-o", str(plots), "--force", "-q")
    assert_clean_failure(run, REFUSED, contains="'profparse plot'", before=before, after=snapshot(work))


def test_own_output_is_replaced_with_force_only(work):
    out = work / "tables"
    assert_success(run_cli(*verb_args("parse", work), "-o", str(out), "-q"), folders=(work,))
    marker = read_marker(out)
    assert marker["tool"] == "profparse" and marker["verb"] == "parse" and marker["version"]
    (out / "events.parquet").write_bytes(b"stale")
    before = snapshot(work)
    run = run_cli(*verb_args("parse", work), "-o", str(out), "-q")
    assert_clean_failure(run, EXISTS, contains="--force", before=before, after=snapshot(work))
    assert_success(run_cli(*verb_args("parse", work), "-o", str(out), "-q", "--force"), folders=(work,))
    assert (out / "events.parquet").read_bytes()[:4] == b"PAR1"  # replaced by a real table
    assert snapshot(work / "data") == {k: v for k, v in before.items() if k.startswith(str(work / "data"))}
    no_leftovers(work)


def test_empty_folder_is_used_without_force(work):
    out = work / "made-by-mkdir"
    out.mkdir()
    assert_success(run_cli(*verb_args("parse", work), "-o", str(out), "-q"), folders=(work,))
    assert (out / "events.parquet").is_file() and read_marker(out)["verb"] == "parse"


def test_plot_kind_force_replaces_only_its_plots(work):
    """Issue 10: ``plot --kind X --force`` rewrites X's files and keeps the other plots (and other files)."""
    out = work / "plots"
    trace = str(work / "data" / "in" / "trace.json.gz")
    assert_success(run_cli("plot", trace, "-o", str(out), "--kind", "stages", "--kind", "timeline", "-q"))
    (out / "README.txt").write_text("my caption")
    kept = {name: (out / name).read_bytes() for name in ("timeline.png", "timeline.svg", "README.txt")}
    old_stages = (out / "stages.svg").stat().st_ino
    run = run_cli("plot", trace, "-o", str(out), "--kind", "stages", "--format", "svg", "--force", "-q")
    assert_success(run, folders=(work,))
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MARKER, "README.txt", "stages.png", "stages.svg", "timeline.png", "timeline.svg"])
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert (out / "stages.svg").stat().st_ino != old_stages  # this one was rewritten
    no_leftovers(work)


def _special_targets(tmp: Path) -> dict[str, Path]:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    (tmp / "link-null").symlink_to("/dev/null")
    (tmp / "realdir").mkdir()
    (tmp / "link-dir").symlink_to(tmp / "realdir")
    (tmp / "regular.txt").write_text("keep")
    (tmp / "link-file").symlink_to(tmp / "regular.txt")
    return {
        "/dev/null": Path("/dev/null"),
        "fifo": fifo,
        "socket": sock_path,
        "link to /dev/null": tmp / "link-null",
        "link to a folder": tmp / "link-dir",
        "link to a file": tmp / "link-file",
    }


KIND_WORDS = {
    "/dev/null": "character device",
    "fifo": "FIFO",
    "socket": "socket",
    "link to /dev/null": "symbolic link",
    "link to a folder": "symbolic link",
    "link to a file": "symbolic link",
}


@pytest.mark.parametrize("verb", ["parse", "plot", "annotate"])
def test_devices_fifos_sockets_links_are_refused(work, verb):
    odd = work / "odd"
    odd.mkdir()
    targets = _special_targets(odd)
    null_before = os.stat("/dev/null")
    for name, target in targets.items():
        for force in ([], ["--force"]):
            before = snapshot(work)
            run = run_cli(*verb_args(verb, work), "-o", str(target), "-q", *force, timeout=60)
            assert_clean_failure(run, REFUSED, contains=KIND_WORDS[name], before=before, after=snapshot(work))
    null_after = os.stat("/dev/null")
    assert stat.S_ISCHR(null_after.st_mode) and null_after.st_rdev == null_before.st_rdev
    assert stat.S_ISFIFO(os.lstat(targets["fifo"]).st_mode) and stat.S_ISSOCK(os.lstat(targets["socket"]).st_mode)
    no_leftovers(odd)


def test_annotate_refuses_the_input_its_hard_link_and_folders(work):
    trace = work / "data" / "in" / "trace.json.gz"
    twin = work / "twin.json.gz"
    os.link(trace, twin)
    before = snapshot(work)
    for target, words in ((trace, "is the input"), (twin, "is the input"), (work / "data", "is a folder")):
        run = run_cli("annotate", str(trace), "-o", str(target), "--force", "-q")
        assert_clean_failure(run, REFUSED, contains=words, before=before, after=snapshot(work))
    no_leftovers(work, work / "data" / "in")


def test_annotate_replaces_a_regular_file_with_force(work):
    out = work / "old.json.gz"
    out.write_bytes(b"an older annotated trace")
    trace = str(work / "data" / "in" / "trace.json.gz")
    assert_clean_failure(run_cli("annotate", trace, "-o", str(out), "-q"), EXISTS, contains="--force")
    assert_success(run_cli("annotate", trace, "-o", str(out), "-q", "--force"), folders=(work,))
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    no_leftovers(work)


def test_leftovers_of_a_killed_run_are_cleaned(work):
    """A run killed mid-write leaves ``.NAME.PID.xxxxxx.partial``: the next run to that output removes it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = work / "tables"
    stale_dir = work / f".tables.{dead.pid}.abcdefgh.partial"
    stale_dir.mkdir()
    (stale_dir / MARKER).write_text('{"tool": "profparse", "verb": "parse"}')
    (stale_dir / "events.parquet").write_bytes(b"half")
    (work / ".tables.lock").write_text(f"{dead.pid}\n")  # a lock file nobody holds, which this run did not create
    foreign = work / f".tables.{os.getpid()}.abcdefgh.partial"  # a live process's: kept
    foreign.mkdir()
    assert_success(run_cli(*verb_args("parse", work), "-o", str(out), "-q"))
    assert not stale_dir.exists() and (work / ".tables.lock").read_text() == f"{dead.pid}\n"  # used, kept as is
    assert foreign.is_dir()
    foreign.rmdir()


# -- 7. concurrent writers ---------------------------------------------------------------------------------------


def _together(argvs: list[list[str]]) -> list[CliRun]:
    runs: list[CliRun | None] = [None] * len(argvs)

    def one(i: int) -> None:
        runs[i] = run_cli(*argvs[i], timeout=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(argvs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs  # type: ignore[return-value]


def test_three_runs_to_one_output_wait_for_each_other(work):
    """Started together: they run one after the other; the first writes, the later two find it and exit 6."""
    out = work / "tables"
    runs = _together([[*verb_args("parse", work), "-o", str(out), "-q"]] * 3)
    codes = sorted(r.code for r in runs)
    assert codes == [0, EXISTS, EXISTS], [(r.code, r.stderr) for r in runs]
    for r in runs:
        if r.code == 0:
            assert_success(r)
        else:
            assert_clean_failure(r, EXISTS, contains="already exists")
    assert read_marker(out)["verb"] == "parse" and (out / "events.parquet").read_bytes()[:4] == b"PAR1"
    no_leftovers(work)


def test_three_forced_runs_each_write_a_whole_output(work):
    out = work / "tables"
    runs = _together([[*verb_args("parse", work), "-o", str(out), "-q", "--force"]] * 3)
    for r in runs:
        assert_success(r, folders=(work,))
    from profparse.outputs.parquet import read_parquet

    tables = read_parquet(out)
    assert {"events", "kernels", "ops", "stage_summary"} <= set(tables) and len(tables["events"]) > 0
    no_leftovers(work)


def _someone_waits_on(path: Path) -> bool:
    """Whether /proc/locks lists a process blocked on a lock of ``path`` (its lines start with ``->``)."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and any(f.endswith(f":{inode}") for f in fields):
            return True
    return False


def test_a_run_waits_for_the_lock_and_says_so(work):
    out = work / "tables"
    result: list[CliRun] = []
    if not Path("/proc/locks").exists():
        pytest.skip("no /proc/locks")
    with files.output_lock(out) as lock:
        thread = threading.Thread(target=lambda: result.append(run_cli(*verb_args("parse", work), "-o", str(out))))
        thread.start()
        deadline = time.monotonic() + 120
        while not _someone_waits_on(lock) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _someone_waits_on(lock), "the run did not wait for the lock"
        assert not out.exists()  # it cannot write while the lock is held
    thread.join(timeout=120)
    (run,) = result
    assert_success(run, folders=(work,))
    assert "is writing it; waiting for it" in run.stderr
    assert (out / "events.parquet").is_file()
    no_leftovers(work)


# -- 8. disk full, numeric options, long names, stdout -----------------------------------------------------------


def _tmpfs(mnt: Path, options: str):
    """Mount a tmpfs with ``options`` at ``mnt`` (needs root and mount; the test is skipped elsewhere)."""
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 64 KiB tmpfs."""
    yield from _tmpfs(tmp_path / "full", "size=64k")


@pytest.fixture
def read_only(tmp_path: Path):
    yield from _tmpfs(tmp_path / "ro", "ro,size=64k")


@pytest.mark.parametrize("verb", ["parse", "annotate"])
def test_read_only_file_system_is_exit_11(work, read_only, verb):
    target = read_only / ("out.json.gz" if verb == "annotate" else "out")
    before = snapshot(work / "data")
    run = run_cli(*verb_args(verb, work), "-o", str(target), "-q")
    assert_clean_failure(
        run, CANNOT_WRITE, contains="read-only file system", before=before, after=snapshot(work / "data")
    )


SAMPLE = REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"  # 73k events: its outputs are over 64 KiB


@pytest.mark.parametrize("verb", ["parse", "plot", "annotate", "parse-ranks", "parse-ranks-pool"])
def test_disk_full_is_exit_10_and_leaves_nothing(work, full_disk, verb):
    if not SAMPLE.is_file():
        pytest.skip("sample_traces/ not present")
    for path in (work / "data" / "in" / "trace.json.gz", work / "data" / "ranks" / "rank1.json.gz"):
        shutil.copyfile(SAMPLE, path)
    target = full_disk / ("out.json.gz" if verb == "annotate" else "out")
    before = snapshot(work / "data")
    run = run_cli(*verb_args(verb, work), "-o", str(target), "-q")
    after = snapshot(work / "data")
    assert_clean_failure(run, NO_SPACE, contains="no space left on device", before=before, after=after)
    message = run.stderr.strip().splitlines()[-1]
    assert "trace.json.gz" not in message and "rank1" not in message  # the input is not blamed
    assert sorted(p.name for p in full_disk.iterdir()) == []  # no partial output, no lock


def test_stdout_to_dev_full_is_exit_10(work):
    trace = str(work / "data" / "in" / "trace.json.gz")
    with open("/dev/full", "w") as full:
        run = run_cli("summarize", trace, stdout=full.fileno())
    assert_clean_failure(run, NO_SPACE, contains="standard output: no space left on device")
    assert len(run.stderr.strip().splitlines()) == 1


def _run_with_stdout_closed(*argv: str) -> CliRun:
    """Like run_cli, with file descriptor 1 closed in the child (``>&-``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("PROFPARSE_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "profparse.cli.main", *argv],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: os.close(1),
        timeout=120,
    )
    return CliRun(list(argv), proc.returncode, "", proc.stderr.decode(errors="replace"), 0.0)


def test_closed_stdout(work):
    trace = str(work / "data" / "in" / "trace.json.gz")
    run = _run_with_stdout_closed("summarize", trace)
    assert_clean_failure(run, CANNOT_WRITE, contains="standard output is closed")
    assert len(run.stderr.strip().splitlines()) == 1
    out = work / "tables"  # a verb whose result is files needs no stdout
    run = _run_with_stdout_closed("parse", trace, "-o", str(out), "-q")
    assert run.code == 0 and run.stderr == ""
    tables = [p for p in out.iterdir() if p.name != MARKER]
    assert tables and all(p.suffix == ".parquet" for p in tables)
    for p in tables:  # nothing meant for stdout landed in a file that took the closed descriptor
        data = p.read_bytes()
        assert data[:4] == b"PAR1" and data[-4:] == b"PAR1", p


BAD_NUMBERS = [
    ("plot", "--dpi", "0"),
    ("plot", "--dpi", "-120"),
    ("plot", "--dpi", "1000000"),
    ("plot", "--dpi", "abc"),
    ("summarize", "--top", "-1"),
    ("summarize", "--top", "1.5"),
    ("diff", "--top", "-3"),
    ("parse", "--jobs", "0"),
    ("parse", "--jobs", "-2"),
    ("summarize", "--jobs", "0"),
    ("hta", "--kernel-delay", "-1"),
]


@pytest.mark.parametrize(("verb", "option", "value"), BAD_NUMBERS)
def test_numeric_options_are_checked_by_the_parser(work, verb, option, value):
    trace = str(work / "data" / "in" / "trace.json.gz")
    args = {"diff": ["diff", trace, trace], "parse": ["parse", trace, "-o", str(work / "out")]}.get(verb, [verb, trace])
    if verb == "plot":
        args += ["-o", str(work / "out")]
    before = snapshot(work)
    run = run_cli(*args, option, value)
    assert_clean_failure(run, USAGE, contains=option, before=before, after=snapshot(work))
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == ""
    assert not (work / "out").exists()


def test_empty_output_path_is_a_usage_error(work):
    run = run_cli(*verb_args("parse", work), "-o", "")
    assert_clean_failure(run, USAGE, contains="empty")


@pytest.mark.parametrize("verb", ["parse", "plot", "annotate"])
def test_output_name_over_255_bytes(work, verb):
    long_name = "é" * 130  # 260 bytes in UTF-8
    before = snapshot(work)
    run = run_cli(*verb_args(verb, work), "-o", str(work / long_name), "-q")
    assert_clean_failure(run, CANNOT_WRITE, contains="file name too long", before=before, after=snapshot(work))
    no_leftovers(work)


def test_output_name_of_250_bytes_works(work):
    """The lock and temporary names beside it are shortened, so a long but legal name still works."""
    name = "o" * 250
    assert_success(run_cli(*verb_args("parse", work), "-o", str(work / name), "-q"), folders=(work,))
    assert (work / name / "events.parquet").is_file()
    no_leftovers(work)


def test_input_name_over_255_bytes(work):
    run = run_cli("summarize", str(work / ("x" * 300 + ".json")))
    assert_clean_failure(run, NOT_FOUND, contains="file name too long")


def test_output_under_a_file_or_unwritable(work):
    (work / "plain").write_text("a file")
    before = snapshot(work)
    run = run_cli(*verb_args("parse", work), "-o", str(work / "plain" / "out"), "-q")
    assert_clean_failure(run, CANNOT_WRITE, contains="not a directory", before=before, after=snapshot(work))
    if os.geteuid() != 0:  # root writes anywhere
        locked = work / "locked"
        locked.mkdir(mode=0o500)
        run = run_cli(*verb_args("parse", work), "-o", str(locked / "out"), "-q")
        assert_clean_failure(run, CANNOT_WRITE, contains="permission denied")


def test_ctrl_c_while_waiting_for_the_lock(work):
    """A run waiting for another's lock stops on Ctrl-C: exit 130, one line, nothing written, the lock intact."""
    if not Path("/proc/locks").exists():
        pytest.skip("no /proc/locks")
    out = work / "tables"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with files.output_lock(out) as lock:
        proc = subprocess.Popen(
            [sys.executable, "-m", "profparse.cli.main", *verb_args("parse", work), "-o", str(out)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        deadline = time.monotonic() + 120
        while not _someone_waits_on(lock) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _someone_waits_on(lock), "the run did not wait for the lock"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        run = CliRun([], proc.returncode, "", err.decode(errors="replace"), 0.0)
        assert_clean_failure(run, 130, contains="interrupted")
        assert lock.exists() and not out.exists()  # the holder's lock is not touched by the waiter
    no_leftovers(work)


def test_output_inside_the_input_folder_is_allowed(work):
    """Only folders that hold an input are refused: one inside the rank folder is fine, and replaced with --force."""
    ranks = work / "data" / "ranks"
    out = ranks / "parsed"
    before = snapshot(*sorted(ranks.glob("*.json.gz")))
    for force in ([], ["--force"]):
        assert_success(run_cli(*verb_args("parse-ranks", work), "-o", str(out), "-q", *force), folders=(ranks,))
        assert read_marker(out)["verb"] == "parse" and (out / "ranks").is_dir()
    assert snapshot(*sorted(ranks.glob("*.json.gz"))) == before
    no_leftovers(ranks)
