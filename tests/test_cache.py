"""The parsed-trace cache (profparse/cache/, docs/cache.md): same answers warm as cold, and never in the way.

Every test runs with its own empty PROFPARSE_CACHE_DIR (conftest's autouse fixture)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import REPO_GPU_TRACES, assert_same_frame
from tracebuilder import TraceBuilder, training_step

import profparse
import profparse.api
from profparse.cache import frames, keys, sealed, store
from profparse.cli.main import main

TABLES = (
    "events",
    "kernels",
    "ops",
    "stage_summary",
    "stage_levels",
    "modules",
    "memory",
    "memory_by_stage",
    "load_breakdown",
    "runtime_calls",
    "collectives",
    "comm_exposure",
    "warnings",
    "steps",
    "rules",
)


def cache_dir() -> Path:
    return Path(os.environ[store.DIR_ENV])


def cache_files() -> list[str]:
    """What the cache folder holds besides conftest's link to the run's built models (``models``)."""
    return sorted(p.name for p in cache_dir().iterdir() if p.name != "models")


def entries() -> list[Path]:
    return sorted(p for p in cache_dir().glob("e-*") if p.is_dir())


def forget_texts() -> None:
    """Remove the stored summaries (test_cache_replay.py), so the next summarize reads the entry's tables."""
    for text in cache_dir().glob("e-*/text.*.json"):
        text.unlink()


def leftovers() -> list[Path]:
    return sorted(cache_dir().glob(".tmp-*")) + sorted(cache_dir().glob("*/.tmp-*"))


def no_json_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any read of a trace's JSON fail: what follows must come from the cache."""

    def refuse(*args, **kwargs):
        raise AssertionError("the JSON was read although the trace is cached")

    monkeypatch.setattr(profparse.api, "parse", refuse)


def built_trace(path: Path, steps: int = 3, kernel_us: float = 10) -> Path:
    """Three training steps with one forward, backward and optimizer kernel each; a [memory] event per step."""
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        b.memory(t + 0.5, 1024, 4096 * (step + 1))
        t = training_step(b, step, t)
    b.launch(t + 1, t + 2, kernel_us, name="extra")
    return b.write(path)


def extra_line(err: str, usual: str) -> str:
    """The one line ``err`` has besides the trace's ``usual`` notes (which it keeps, in order)."""
    lines = err.splitlines()
    for line in usual.splitlines():
        lines.remove(line)
    assert len(lines) == 1, lines
    return lines[0]


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_same_trace(a: profparse.ParsedTrace, b: profparse.ParsedTrace) -> None:
    for name in TABLES:
        assert_same_frame(getattr(a, name), getattr(b, name), check_exact=True, obj=name)
    assert a.header == b.header
    assert a.raw.report == b.raw.report
    assert a.raw.thread_names == b.raw.thread_names and a.raw.process_names == b.raw.process_names
    assert a.raw.events.attrs == b.raw.events.attrs
    assert repr(a) == repr(b)


# -- same answers --------------------------------------------------------------------------------------------------


def test_hand_built_trace_same_tables_cold_and_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = built_trace(tmp_path / "t.json")
    cold = profparse.load(trace)
    uncached = profparse.load(trace, cache=False)
    # the known answers of the hand-built trace: 3 steps, 4 kernels of 10+20+5 us per step + one of 10 us
    assert len(cold.steps) == 3
    assert cold.kernels["dur_ns"].sum() == 3 * 35_000 + 10_000
    no_json_reading(monkeypatch)
    warm = profparse.load(trace)
    assert warm.cache is not None and warm.cache.folder == cold.cache.folder
    assert_same_trace(uncached, warm)
    assert_same_trace(cold, warm)
    by_stage = warm.kernels.groupby("stage", observed=True)["dur_ns"].sum()
    assert by_stage["forward"] == 3 * 10_000 and by_stage["backward"] == 3 * 20_000
    assert by_stage["optimizer"] == 3 * 5_000
    assert int(by_stage.sum()) == int(warm.kernels["dur_ns"].sum())  # the parts add up to the whole


def test_frames_stored_in_batches_read_back_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame longer than a batch is stored one slice at a time (categoricals, text, NULL-filled ints): the
    warm load of the sample trace gives back every table equal, cell for cell, in more than one batch."""
    import pyarrow as pa

    monkeypatch.setattr(frames, "BATCH_ROWS", 1000)
    monkeypatch.setattr(frames, "FULL_CHECK_CELLS", 10**12)  # compare every value as it is stored, not the schema
    trace = REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz"  # in every clone; 31 k events, NCCL text args
    cold = profparse.load(trace)
    assert len(cold.raw.events) > 3 * 1000
    source = sealed.sealed_payload(cold.cache.folder / "events.arrow")  # the Arrow file before its checksum
    assert pa.ipc.open_file(source).num_record_batches == -(-len(cold.raw.events) // 1000)
    uncached = profparse.load(trace, cache=False)
    no_json_reading(monkeypatch)
    warm = profparse.load(trace)
    assert_same_trace(uncached, warm)
    assert warm.stage_summary.equals(cold.stage_summary)


def test_sample_trace_summarize_json_same_cold_warm_and_uncached(
    sample_trace: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, uncached, err0 = run(capsys, "summarize", str(sample_trace), "--format", "json", "--no-cache")
    assert code == 0 and not entries()
    code, cold, err1 = run(capsys, "summarize", str(sample_trace), "--format", "json")
    assert code == 0 and len(entries()) == 1
    no_json_reading(monkeypatch)
    code, warm, err2 = run(capsys, "summarize", str(sample_trace), "--format", "json")
    assert code == 0
    assert json.loads(uncached) == json.loads(cold) == json.loads(warm)
    assert uncached == warm and err0 == err1 == err2  # same bytes, same notes on stderr (the stored text)
    forget_texts()
    assert run(capsys, "summarize", str(sample_trace), "--format", "json") == (0, uncached, err0)  # from tables
    stored = {p.name for p in entries()[0].glob("table.*.arrow")}
    assert {"table.kernels.arrow", "table.ops.arrow", "table.stage_summary.arrow"} <= stored


def test_parse_tables_same_cold_and_warm(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = Path(__file__).parent.parent / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"
    if not trace.exists():
        pytest.skip("no sample_traces/")
    outs = {}
    for label, extra in (("uncached", ["--no-cache"]), ("cold", []), ("warm", [])):
        outs[label] = tmp_path / label
        code, _, _ = run(capsys, "parse", str(trace), "-o", str(outs[label]), *extra)
        assert code == 0
    names = sorted(str(p.relative_to(outs["cold"])) for p in outs["cold"].rglob("*.parquet"))
    assert names and names == sorted(str(p.relative_to(outs["warm"])) for p in outs["warm"].rglob("*.parquet"))
    for name in names:
        cold = pq.read_table(outs["cold"] / name)
        assert cold.equals(pq.read_table(outs["warm"] / name)), name
        assert cold.equals(pq.read_table(outs["uncached"] / name)), name


def test_truncated_trace_warm_keeps_its_warning_and_strict_still_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    whole = built_trace(tmp_path / "whole.json").read_bytes()
    trace = tmp_path / "cut.json"
    trace.write_bytes(whole[: len(whole) * 2 // 3])
    cold = run(capsys, "summarize", str(trace), "--format", "json")
    warm = run(capsys, "summarize", str(trace), "--format", "json")
    assert cold == warm and cold[0] == 0 and "truncated at byte" in cold[2]
    code, _, err = run(capsys, "summarize", str(trace), "--strict")
    assert code == 5 and "truncated" in err
    assert run(capsys, "summarize", str(trace), "--strict")[0] == 5  # --strict is part of the key: not a hit


# -- invalidation --------------------------------------------------------------------------------------------------


def test_changed_content_is_a_new_entry_even_with_the_old_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = built_trace(tmp_path / "t.json", kernel_us=10)
    old = os.stat(trace)
    monkeypatch.setattr(keys, "RACY_NS", -(10**15))  # trust the stat of a file just written (the test's shortcut)
    first = profparse.load(trace)
    assert first.kernels["dur_ns"].max() == 20_000
    assert len(list((cache_dir() / "stat").iterdir())) == 1  # the hash was recorded against the file's stat
    built_trace(trace, kernel_us=40)  # the same name and inode, different content (its ctime moves on)
    os.utime(trace, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the old mtime again
    second = profparse.load(trace)
    assert second.kernels["dur_ns"].max() == 40_000
    assert len(entries()) == 2


def test_a_racy_file_rewritten_with_an_equal_stat_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite within one clock tick leaves size and times equal: a file written just now is never known by its
    stat, not even by the process that hashed it (no stale tables for the new content)."""
    monkeypatch.setattr(keys, "stat_id", lambda st: (st.st_dev, st.st_ino, st.st_size))  # one tick, always
    trace = built_trace(tmp_path / "t.json", kernel_us=10)
    assert profparse.load(trace).kernels["dur_ns"].max() == 20_000
    built_trace(trace, kernel_us=40)  # same name, inode and size
    assert profparse.load(trace).kernels["dur_ns"].max() == 40_000


def test_a_file_written_just_now_is_hashed_every_time(tmp_path: Path) -> None:
    trace = built_trace(tmp_path / "t.json")
    assert profparse.load(trace).cache is not None
    assert not (cache_dir() / "stat").exists()  # its times are too recent to trust (git's racy rule)
    assert profparse.load(trace).cache is not None  # still a hit, found by its content hash


def test_no_marks_is_its_own_entry(tmp_path: Path) -> None:
    trace = built_trace(tmp_path / "t.json")
    profparse.load(trace)
    profparse.load(trace, include_marks=False)
    assert len(entries()) == 2


def test_no_cache_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = built_trace(tmp_path / "t.json")
    assert run(capsys, "summarize", str(trace), "--no-cache")[0] == 0
    assert cache_files() == []
    profparse.load(trace, cache=False)
    assert cache_files() == []


def test_max_bytes_zero_turns_the_cache_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(store.MAX_ENV, "0")
    assert profparse.load(built_trace(tmp_path / "t.json")).cache is None
    assert cache_files() == []


# -- damage and failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate_events", "garbage_meta", "drop_links", "zero_links"])
def test_corrupt_entry_is_removed_and_rebuilt(damage: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = built_trace(tmp_path / "t.json")
    code, before, usual = run(capsys, "summarize", str(trace), "--format", "json")
    (entry,) = entries()
    if damage == "truncate_events":
        data = (entry / "events.arrow").read_bytes()
        (entry / "events.arrow").write_bytes(data[: len(data) // 2])
    elif damage == "garbage_meta":
        (entry / "meta.json").write_text("{not json")
    elif damage == "drop_links":
        (entry / "links.arrow").unlink()
    else:
        (entry / "links.arrow").write_bytes(b"\0" * (entry / "links.arrow").stat().st_size)
    forget_texts()  # the stored summary would be printed without reading the damaged tables
    code, after, err = run(capsys, "summarize", str(trace), "--format", "json")
    assert code == 0 and after == before
    line = extra_line(err, usual)
    assert line.startswith("profparse: warning: cache entry ") and "parsing again" in line
    assert len(entries()) == 1 and not leftovers()  # rebuilt
    assert run(capsys, "summarize", str(trace), "--format", "json") == (0, before, usual)


def test_corrupt_table_is_recomputed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = built_trace(tmp_path / "t.json")
    _, before, usual = run(capsys, "summarize", str(trace), "--format", "json")
    kernels = entries()[0] / "table.kernels.arrow"
    kernels.write_bytes(kernels.read_bytes()[:100])
    forget_texts()
    code, after, err = run(capsys, "summarize", str(trace), "--format", "json")
    assert code == 0 and after == before
    line = extra_line(err, usual)
    assert line.startswith("profparse: warning: cached table") and "table.kernels.arrow" in line
    assert kernels.stat().st_size > 100  # stored again


def test_unwritable_cache_folder_only_turns_caching_off(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    os.environ[store.DIR_ENV] = str(blocker / "cache")  # conftest's monkeypatch restores it
    trace = built_trace(tmp_path / "t.json")
    code, out, err = run(capsys, "summarize", str(trace), "--format", "json")
    _, uncached, usual = run(capsys, "summarize", str(trace), "--format", "json", "--no-cache")
    assert code == 0 and out == uncached
    assert extra_line(err, usual).startswith("profparse: note: cache off for this run: cannot write")
    assert blocker.read_text() == "x"
    assert run(capsys, "summarize", str(trace), "--format", "json", "-q") == (0, out, "")


def test_full_disk_only_turns_caching_off(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path, frame):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(frames, "write_frame", full)
    trace = built_trace(tmp_path / "t.json")
    code, out, err = run(capsys, "summarize", str(trace), "--format", "json")
    _, uncached, usual = run(capsys, "summarize", str(trace), "--format", "json", "--no-cache")
    assert code == 0 and out == uncached
    line = extra_line(err, usual)
    assert "cache off for this run" in line and "No space left on device" in line
    assert not entries() and not leftovers()


def test_cache_never_inside_an_output_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plots"
    os.environ[store.DIR_ENV] = str(out / "cache")
    trace = built_trace(tmp_path / "t.json")
    code, _, err = run(capsys, "parse", str(trace), "-o", str(out))
    assert code == 0 and "cache off: the cache folder" in err
    assert not (out / "cache").exists()


def test_cache_never_holds_an_input(tmp_path: Path) -> None:
    trace = built_trace(cache_dir() / "t.json")
    assert profparse.load(trace).cache is None
    assert cache_files() == ["t.json"]


def test_fifo_input_is_not_hashed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "summarize", str(fifo))
    assert code == 3 and err.count("\n") == 1
    assert cache_files() == []


# -- concurrency and eviction --------------------------------------------------------------------------------------


def test_two_writers_of_one_entry(tmp_path: Path) -> None:
    trace = built_trace(tmp_path / "t.json")
    script = (
        "import json, sys, profparse; from profparse.outputs.summary import render_summary; "
        "print(render_summary(profparse.load(sys.argv[1]), fmt='json'))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(trace)], stdout=subprocess.PIPE, env=env) for _ in range(3)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outs[0] == outs[1] == outs[2]
    assert len(entries()) == 1 and not leftovers()
    warm = profparse.load(trace)
    assert warm.cache is not None
    assert_same_trace(warm, profparse.load(trace, cache=False))


def test_second_put_keeps_the_first_entry(tmp_path: Path) -> None:
    trace = built_trace(tmp_path / "t.json")
    parsed = profparse.load(trace, cache=False)
    opened = store.Cache.open()
    name, _ = opened.key(trace, {"include_marks": True, "strict": False})
    first = opened.put(name, parsed)
    meta = (first.folder / "meta.json").read_bytes()
    second = opened.put(name, parsed)  # as a run that lost the race does
    assert second.folder == first.folder and (first.folder / "meta.json").read_bytes() == meta
    assert len(entries()) == 1 and not leftovers()


def test_half_written_entry_is_not_seen(tmp_path: Path) -> None:
    trace = built_trace(tmp_path / "t.json")
    profparse.load(trace)
    (entry,) = entries()
    half = cache_dir() / ".tmp-half"
    os.rename(entry, half)  # as if the writer were killed before its rename
    (half / "meta.json").unlink()
    assert profparse.load(trace).cache is not None  # parsed again, a new complete entry
    assert len(entries()) == 1


def test_least_recently_used_entries_are_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = [built_trace(tmp_path / f"t{i}.json", steps=3, kernel_us=10 + i) for i in range(3)]
    t0 = profparse.load(traces[0]).cache.folder
    size = sum(f.stat().st_size for f in t0.iterdir())
    limit = int(size * 2.5)  # room for two entries
    monkeypatch.setenv(store.MAX_ENV, str(limit))
    t1 = profparse.load(traces[1]).cache.folder
    now = os.stat(t1 / "meta.json").st_mtime
    os.utime(t0 / "meta.json", (now - 200, now - 200))  # t0 used first, t1 after it
    os.utime(t1 / "meta.json", (now - 100, now - 100))
    assert profparse.load(traces[0]).cache.folder == t0  # a hit: t0 is now the most recently used
    t2 = profparse.load(traces[2]).cache.folder
    assert entries() == sorted([t0, t2])  # t1, the least recently used, went
    assert sum(f.stat().st_size for e in entries() for f in e.iterdir()) <= limit
    assert profparse.load(traces[1]).kernels["dur_ns"].max() == 20_000  # parsed again: right answers


def test_an_entry_over_the_limit_is_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(store.MAX_ENV, "1000")
    messages: list[str] = []
    parsed = profparse.load(built_trace(tmp_path / "t.json"), notify=messages.append)
    assert parsed.cache is None and not entries() and not leftovers()
    assert len(messages) == 1 and "exceeds PROFPARSE_CACHE_MAX_BYTES" in messages[0]


def test_tests_never_use_the_users_cache() -> None:
    assert store.cache_root() == cache_dir()
    assert Path.home() / ".cache" not in [cache_dir(), *cache_dir().parents]


def test_annotate_and_diff_same_cold_and_warm(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = built_trace(tmp_path / "a.json", kernel_us=10)
    b = built_trace(tmp_path / "b.json", kernel_us=30)
    outs = []
    for label in ("uncached", "cold", "warm"):
        extra = ["--no-cache"] if label == "uncached" else []
        assert run(capsys, "annotate", str(a), "-o", str(tmp_path / f"{label}.json"), *extra)[0] == 0
        code, diff, _ = run(capsys, "diff", str(a), str(b), "--format", "json", *extra)
        assert code == 0
        outs.append(((tmp_path / f"{label}.json").read_bytes(), diff))
    assert outs[0] == outs[1] == outs[2]
    assert len(entries()) == 2
    assert json.loads(outs[2][1])  # the diff has content


def test_real_gpu_trace_same_tables_cold_and_warm(shared_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real traces: every column (op shapes, collective args, NULL sentinels) and table survives the cache."""
    cold = profparse.load(shared_trace)
    for name in TABLES:  # computed cold, so stored
        getattr(cold, name)
    no_json_reading(monkeypatch)
    warm = profparse.load(shared_trace)
    assert warm.cache is not None
    assert_same_trace(cold, warm)
    assert_same_frame(cold.raw.events, warm.raw.events, check_exact=True)
    assert len(list(warm.cache.folder.glob("table.*.arrow"))) >= 8


@pytest.mark.parametrize(
    "column",
    [pd.Series([1, "a", None], dtype=object), pd.Series([1, None, 3], dtype=object), pd.Series([{"a": 1}, None, {}])],
    ids=["mixed", "ints_with_none", "dicts"],
)
def test_a_table_that_does_not_read_back_identical_is_not_kept(column: pd.Series, tmp_path: Path) -> None:
    entry = profparse.load(built_trace(tmp_path / "t.json")).cache
    frame = pd.DataFrame({"x": column, "n": [1, 2, 3]})
    entry.put_table("odd", frame)
    assert entry.table("odd") is None and "odd" in entry.uncacheable
    assert not (entry.folder / "table.odd.arrow").exists() and not leftovers()
    good = pd.DataFrame({"x": pd.Categorical(["a", None, "b"]), "n": pd.array([1, None, 3], dtype="Int64")})
    entry.put_table("good", good)
    assert_same_frame(entry.table("good"), good, check_exact=True)


def test_tables_added_later_keep_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = profparse.load(built_trace(tmp_path / "a.json", kernel_us=10))
    core = sum(f.stat().st_size for f in first.cache.folder.iterdir())
    monkeypatch.setenv(store.MAX_ENV, str(int(core * 2.2)))  # two cores fit, not two with their tables
    second = profparse.load(built_trace(tmp_path / "b.json", kernel_us=20))
    assert len(entries()) == 2
    os.utime(first.cache.folder / "meta.json", (1, 1))  # the first is the least recently used
    for name in TABLES:
        getattr(second, name)  # stored as computed
    assert entries() == [second.cache.folder]
    assert sum(f.stat().st_size for f in second.cache.folder.iterdir()) <= int(core * 2.2)
    assert second.cache.uncacheable  # the tables that did not fit any more
    warm = profparse.load(tmp_path / "b.json")
    assert_same_trace(second, warm)  # what was kept, and what is computed again, gives the same answers
