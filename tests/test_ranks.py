"""Many ranks: a folder of rank traces -> one dataset partitioned by rank; parallel, Dask, failures, stragglers."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest
from adversarial import REPO, _session_pids, assert_clean_failure, partial_leftovers, run_cli, snapshot, start_pool_run
from conftest import SHARED_TRACES, assert_same_frame
from tracebuilder import TraceBuilder, slow_rank_folder, training_step

import profparse
import profparse.base.errors
from profparse import ranks
from profparse.base.errors import UsageError
from profparse.base.files import MARKER
from profparse.cli.main import main
from profparse.outputs.parquet import internal_tables

STRAGGLER = 2  # in the built folder: every time of this rank is 1.5x
SCALE = 1.5
A100 = SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz"


def scale_times(events: list[dict], factor: float) -> list[dict]:
    """Stretch a trace in time (ts from its start, and dur): nesting and links stay as they were."""
    t0 = min(e["ts"] for e in events if "ts" in e)
    out = []
    for e in events:
        e = dict(e)
        if "ts" in e:
            e["ts"] = t0 + (e["ts"] - t0) * factor
        if "dur" in e:
            e["dur"] = e["dur"] * factor
        out.append(e)
    return out


def build_rank(path: Path, rank: int | None, factor: float = 1.0, steps: int = 3) -> Path:
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        t = training_step(b, step, t) + 10
    if factor != 1.0:
        b.events = scale_times(b.events, factor)
    if rank is not None:
        b.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 4}
    return b.write(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Four small rank traces (names say nothing; ranks from distributedInfo), rank 2 a straggler."""
    folder = tmp_path_factory.mktemp("built")
    for rank, name in enumerate(("b.json.gz", "d.json", "a.json.gz", "c.json")):
        build_rank(folder / name, rank, SCALE if rank == STRAGGLER else 1.0)
    return folder


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """The A100 DDP trace rewritten as ranks 0..3 (distributedInfo.rank), rank 3 with 1.5x durations."""
    if not A100.exists():
        pytest.skip("../shared/traces not present")
    with gzip.open(A100) as f:
        doc = json.load(f)
    folder = tmp_path_factory.mktemp("shared")
    for rank in range(4):
        copy = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": rank, "world_size": 4}}
        if rank == 3:
            copy["traceEvents"] = scale_times(doc["traceEvents"], SCALE)
        (folder / f"host{rank + 10}.pt.trace.json").write_text(json.dumps(copy))
    return folder


@pytest.fixture(scope="module")
def dask_address():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def files_by_rank(folder: Path) -> dict[int, Path]:
    return {f.rank: Path(f.path) for f in ranks.prepare(folder)}


def all_tables(out: Path) -> dict[str, pd.DataFrame]:
    assert ranks.partitioned_tables(out) == sorted(ranks.table_names())
    return {name: ranks.read_table(out, name) for name in ranks.table_names()}


def assert_same_dataset(a: Path, b: Path) -> None:
    for name in ranks.table_names():  # Arrow equality: fast on the event tables of real traces
        left = ds.dataset(a / name, partitioning="hive").to_table()
        right = ds.dataset(b / name, partitioning="hive").to_table()
        assert left.num_rows == right.num_rows and left.equals(right), name
    cols = ["rank", "rank_source", "status", "error", "exit_code", "events"]
    assert_same_frame(ranks.read_table(a, "ranks")[cols], ranks.read_table(b, "ranks")[cols])
    left, right = (ds.dataset(x / "collective_matches").to_table() for x in (a, b))
    assert left.equals(right)


def check_dataset(folder: Path, out: Path, parsed: dict[int, profparse.ParsedTrace] | None = None) -> None:
    """Every rank's partition holds exactly what a single-file parse of that rank gives."""
    by_rank = files_by_rank(folder)
    parsed = parsed or {rank: profparse.parse(path) for rank, path in by_rank.items()}
    tables = all_tables(out)
    for name, frame in tables.items():
        assert set(frame["rank"].unique()) <= set(by_rank), name
        assert sorted(p.name for p in (out / name).iterdir()) == [f"rank={r}" for r in sorted(by_rank)]
    for rank, one in parsed.items():
        expected = internal_tables(one)
        for name, frame in tables.items():
            assert (frame["rank"] == rank).sum() == len(expected[name]), (rank, name)
        kernels = tables["kernels"]
        mine = kernels[kernels["rank"] == rank].reset_index(drop=True)
        assert mine["dur_ns"].astype("int64").tolist() == one.kernels["dur_ns"].astype("int64").tolist()
        assert mine["stage"].astype(str).tolist() == one.kernels["stage"].astype(str).tolist()


# -- rank numbers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.Apr_03_18_51_38.1102.pt.trace.json.gz", 3),
        ("rank3.json", 3),
        ("trace_rank_12.json", 12),
        ("worker3.json.gz", 3),
        ("worker0.1623143089861.pt.trace.json.gz", 0),
        ("host_1234.1700000000.pt.trace.json", None),
        ("frank7.json", None),
    ],
)
def test_rank_from_name(name, rank):
    assert ranks.rank_from_name(name) == rank


def test_rank_sources_and_positions(tmp_path):
    build_rank(tmp_path / "zzz.json", 5)  # distributedInfo
    build_rank(tmp_path / "worker1.json", None)  # file name
    build_rank(tmp_path / "b.json", None)  # lowest free ranks, in sorted order
    build_rank(tmp_path / "a.json", None)
    got = {Path(f.path).name: (f.rank, f.source) for f in ranks.prepare(tmp_path)}
    assert got == {
        "a.json": (0, "sorted position"),
        "b.json": (2, "sorted position"),
        "worker1.json": (1, "file name"),
        "zzz.json": (5, "distributedInfo"),
    }
    positions = [(Path(f.path).name, f.rank) for f in ranks.prepare(tmp_path, "position")]
    assert positions == [("a.json", 0), ("b.json", 1), ("worker1.json", 2), ("zzz.json", 3)]


def test_two_files_stating_one_rank_is_an_error(tmp_path):
    build_rank(tmp_path / "x.json", 1)
    build_rank(tmp_path / "rank1.json", None)
    with pytest.raises(UsageError, match="rank 1 is stated by 2 files"):
        ranks.prepare(tmp_path)
    assert main(["parse", str(tmp_path), "-o", str(tmp_path.parent / "o"), "-q"]) == 2
    assert [f.rank for f in ranks.prepare(tmp_path, "position")] == [0, 1]


def test_partition_paths_are_integers_only(tmp_path):
    assert ranks.partition_dir(tmp_path, "kernels", 3) == tmp_path / "kernels" / "rank=3"
    for bad in ("3/../../x", -1, "1", True, 2.0):
        with pytest.raises(ValueError):
            ranks.partition_dir(tmp_path, "kernels", bad)
    for bad in ("../x", "ranks", "a/b", ""):
        with pytest.raises(ValueError):
            ranks.partition_dir(tmp_path, bad, 0)


# -- the dataset -------------------------------------------------------------------------------------------------


def test_parse_folder_writes_a_partitioned_dataset(built, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["parse", str(built), "-o", str(out), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "4 rank traces (ranks 0-3 from distributedInfo)" in err
    for name in ranks.table_names():
        assert sorted(p.name for p in (out / name).iterdir()) == [f"rank={r}" for r in range(4)]
        assert all((out / name / f"rank={r}" / "part-0.parquet").is_file() for r in range(4))
    check_dataset(built, out)
    # the usual readers see the rank column from the partition folders
    kernels = pd.read_parquet(out / "kernels")
    assert sorted(kernels["rank"].astype(int).unique()) == [0, 1, 2, 3]
    assert ds.dataset(out / "events", partitioning="hive").count_rows() == len(ranks.read_table(out, "events"))
    table = ranks.read_table(out, "ranks")
    assert table["rank"].tolist() == [0, 1, 2, 3]
    assert set(table["rank_source"]) == {"distributedInfo"} and set(table["status"]) == {"ok"}
    assert len(ranks.read_table(out, "failed_ranks")) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_second_look_at_a_rank_folder_reads_no_json(built, tmp_path, capsys, monkeypatch):
    """Each rank goes through the parsed-trace cache: after one verb on the folder, the next reads no JSON and
    gives what a run without the cache gives; --no-cache stores nothing."""
    from profparse.cache import store

    entries = lambda: sorted(Path(os.environ[store.DIR_ENV]).glob("e-*"))  # noqa: E731
    summarize = ["summarize", str(built), "--format", "json", "-j", "1", "-q"]
    assert main([*summarize, "--no-cache"]) == 0
    uncached = capsys.readouterr().out
    assert main(["parse", str(built), "-o", str(tmp_path / "plain"), "-j", "1", "-q", "--no-cache"]) == 0
    assert entries() == []
    assert main(summarize) == 0
    cold = capsys.readouterr().out
    assert len(entries()) == 4  # one per rank (their contents differ)

    def refuse(*args, **kwargs):
        raise AssertionError("the JSON was read although the rank is cached")

    monkeypatch.setattr(profparse.api, "parse", refuse)
    assert main(summarize) == 0
    warm = capsys.readouterr().out
    assert main(["parse", str(built), "-o", str(tmp_path / "warm"), "-j", "1", "-q"]) == 0
    assert json.loads(uncached) == json.loads(cold) == json.loads(warm)
    assert_same_dataset(tmp_path / "plain", tmp_path / "warm")


def test_rank_workers_use_the_callers_cache_folder(built, tmp_path, monkeypatch):
    """The pool's workers come from a forkserver started once per process, with the environment of that moment;
    they store each rank where the caller's cache is now, not where it was then."""
    from profparse.cache import store

    for name in ("first", "second"):
        monkeypatch.setenv(store.DIR_ENV, str(tmp_path / name))
        ranks.parse_ranks(built, None, jobs=2, cache=True)
        assert len(list((tmp_path / name).glob("e-*"))) == 4, name


def test_ranks_on_dask_do_not_use_the_cache(built, tmp_path, monkeypatch):
    """A Dask cluster's workers keep no entries in folders of theirs; local workers do (``cache=True``)."""
    from profparse.ranks import run as rank_run

    asked: list[tuple[bool, str | None]] = []

    def record(tasks, **kwargs):
        asked.extend((t.cache, kwargs.get("scheduler")) for t in tasks)
        return [ranks.run_rank(t) for t in tasks]  # here, not on a cluster: only the tasks are looked at

    monkeypatch.setattr(rank_run, "run_tasks", record)
    ranks.parse_ranks(built, None, scheduler="tcp://nowhere:8786", cache=True)
    ranks.parse_ranks(built, None, jobs=1, cache=True)
    ranks.parse_ranks(built, None, jobs=1)
    assert asked == [(False, "tcp://nowhere:8786")] * 4 + [(True, None)] * 4 + [(False, None)] * 4


def test_duckdb_reads_the_dataset(built, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "out"
    ranks.parse_ranks(built, out, jobs=1)
    rows = duckdb.sql(
        f"select rank, count(*) from read_parquet('{out}/ops/*/*.parquet', hive_partitioning=true) "
        "group by rank order by rank"
    ).fetchall()
    ops = ranks.read_table(out, "ops")
    assert rows == [(r, int((ops["rank"] == r).sum())) for r in range(4)]


def test_jobs_2_and_dask_give_the_same_dataset(built, tmp_path, dask_address):
    assert main(["parse", str(built), "-o", str(tmp_path / "j1"), "-j", "1", "-q"]) == 0
    assert main(["parse", str(built), "-o", str(tmp_path / "j2"), "-j", "2", "-q"]) == 0
    assert main(["parse", str(built), "-o", str(tmp_path / "dask"), "--scheduler", dask_address, "-q"]) == 0
    assert_same_dataset(tmp_path / "j1", tmp_path / "j2")
    assert_same_dataset(tmp_path / "j1", tmp_path / "dask")


def _step_mfu(out: Path) -> dict[int, tuple[float, float]]:
    """Per rank: the step row's (peak_tflops, mfu) in a written dataset's efficiency table."""
    eff = ranks.read_table(out, "efficiency")
    step = eff[eff["scope"] == "step"]
    assert sorted(step["rank"]) == [0, 1]
    return {int(r.rank): (float(r.peak_tflops), float(r.mfu)) for r in step.itertuples()}


def test_peak_tflops_reaches_every_rank_worker(tmp_path, dask_address, monkeypatch):
    """parse FOLDER --peak-tflops P: each rank's MFU = model FLOPs / (step time x P), in this process, in worker
    processes and on Dask; doubling P halves it exactly. The default is the device's peak (H100 bf16)."""
    from test_efficiency import BACKWARD_MODEL, FORWARD, H100_BF16
    from test_efficiency import build as flops_trace

    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        flops_trace(folder / f"rank{r}.json")
    step_s = 1e-3  # the trace's one ProfilerStep lasts 1000 us
    default = tmp_path / "default"
    assert main(["parse", str(folder), "-o", str(default), "-j", "1", "-q"]) == 0
    expected = (FORWARD + BACKWARD_MODEL) / (step_s * H100_BF16 * 1e12)
    assert {r: (p, pytest.approx(m)) for r, (p, m) in _step_mfu(default).items()} == {
        r: (H100_BF16, expected) for r in (0, 1)
    }
    where = {"j1": ["-j", "1"], "j2": ["-j", "2"], "dask": ["--scheduler", dask_address]}
    for name, option in where.items():
        got = {}
        for peak in (100, 200):
            out = tmp_path / f"{name}-{peak}"
            assert main(["parse", str(folder), "-o", str(out), "--peak-tflops", str(peak), *option, "-q"]) == 0
            got[peak] = _step_mfu(out)
            for rank, (used, mfu) in got[peak].items():
                assert used == peak, (name, rank)
                assert mfu == pytest.approx((FORWARD + BACKWARD_MODEL) / (step_s * peak * 1e12)), (name, rank)
        for rank in (0, 1):
            assert got[100][rank][1] / got[200][rank][1] == pytest.approx(2.0, rel=1e-12), (name, rank)
            assert got[100][rank][1] / _step_mfu(default)[rank][1] == pytest.approx(H100_BF16 / 100, rel=1e-12)
    # summarize FOLDER (no tables written) hands the same peak to its rank tasks
    sent = []
    real = ranks.run.run_tasks
    monkeypatch.setattr(ranks.run, "run_tasks", lambda tasks, **kw: sent.extend(tasks) or real(tasks, **kw))
    assert main(["summarize", str(folder), "--peak-tflops", "250", "-j", "1", "-q"]) == 0
    assert [t.peak_tflops for t in sent] == [250.0, 250.0]


def test_unreadable_rank_is_reported_and_the_others_are_written(built, tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(built, folder)
    corrupt = folder / "a.json.gz"  # rank 2: its gzip checksum broken (a cut stream is recovered, not failed)
    data = bytearray(corrupt.read_bytes())
    data[-8] ^= 0xFF  # the CRC-32 of the gzip trailer
    corrupt.write_bytes(bytes(data))
    (folder / "rank-9.json").write_text("not json at all")
    out = tmp_path / "out"
    assert main(["parse", str(folder), "-o", str(out), "-j", "2"]) == 7
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith("profparse: rank 2: error:")]) == 1
    assert len([line for line in err if line.startswith("profparse: rank 9: error: ")]) == 1
    assert "2 of 5 ranks could not be read" in err[-1]
    failed = ranks.read_table(out, "failed_ranks")
    assert failed["rank"].tolist() == [2, 9] and failed["exit_code"].tolist() == [4, 4]
    # a file that fails its checksum is not trusted for its distributedInfo: its rank is its place among the files
    assert failed["rank_source"].tolist() == ["sorted position", "file name"]
    assert "corrupt compressed data" in failed["error"].iloc[0]
    for name in ranks.table_names():
        assert sorted(p.name for p in (out / name).iterdir()) == ["rank=0", "rank=1", "rank=3"]
    # the ranks that were read are complete and equal to a clean run's
    clean = tmp_path / "clean"
    ranks.parse_ranks(built, clean, jobs=1)
    for name in ranks.table_names():
        expected = ranks.read_table(clean, name)
        assert_same_frame(ranks.read_table(out, name), expected[expected["rank"] != 2].reset_index(drop=True))

    assert main(["parse", str(folder), "-o", str(out), "-q", "--keep-going"]) == 6  # exists, no --force
    assert main(["parse", str(folder), "-o", str(out), "-q", "--keep-going", "--force"]) == 0
    assert "rank 2: error" in capsys.readouterr().err  # errors are reported even with -q
    assert ranks.read_table(out, "failed_ranks")["rank"].tolist() == [2, 9]


def crash_on_rank_1(task: ranks.RankTask) -> ranks.RankResult:
    """Runs in a worker process: rank 1 kills it (as the OOM killer would)."""
    if task.rank == 1:
        os._exit(9)
    return ranks.run_rank(task)


def test_a_worker_that_dies_fails_only_its_rank(built):
    tasks = [ranks.RankTask(path=f.path, rank=f.rank, source=f.source) for f in ranks.prepare(built)]
    results = {r.rank: r for r in ranks.run_local(tasks, 2, lambda result: None, fn=crash_on_rank_1)}
    assert {rank: r.ok for rank, r in results.items()} == {0: True, 1: False, 2: True, 3: True}
    assert "worker process died" in results[1].error and results[1].exit_code == 8


def test_no_readable_rank_writes_nothing(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "rank0.json").write_text("{")
    (folder / "rank1.json").write_text("")
    assert main(["parse", str(folder), "-o", str(tmp_path / "out"), "-q", "--keep-going"]) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_not_a_trace_folder(tmp_path):
    assert main(["parse", str(tmp_path), "-o", str(tmp_path / "out"), "-q"]) == 3
    assert main(["parse", str(tmp_path), "-o", str(tmp_path / "out"), "-j", "0", "-q"]) == 2


def test_partitions_share_one_schema(tmp_path):
    """A rank with warnings next to ranks without: the typed and the empty warning tables read as one."""
    folder = tmp_path / "in"
    folder.mkdir()
    for rank in range(3):
        build_rank(folder / f"rank{rank}.json", rank)
    text = (folder / "rank1.json").read_text()
    (folder / "rank1.json").write_text(text[: len(text) * 2 // 3])  # truncated: a warning row
    out = tmp_path / "out"
    run = ranks.parse_ranks(folder, out, jobs=1)
    assert not run.failed
    warnings = pd.read_parquet(out / "warnings")
    warnings = warnings[warnings["check"] != "profiler_cost_uncalibrated"]  # every built rank: no calibration
    assert warnings["rank"].astype(int).tolist() == [1]
    assert "truncated" in warnings["check"].tolist()
    assert any("truncated" in n for n in run.results[1].notes)


def test_single_file_parse_is_unchanged(built, tmp_path):
    out = tmp_path / "single"
    assert main(["parse", str(built / "b.json.gz"), "-o", str(out), "-q"]) == 0
    names = sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert names == sorted(f"{n}.parquet" for n in ranks.table_names())


# -- stragglers ----------------------------------------------------------------------------------------------------


def expected_stragglers(parsed: dict[int, profparse.ParsedTrace], column: str) -> dict[str, tuple[int, int]]:
    """Per stage: (slowest rank, lead over the median in ns) from per-file parses."""
    values: dict[str, dict[int, int]] = {}
    for rank, one in parsed.items():
        for row in one.stage_summary.query("scope == 'total'").itertuples(index=False):
            values.setdefault(str(row.stage), {})[rank] = int(getattr(row, column))
    out = {}
    for stage, by_rank in values.items():
        series = pd.Series(by_rank).sort_index()
        if series.max() > 0:
            out[stage] = (int(series.idxmax()), int(series.max() - round(series.median())))
    return out


@pytest.mark.parametrize("metric", ["host_wall", "gpu_busy"])
def test_straggler_and_lead_built(built, metric, capsys):
    assert main(["summarize", str(built), "--format", "json", "--metric", metric, "-j", "1", "-q"]) == 0
    data = json.loads(capsys.readouterr().out)
    column = ranks.METRICS[metric][0]
    expected = expected_stragglers({r: profparse.parse(p) for r, p in files_by_rank(built).items()}, column)
    got = {s["stage"]: (s["slowest_rank"], s["lead_ns"]) for s in data["stragglers"] if s["slowest_rank"] is not None}
    assert got == expected
    for stage in ("forward", "backward", "optimizer"):
        assert got[stage][0] == STRAGGLER
        base = next(r[column] for r in data["per_rank"] if r["rank"] == 0 and r["stage"] == stage)
        assert got[stage][1] == pytest.approx(base * (SCALE - 1), abs=2)  # 1.5x rank leads the median by 0.5x


def test_shared_trace_ranks(shared, tmp_path, dask_address):
    """Four ranks of a real A100 trace: the dataset, local vs Dask, and the straggler (rank 3, 1.5x)."""
    run = ranks.parse_ranks(shared, tmp_path / "j1", jobs=1)
    ranks.parse_ranks(shared, tmp_path / "dask", scheduler=dask_address)
    assert_same_dataset(tmp_path / "j1", tmp_path / "dask")
    parsed = {rank: profparse.parse(path) for rank, path in files_by_rank(shared).items()}
    check_dataset(shared, tmp_path / "j1", parsed)
    for metric in ("host_wall", "gpu_busy"):
        data = ranks.ranks_summary_data(run.results, metric=metric, folder=shared)
        again = ranks.ranks_summary_data(ranks.results_from_dataset(tmp_path / "j1"), metric=metric, folder=shared)
        assert again["stragglers"] == data["stragglers"]
        got = {s["stage"]: (s["slowest_rank"], s["lead_ns"]) for s in data["stragglers"] if s["slowest_rank"]}
        assert got == expected_stragglers(parsed, ranks.METRICS[metric][0])
        assert {got[s][0] for s in ("forward", "backward", "optimizer")} == {3}
        backward = next(s for s in data["stragglers"] if s["stage"] == "backward")
        assert backward["lead_share"] == pytest.approx(SCALE - 1, rel=1e-3)
    # late ranks: rank 3's clock runs 1.5x from the trace start, so it reaches every collective last
    m = run.matches
    assert run.match_warnings == [] and m["match"].nunique() == 21
    assert m.loc[m["is_last"], "rank"].tolist() == [3] * 21
    starts = m.pivot(index="match", columns="rank", values="start_ns")
    per_match = m.drop_duplicates("match").set_index("match")
    assert (per_match["delay_ns"] == starts[3] - starts[0]).all() and (per_match["delay_ns"] > 0).all()
    on_time = m[m["rank"] != 3]
    expected = (starts[3] - starts[0]).reindex(on_time["match"]).to_numpy().clip(max=on_time["dur_ns"].to_numpy())
    assert on_time["waiting_ns"].tolist() == expected.tolist()
    assert (m.loc[m["rank"] == 3, "waiting_ns"] == 0).all()
    written = ranks.read_table(tmp_path / "j1", "collective_matches")
    assert written["waiting_ns"].astype("int64").tolist() == m["waiting_ns"].tolist()


def test_summarize_formats_and_the_written_dataset_agree(built, tmp_path, capsys):
    out = tmp_path / "out"
    ranks.parse_ranks(built, out, jobs=1)
    outputs = {}
    for source in (built, out):
        for fmt in ("text", "json", "csv", "markdown"):
            assert main(["summarize", str(source), "--format", fmt, "-j", "1", "-q"]) == 0
            outputs[source, fmt] = capsys.readouterr().out
    text = outputs[built, "text"]
    assert "Stragglers per stage" in text and "slowest rank" in text
    backward = next(line for line in text.splitlines() if line.strip().startswith("backward") and "%" in line)
    assert backward.split()[4] == str(STRAGGLER) and backward.endswith("+50.0%")
    assert "| backward |" in outputs[built, "markdown"]
    csv = pd.read_csv(io.StringIO(outputs[built, "csv"]))
    assert csv.loc[csv["slowest"], "rank"].unique().tolist() == [STRAGGLER]
    a, b = json.loads(outputs[built, "json"]), json.loads(outputs[out, "json"])
    assert a["stragglers"] == b["stragglers"] and a["per_rank"] == b["per_rank"]


def test_summarize_with_a_failed_rank(built, tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(built, folder)
    (folder / "c.json").write_text("garbage")  # rank 3
    assert main(["summarize", str(folder), "-j", "1"]) == 7
    captured = capsys.readouterr()
    assert "Failed ranks" in captured.out and "rank 3:" in captured.out
    assert "profparse: rank 3: error:" in captured.err
    assert main(["summarize", str(folder), "-j", "1", "--keep-going", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["rank"] for f in data["failed_ranks"]] == [3]
    assert {r["rank"] for r in data["per_rank"]} == {0, 1, 2}


# -- point 8 of issue 11: the right code for each way a rank run fails ------------------------------------------------


def _good_ranks(folder: Path, n: int = 2) -> Path:
    folder.mkdir()
    for r in range(n):
        build_rank(folder / f"rank{r}.json.gz", None)
    return folder


@pytest.mark.parametrize("jobs", [1, 2])
def test_deeply_nested_rank_fails_alone(tmp_path, jobs):
    """JSON nested 100,000 deep in one rank file (past the decoder's limit on every Python) fails that rank (exit 4
    for it); the others are written, exit 7."""
    folder = _good_ranks(tmp_path / "in")
    deep = 100_000
    (folder / "rank2.json").write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
        '"args": {"x": ' + '{"a": ' * deep + "1" + "}" * deep + "}}]}"
    )
    run = run_cli("parse", str(folder), "-o", str(tmp_path / "out"), "-j", str(jobs), "-q")
    assert run.code == 7, run.stderr
    assert "Traceback" not in run.stderr and "rank 2" in run.stderr
    table = ranks.read_table(tmp_path / "out", "ranks").set_index("rank")
    assert list(table["status"]) == ["ok", "ok", "failed"] and table.loc[2, "exit_code"] == 4
    assert not run.leftover_pids


def test_recursion_error_in_a_rank_is_its_failure(tmp_path, monkeypatch):
    """A RecursionError anywhere in reading one rank is that rank's input error (4), not an internal error."""
    import profparse.api

    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(profparse.api, "parse", deep)
    task = ranks.RankTask(path=str(tmp_path / "x.json"), rank=0, source="position", out_root=None)
    result = ranks.run_rank(task)
    assert (result.ok, result.exit_code) == (False, 4) and "nested too deeply" in result.error


def test_every_rank_out_of_memory_is_exit_8(tmp_path, monkeypatch):
    """All ranks failing for memory is exit 8 (out of memory), not 4 (unreadable input); mixed reasons stay 4."""
    import profparse.api

    folder = _good_ranks(tmp_path / "in")

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(profparse.api, "parse", no_memory)
    with pytest.raises(profparse.base.errors.TraceFormatError) as caught:
        ranks.parse_ranks(folder, tmp_path / "out", jobs=1)
    assert caught.value.exit_code == 8 and "out of memory" in str(caught.value)
    assert not (tmp_path / "out").exists()
    results = [
        ranks.RankResult(path="a", rank=0, source="position", ok=False, error="a: out of memory", exit_code=8),
        ranks.RankResult(path="b", rank=1, source="position", ok=False, error="b: not JSON", exit_code=4),
    ]
    with pytest.raises(profparse.base.errors.TraceFormatError) as caught:
        ranks.raise_if_none_read("in", results)
    assert caught.value.exit_code == 4


def test_folder_that_only_looks_like_a_dataset(tmp_path):
    """ranks/ and stage_summary/ folders holding no Parquet (or the wrong tables): exit 4 with one line."""
    fake = tmp_path / "fake"
    for name in ("ranks", "stage_summary"):
        (fake / name).mkdir(parents=True)
        (fake / name / "part-0.parquet").write_bytes(b"not parquet at all")
    before = snapshot(fake)
    assert_clean_failure(run_cli("summarize", str(fake)), 4, contains="not a readable profparse rank dataset")
    assert snapshot(fake) == before
    wrong = tmp_path / "wrong"
    for name in ("ranks", "stage_summary"):
        (wrong / name).mkdir(parents=True)
        pd.DataFrame({"a": [1]}).to_parquet(wrong / name / "part-0.parquet")
    assert_clean_failure(run_cli("summarize", str(wrong)), 4, contains="not a profparse rank dataset")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_pool_workers_die_with_the_parent(tmp_path, sig):
    """The parent killed mid-run: its workers (and the forkserver) are gone within the grace period."""
    folder = slow_rank_folder(tmp_path / "in")
    argv = ("parse", str(folder), "-o", str(tmp_path / "out"), "-j", "2", "-q")
    # signalled 0.3 s after both workers started (the parent, resource tracker, forkserver and 2 workers): mid-run
    run = run_cli(*argv, signal_after=(0.3, sig), processes_before_signal=5)
    # SIGKILL ends the parent at once; SIGTERM unwinds it (exit 143, temporaries removed): either way mid-run
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 143
    assert run.code == expected, f"the run was not still going when signalled: {run.code} {run.stderr}"
    assert not run.timed_out and not run.leftover_pids, run
    if sig == signal.SIGTERM:
        assert not (tmp_path / "out").exists() and not partial_leftovers(tmp_path)


def test_ctrl_c_while_the_pool_starts(tmp_path):
    """Ctrl-C (to the whole process group) as the worker pool starts: exit 130, one line, nothing left."""
    folder = slow_rank_folder(tmp_path / "in")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    argv = ["parse", str(folder), "-o", str(tmp_path / "out"), "-j", "2", "-q"]
    proc = start_pool_run(argv, env)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["profparse: interrupted"], err
    time.sleep(1.0)
    assert [p for p in _session_pids(proc.pid) if p != proc.pid] == []
    assert not (tmp_path / "out").exists() and not partial_leftovers(tmp_path)


def test_folder_header_names_gpus_without_device_properties(tmp_path, capsys):
    """Ranks with GPU work but no ``deviceProperties`` are GPU ranks in the folder's header, not 'no GPU'."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    for rank in (0, 1):
        b = TraceBuilder()
        b.header.pop("deviceProperties")
        b.header["distributedInfo"] = {"rank": rank, "world_size": 2}
        training_step(b, 0, 0)
        b.write(folder / f"rank-{rank}.json.gz")
    assert main(["summarize", str(folder), "-q"]) == 0
    header = capsys.readouterr().out.splitlines()[2]
    assert header.startswith("  devices: GPU ") and header.endswith("(2 of 2 ranks)"), header
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    for rank in (0, 1):
        b = TraceBuilder()
        b.header.pop("deviceProperties")
        b.op("aten::mm", 0, 10)
        b.write(cpu / f"rank-{rank}.json.gz")
    assert main(["summarize", str(cpu), "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "  devices: no GPU"
