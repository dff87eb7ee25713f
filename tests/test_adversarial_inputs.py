"""Adversarial inputs for the reader, each generated at several sizes and run through the CLI in a fresh process.

Each case asserts its documented exit code (docs/exit-codes.md), one ``profparse:`` line and no traceback, nothing
left behind (no ``.partial``, no process), the input unchanged, and a time within 5x + 2 s of a valid file of the
same size measured in the same test: a reader that retries at every event boundary after one bad byte is
quadratic and fails that bound from 1-2 MB on. What the reader recovered is checked in-process on the same files.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from adversarial import CliRun, assert_clean_failure, assert_success, assert_time_within, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

from profparse.base.arrays import as_text
from profparse.base.errors import OutOfMemoryError, TraceFormatError
from profparse.trace.events import read_trace

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc, FIFOs and rlimits (Linux)")

SIZES_MB = [0.5, 1, 2, 4]


def event_lines(size: int, seed: int = 0) -> list[str]:
    """Kineto-like complete events, about ``size`` bytes of JSON in all."""
    rng = random.Random(seed)
    lines, total, i = [], 0, 0
    while total < size:
        event = {
            "ph": "X", "cat": rng.choice(["cpu_op", "cuda_runtime", "kernel"]), "name": f"aten::op{i % 97}",
            "pid": 1, "tid": 100, "ts": 1_700_000_000_000 + i * 10, "dur": 5 + i % 7,
            "args": {"External id": i, "Sequence number": i, "correlation": i},
        }  # fmt: skip
        lines.append(json.dumps(event))
        total += len(lines[-1]) + 2
        i += 1
    return lines


def document(lines: list[str]) -> str:
    return '{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(lines) + '\n], "traceName": "adversarial"}'


def valid_text(mb: float) -> str:
    return document(event_lines(int(mb * (1 << 20))))


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def run_pair(bad: Path) -> tuple[CliRun, dict, dict]:
    """Run ``summarize`` on the bad input; snapshots of it before and after."""
    before = snapshot(bad)
    bad_run = run_cli("summarize", str(bad))
    return bad_run, before, snapshot(bad)


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, CliRun]]:
    """``valid(mb, gzipped=False)``: the valid file of that size and its ``summarize`` run, made once per test
    file (pytest-xdist's loadfile gives a file to one worker): every case of the size compares its time with it."""
    folder = tmp_path_factory.mktemp("valid")
    made: dict[tuple[float, bool], tuple[Path, CliRun]] = {}

    def get(mb: float, gzipped: bool = False) -> tuple[Path, CliRun]:
        if (mb, gzipped) not in made:
            text = valid_text(mb)
            name = f"valid-{mb}.json" + (".gz" if gzipped else "")
            path = write(folder, name, gzip.compress(text.encode(), mtime=0) if gzipped else text)
            run = run_cli("summarize", str(path))
            assert_success(run, folders=(folder,))
            made[(mb, gzipped)] = (path, run)
        return made[(mb, gzipped)]

    return get


def assert_recovered(bad_run: CliRun, good_run: CliRun, tmp_path: Path, warning: str) -> None:
    """Exit 0 with a warning, in bounded time, nothing left behind."""
    assert_success(bad_run, folders=(tmp_path,))
    assert warning.lower() in bad_run.stderr.lower(), bad_run.stderr
    assert_time_within(bad_run, good_run)


# -- one bad byte or token: skipped in linear time, the rest recovered ------------------------------------------


@pytest.mark.parametrize("mb", SIZES_MB)
def test_missing_colon(tmp_path, mb, valid):
    text = valid_text(mb)
    at = text.index('"pid": 1', len(text) // 2)
    bad = write(tmp_path, "nocolon.json", text[:at] + '"pid" 1' + text[at + len('"pid": 1') :])
    good, good_run = valid(mb)
    bad_run, before, after = run_pair(bad)
    assert_recovered(bad_run, good_run, tmp_path, "malformed JSON")
    assert before == after
    raw, full = read_trace(bad), read_trace(good)
    assert len(raw.events) == len(full.events) - 1  # exactly the broken event is lost
    assert raw.report.dropped == {"malformed JSON (skipped to the next event)": 1}


@pytest.mark.parametrize("mb", SIZES_MB)
def test_non_utf8_bytes(tmp_path, mb, valid):
    text = valid_text(mb)
    data = bytearray(text.encode())
    rng = random.Random(5)
    spots = sorted(rng.sample(range(len(data) // 4, len(data) - 100), 5))
    for spot in spots:  # inside a name: the events stay structurally whole
        at = data.index(b'"aten::op', spot) + 2
        data[at] = 0xFF
    bad = write(tmp_path, "nonutf8.json", bytes(data))
    good, good_run = valid(mb)
    bad_run, _, _ = run_pair(bad)
    assert_recovered(bad_run, good_run, tmp_path, "malformed JSON")
    raw, full = read_trace(bad), read_trace(good)
    lost = len(full.events) - len(raw.events)
    assert lost == raw.report.dropped["malformed JSON (skipped to the next event)"] and 1 <= lost <= 5


@pytest.mark.parametrize("mb", SIZES_MB)
def test_nan_tokens(tmp_path, mb, valid):
    lines = event_lines(int(mb * (1 << 20)))
    nan = {i for i in range(0, len(lines), 10)}
    for i in nan:  # what Python's json.dumps writes for float('nan')
        lines[i] = lines[i].replace('"dur": ', '"dur": NaN, "x": ', 1)
    bad = write(tmp_path, "nan.json", document(lines))
    good, good_run = valid(mb)
    bad_run, _, _ = run_pair(bad)
    assert_recovered(bad_run, good_run, tmp_path, "non-finite")
    raw = read_trace(bad)
    assert len(raw.events) == len(lines) - len(nan)  # each event with a NaN dur is dropped, the others kept
    assert raw.report.nonfinite_values == len(nan)


@pytest.mark.parametrize("mb", SIZES_MB)
def test_name_full_of_event_boundaries(tmp_path, mb, valid):
    size = int(mb * (1 << 20))
    lines = event_lines(size // 2)
    hostile = {"ph": "X", "cat": "cpu_op", "name": "},{" * (size // 6), "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    lines.insert(len(lines) // 2, json.dumps(hostile))
    bad = write(tmp_path, "braces.json", document(lines))
    good, good_run = valid(mb)
    bad_run, _, _ = run_pair(bad)
    assert_success(bad_run, folders=(tmp_path,))
    assert_time_within(bad_run, good_run)
    raw = read_trace(bad)
    assert len(raw.events) == len(lines) and not raw.report.dropped  # a valid file: nothing lost
    assert hostile["name"] in set(as_text(raw.events["name"]))  # (astype(str): pandas 2 makes every name 0.5 MB)


@pytest.mark.parametrize("mb", SIZES_MB)
def test_twenty_flipped_bits_in_gzip(tmp_path, mb, valid):
    text = valid_text(mb)
    data = bytearray(gzip.compress(text.encode()))
    rng = random.Random(20)
    for _ in range(20):
        data[rng.randrange(10, len(data))] ^= 1 << rng.randrange(8)
    bad = write(tmp_path, "flipped.json.gz", bytes(data))
    good, good_run = valid(mb, gzipped=True)
    bad_run, before, after = run_pair(bad)
    # inflate's checks (or, first, the garbage it inflated): "corrupt compressed data" / "... corrupt file"
    assert_clean_failure(bad_run, 4, contains="corrupt", before=before, after=after, folders=(tmp_path,))
    assert_time_within(bad_run, good_run)


@pytest.mark.parametrize("mb", SIZES_MB)
def test_garbage_after_the_header_is_an_error(tmp_path, mb, valid):
    rng = random.Random(3)
    garbage = bytes(rng.choice(b'abc{}[],:"0 \n') for _ in range(int(mb * (1 << 20))))
    bad = write(tmp_path, "garbage.json", b'{"traceEvents": [' + garbage + b"]}")
    good, good_run = valid(mb)
    bad_run, before, after = run_pair(bad)
    assert_clean_failure(bad_run, 4, contains="malformed JSON", before=before, after=after, folders=(tmp_path,))
    assert_time_within(bad_run, good_run)


# -- recovery gaps: cut .json.gz, document + junk, whitespace --------------------------------------------------


@pytest.mark.parametrize("mb", SIZES_MB)
def test_cut_json_gz_recovers_the_events_before_the_cut(tmp_path, mb, valid):
    text = valid_text(mb)
    data = gzip.compress(text.encode())
    bad = write(tmp_path, "cut.json.gz", data[: len(data) * 2 // 3])
    good, good_run = valid(mb, gzipped=True)
    bad_run, _, _ = run_pair(bad)
    assert_recovered(bad_run, good_run, tmp_path, "truncated")
    inflated = zlib.decompressobj(31).decompress(bad.read_bytes())
    complete = inflated[: inflated.rfind(b"},\n") + 1].count(b'"ph": "X"')  # one per event line
    raw = read_trace(bad)
    assert raw.report.truncated and len(raw.events) == complete > 0


@pytest.mark.parametrize("mb", SIZES_MB)
def test_document_followed_by_junk_loses_no_event(tmp_path, mb, valid):
    text = valid_text(mb)
    bad = write(tmp_path, "junk.json", text + "\n]} garbage {\n")
    good, good_run = valid(mb)
    bad_run, _, _ = run_pair(bad)
    assert_recovered(bad_run, good_run, tmp_path, "ignored")
    assert "truncated" not in bad_run.stderr
    raw, full = read_trace(bad), read_trace(good)
    assert not raw.report.truncated and raw.events.equals(full.events)
    assert raw.header["traceName"] == "adversarial" and raw.report.trailing_bytes == len("]} garbage {")


@pytest.mark.parametrize("mb", SIZES_MB)
def test_whitespace_bomb(tmp_path, mb, valid):
    size = int(mb * (1 << 20))
    only = write(tmp_path, "ws.json", b" \n\t" * (size // 3))
    good, good_run = valid(mb)
    bad_run, before, after = run_pair(only)
    assert_clean_failure(bad_run, 4, contains="only whitespace", before=before, after=after, folders=(tmp_path,))
    assert "empty" not in bad_run.stderr
    assert_time_within(bad_run, good_run)
    padded = write(tmp_path, "padded.json", " " * size + valid_text(0.1) + " " * size)  # whitespace is allowed
    padded_run = run_cli("summarize", str(padded))
    assert_success(padded_run)
    assert_time_within(padded_run, good_run)


def _nested_args(depth: int) -> str:
    return '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": ' + "[" * depth + "]" * depth + "}]}"


def test_deep_nesting_is_exit_4(tmp_path):
    """100,000 levels: past the JSON decoder's nesting limit on every Python (Python 3.13's C recursion limit lets
    msgspec go ~10,000 deep, 3.11's recursion limit ~1,000)."""
    bad = write(tmp_path, "deep.json", _nested_args(100_000))
    before = snapshot(bad)
    run = run_cli("summarize", str(bad))
    assert_clean_failure(run, 4, contains="nested too deeply", before=before, after=snapshot(bad))
    with pytest.raises(TraceFormatError, match="nested too deeply"):
        read_trace(bad)


def test_nesting_the_decoder_takes_is_read(tmp_path):
    """1,000 levels: a clean exit 4 where this Python's decoder stops there (3.11), else the trace is read (3.13:
    its one event, exit 0), as the decoder itself decides."""
    import msgspec

    text = _nested_args(1_000)
    try:
        msgspec.json.decode(text)
        decodes = True
    except RecursionError:
        decodes = False
    path = write(tmp_path, "deep.json", text)
    before = snapshot(path)
    run = run_cli("summarize", str(path))
    if not decodes:
        assert_clean_failure(run, 4, contains="nested too deeply", before=before, after=snapshot(path))
        return
    assert run.code == 0 and "Traceback" not in run.stderr, run.stderr
    assert read_trace(path).events["name"].astype(str).tolist() == ["a"]


def test_deep_nesting_in_one_rank_of_parse_dir(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    write(ranks, "rank0.json", valid_text(0.2))
    depth = 100_000
    write(ranks, "rank1.json", '{"traceEvents": [{"ph": "X", "args": ' + "[" * depth + "]" * depth + "}]}")
    before = snapshot(ranks)
    run = run_cli("parse", str(ranks), "-o", str(tmp_path / "out"))
    assert_clean_failure(run, 7, contains="rank 1", before=before, after=snapshot(ranks), folders=(tmp_path,))
    assert "nested too deeply" in run.stderr and "internal error" not in run.stderr


# -- memory: gzip bomb stopped early; small inputs under a low address-space limit -----------------------------


def gzip_bomb(path: Path, inflated_mb: int) -> Path:
    """Valid events, the same 16 KiB repeated (within deflate's window): a .json.gz of a few hundred KiB that
    inflates to ``inflated_mb`` MiB."""
    block = ",\n".join(event_lines(16 << 10)).encode()
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    repeats = inflated_mb * (1 << 20) // len(block)
    with open(path, "wb") as out:
        out.write(z.compress(b'{"traceEvents": [\n'))
        for i in range(repeats):
            out.write(z.compress(block + (b",\n" if i < repeats - 1 else b"")))
        out.write(z.compress(b"\n]}") + z.flush())
    return path


def test_gzip_bomb_stops_early_with_the_memory_it_needs(tmp_path, valid):
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", 400)
    assert bomb.stat().st_size < 4 << 20
    good, good_run = valid(2)
    before = snapshot(bomb)
    run = run_cli("summarize", str(bomb), env={"PROFPARSE_MEMORY_LIMIT": "256M"})
    assert_clean_failure(run, 8, contains="needs about", before=before, after=snapshot(bomb), folders=(tmp_path,))
    assert "PROFPARSE_MEMORY_LIMIT" in run.stderr and "inflated from" in run.stderr
    assert_time_within(run, good_run)  # stopped after reading 16 MiB of 400
    os.environ["PROFPARSE_MEMORY_LIMIT"] = "256M"
    try:
        with pytest.raises(OutOfMemoryError) as error:
            read_trace(bomb)
    finally:
        del os.environ["PROFPARSE_MEMORY_LIMIT"]
    projected = float(re.search(r"about ([\d.]+) MiB of JSON", str(error.value)).group(1))
    assert 380 <= projected <= 420  # the inflated size, projected from the first 16 MiB


def run_limited(limit: int, *argv: str, timeout: float = 120) -> CliRun:
    """Like :func:`run_cli` (fresh process, own session) under an address-space limit (``ulimit -v``)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    env.pop("PROFPARSE_DEBUG", None)
    env.pop("PROFPARSE_MEMORY_LIMIT", None)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "profparse.cli.main", *argv],
        capture_output=True,
        env=env,
        timeout=timeout,
        start_new_session=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    return CliRun(list(argv), proc.returncode, proc.stdout.decode(), proc.stderr.decode(), time.perf_counter() - start)


def small_trace(tmp_path: Path) -> Path:
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    path = b.write(tmp_path / "small.json.gz")
    assert path.stat().st_size < 8 << 10
    return path


@pytest.mark.parametrize("limit_gb", [0.9, 1.2, 2.0])
def test_small_trace_runs_under_a_low_address_space_limit(tmp_path, limit_gb):
    run = run_limited(int(limit_gb * (1 << 30)), "summarize", str(small_trace(tmp_path)))
    assert_success(run)
    assert "ProfilerStep" in run.stdout or "forward" in run.stdout


def test_too_big_for_the_address_space_limit_is_exit_8(tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", 600)
    run = run_limited(int(1.2 * (1 << 30)), "summarize", str(bomb))
    assert_clean_failure(run, 8, contains="ulimit -v")


# -- inputs that are not regular files -----------------------------------------------------------------------


def test_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    run = run_cli("summarize", str(fifo), timeout=30)
    assert_clean_failure(run, 3, contains="FIFO", folders=(tmp_path,))


def test_fifo_with_a_writer_is_refused(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    source = small_trace(tmp_path)
    writer = subprocess.Popen(["sh", "-c", f"cat '{source}' > '{fifo}'"], start_new_session=True)
    try:
        run = run_cli("summarize", str(fifo), timeout=30)
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    assert_clean_failure(run, 3, contains="FIFO", folders=(tmp_path,))


def test_device_is_refused(tmp_path):
    run = run_cli("summarize", "/dev/zero", timeout=30)
    assert_clean_failure(run, 3, contains="not a regular file")


# -- workers die with their parent ---------------------------------------------------------------------------

POOL_SCRIPT = """
import os, sys, time, multiprocessing
from concurrent.futures import ProcessPoolExecutor
from profparse.trace.workers import die_with_parent
pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"), initializer=die_with_parent,
                           initargs=(os.getpid(),))
list(pool.map(abs, range(4)))
print(" ".join(str(p) for p in pool._processes), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_decoding_workers_die_when_the_parent_is_killed():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT], stdout=subprocess.PIPE, env=env)
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(p) for p in workers)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in workers if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


def test_parallel_reader_killed_leaves_no_process(tmp_path):
    good = write(tmp_path, "valid.json", valid_text(16))
    run = run_cli("summarize", str(good), env={"PROFPARSE_WORKERS": "2"}, signal_after=(2.0, signal.SIGKILL))
    assert not run.leftover_pids, f"processes left behind: {run.leftover_pids}"
