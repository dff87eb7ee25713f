"""Why a rank is late: collectives matched across ranks, waiting vs transfer, the late rank per stage."""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_TRACES, once_per_run
from tracebuilder import AUTOGRAD, MAIN, TraceBuilder

from profparse import ranks
from profparse.api import parse
from profparse.cli.main import main
from profparse.ranks import late

A100 = SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
BROADCAST = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
TRANSFER_US = 50.0
STEP_US = 1000.0


def comm_args(name: str, seq: int, nelems: int = 1024) -> dict:
    """The args Kineto writes on ``record_param_comms`` (and, newer, on the NCCL kernel)."""
    return {
        "Collective name": name,
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1, 2, 3]",
        "Group size": 4,
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "dtype": "Float",
        "Seq": seq,
    }


WITH_ARGS = True  # tests that build traces without the collective args switch it off (monkeypatch)


def collective(b: TraceBuilder, name: str, kernel: str, seq: int, cpu_ts: float, start: float, end: float, tid: int):
    """``record_param_comms`` launching one NCCL kernel that runs from ``start`` to ``end`` (us)."""
    args = comm_args(name, seq) if WITH_ARGS else {}
    b.op("record_param_comms", cpu_ts, 3, tid=tid, **args)
    b.launch(cpu_ts + 1, start, end - start, tid=tid, name=kernel, **args)


def rank_trace(
    path: Path, delays_us: list[float], *, extra_allreduce: bool = False, rename: bool = False, optimizer_from: int = 0
) -> Path:
    """Steps of forward (a broadcast, never late) and backward (an allreduce from the autograd thread), and from
    step ``optimizer_from`` on an optimizer step (before it: gradient accumulation).

    In step ``s`` this rank runs ``slow_kernel`` for ``delays_us[s]`` before its allreduce, so its allreduce kernel
    starts that much later; NCCL kernels of one collective end together (last arrival + transfer), as on a GPU.
    """
    b = TraceBuilder()
    b.header["distributedInfo"] = {"backend": "nccl", "world_size": 4}
    seq = 0
    for step, delay in enumerate(delays_us):
        t0 = step * STEP_US
        b.annotation(f"ProfilerStep#{step}", t0, STEP_US - 10)
        b.py("nn.Module: Linear_0", t0 + 1, 60)
        b.op("aten::linear", t0 + 2, 15)
        b.launch(t0 + 3, t0 + 5, 10, name="gemm_fwd")
        collective(b, "broadcast", BROADCAST, seq, t0 + 20, t0 + 40, t0 + 40 + TRANSFER_US, tid=MAIN)
        seq += 1
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 200, 30, tid=AUTOGRAD)
        b.op("AddmmBackward0", t0 + 201, 25, tid=AUTOGRAD)
        b.launch(t0 + 202, t0 + 210, 20, tid=AUTOGRAD, name="gemm_bwd")
        if delay:
            b.op("aten::slow_op", t0 + 232, 4, tid=AUTOGRAD)
            b.launch(t0 + 233, t0 + 240, delay, tid=AUTOGRAD, name="slow_kernel")
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 240, 20, tid=AUTOGRAD)
        name, kernel = ("broadcast", BROADCAST) if rename and step == 0 else ("allreduce", ALLREDUCE)
        start = t0 + 250 + delay
        end = start + TRANSFER_US  # the on-time ranks' kernels end then too (_stretch_ends)
        collective(b, name, kernel, seq, t0 + 241, start, end, tid=AUTOGRAD)
        seq += 1
        if step >= optimizer_from:
            b.annotation("Optimizer.step#AdamW.step", t0 + 800, 20)
            b.op("aten::_foreach_add_", t0 + 801, 10)
            b.launch(t0 + 802, t0 + 810, 5, name="adam_kernel")
    if extra_allreduce:
        t0 = len(delays_us) * STEP_US
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0, 20, tid=AUTOGRAD)
        collective(b, "allreduce", ALLREDUCE, seq, t0 + 1, t0 + 10, t0 + 60, tid=AUTOGRAD)
    return b.write(path)


def ranks_folder(
    tmp_path: Path, n: int, late_rank: int, delays_us: list[float], optimizer_from: int = 0, **late_kwargs
) -> Path:
    """``n`` rank traces; ``late_rank`` is delayed by ``delays_us[step]`` before each backward allreduce; the others
    wait for it: their allreduce kernels end with the late rank's. Every rank steps its optimizer from step
    ``optimizer_from`` on."""
    folder = tmp_path / f"ranks{n}"
    folder.mkdir()
    for r in range(n):
        own = delays_us if r == late_rank else [0.0] * len(delays_us)
        kwargs = late_kwargs if r == late_rank else {}
        rank_trace(folder / f"rank{r}.json.gz", own, optimizer_from=optimizer_from, **kwargs)
        if r != late_rank:  # the on-time ranks' kernels end when the late rank's transfer is done
            _stretch_ends(folder / f"rank{r}.json.gz", delays_us)
    return folder


def _stretch_ends(path: Path, delays_us: list[float]) -> None:
    """Give this rank's allreduce kernels the late rank's end times."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") != "kernel":
            continue
        step = int(e["ts"] // STEP_US)
        if e["name"] == ALLREDUCE and step < len(delays_us):
            e["dur"] += delays_us[step]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def summary(folder: Path, **kwargs) -> dict:
    run = ranks.parse_ranks(folder, None, jobs=1, **kwargs)
    assert not run.failed, [r.error for r in run.failed]
    return run, ranks.ranks_summary_data(run.results, matches=run.matches, match_warnings=run.match_warnings)


# -- ground truth: one rank delayed by a known amount ----------------------------------------------------------------


@pytest.mark.parametrize("n, late_rank", [(2, 1), (4, 2)])
def test_the_others_wait_exactly_the_delay(tmp_path, n, late_rank):
    delays = [300.0, 120.0]
    run, data = summary(ranks_folder(tmp_path, n, late_rank, delays))
    assert run.match_warnings == []
    m = run.matches
    assert m["match"].nunique() == 4  # two broadcasts, two allreduces
    allreduce = m[m["collective"] == "allreduce"].sort_values(["seq", "rank"])
    for step, delay in enumerate(delays):
        part = allreduce[allreduce["seq"] == allreduce["seq"].unique()[step]]
        assert part["last_rank"].unique().tolist() == [late_rank]
        assert part["delay_ns"].unique().tolist() == [int(delay * 1000)]
        assert part["match_stage"].unique().tolist() == ["backward"]
        on_time = part[part["rank"] != late_rank]
        assert on_time["waiting_ns"].tolist() == [int(delay * 1000)] * (n - 1)
        assert (part["transfer_ns"] == int(TRANSFER_US * 1000)).all()
        assert part.loc[part["rank"] == late_rank, "waiting_ns"].tolist() == [0]
        assert part.loc[part["rank"] == late_rank, "is_last"].tolist() == [True]
    broadcast = m[m["collective"] == "broadcast"]
    assert broadcast["last_rank"].isna().all() and (broadcast["waiting_ns"] == 0).all()
    assert set(m["pg_name"]) == {"0"} and set(m["pg_desc"]) == {"default_pg"} and set(m["seq_source"]) == {"Seq"}
    assert set(m["in_nelems"]) == {1024} and set(m["comm_dtype"]) == {"Float"} and set(m["group_size"]) == {4}
    stages = {s["stage"]: s for s in data["late_ranks"]["stages"]}
    assert set(stages) == {"forward", "backward"}
    back = stages["backward"]
    assert (back["late_rank"], back["times_last"], back["collectives"], back["late"]) == (late_rank, 2, 2, 2)
    assert back["mean_delay_ns"] == 210_000 and back["max_delay_ns"] == 300_000
    assert back["waiting_ns"] == (n - 1) * 420_000
    assert stages["forward"]["late_rank"] is None and stages["forward"]["waiting_ns"] == 0


@pytest.mark.parametrize("n", [2, 4])
def test_what_the_late_rank_did_differently(tmp_path, n):
    """Its extra kernel and op in backward, against the per-name median over ranks."""
    delays = [300.0, 120.0]
    _, data = summary(ranks_folder(tmp_path, n, 1, delays))
    back = next(s for s in data["late_ranks"]["stages"] if s["stage"] == "backward")
    kernels = {d["name"]: d for d in back["differences"]["kernels"]}
    slow = kernels["slow_kernel"]
    median = float(np.median([420_000.0 if r == 1 else 0.0 for r in range(n)]))
    assert slow["rank_ns"] == 420_000 and slow["median_ns"] == median and slow["delta_ns"] == 420_000 - median
    assert back["differences"]["kernels"][0]["name"] == "slow_kernel"  # it moved most
    assert "aten::slow_op" in {d["name"] for d in back["differences"]["ops"]}
    assert "gemm_bwd" not in kernels  # the same on every rank: no difference


def test_waiting_plus_transfer_is_each_ranks_collective_kernel_time(tmp_path):
    folder = ranks_folder(tmp_path, 4, 3, [250.0, 0.0, 75.0])
    run, _ = summary(folder)
    m = run.matches
    assert ((m["waiting_ns"] + m["transfer_ns"]) == m["dur_ns"]).all()
    assert ((m["waiting_ns"] >= 0) & (m["transfer_ns"] >= 0)).all()
    for r in range(4):  # dur_ns is the rank's own NCCL kernel time, from its parsed kernels
        kernels = parse(folder / f"rank{r}.json.gz").kernels
        nccl = kernels[kernels["name"].astype(str).str.startswith("nccl")]
        assert m.loc[m["rank"] == r, "dur_ns"].sum() == nccl["dur_ns"].sum()
        assert sorted(m.loc[m["rank"] == r, "start_ns"]) == sorted(nccl["ts_ns"])
    per_rank = pd.DataFrame(late.per_rank_stage(m))
    stages = late.late_ranks(m)
    assert per_rank["waiting_ns"].sum() == stages["waiting_ns"].sum() == m["waiting_ns"].sum()
    assert per_rank["transfer_ns"].sum() == stages["transfer_ns"].sum() == m["transfer_ns"].sum()
    assert per_rank["times_last"].sum() == stages["late"].sum() == int(m["is_last"].sum()) == 2


def test_without_args_the_kernel_names_and_order_match(tmp_path, monkeypatch):
    """Older traces: no collective args anywhere; names from the kernels, one unnamed group, matched by order."""
    monkeypatch.setattr(sys.modules[__name__], "WITH_ARGS", False)
    run, data = summary(ranks_folder(tmp_path, 2, 0, [80.0]))
    m = run.matches
    assert set(m["pg_name"]) == {""} and set(m["seq_source"]) == {"order"}
    assert m.sort_values(["seq", "rank"])["collective"].tolist() == ["broadcast"] * 2 + ["allreduce"] * 2
    assert m.loc[m["rank"] == 1, "waiting_ns"].tolist() == [0, 80_000]
    assert m["in_nelems"].isna().all()
    assert data["late_ranks"]["stages"][-1]["late_rank"] == 0


# -- mismatches are warnings ------------------------------------------------------------------------------------------


def test_an_extra_collective_on_one_rank_is_a_warning(tmp_path):
    run, data = summary(ranks_folder(tmp_path, 2, 1, [100.0, 100.0], extra_allreduce=True))
    assert len(run.match_warnings) == 1
    assert "different numbers of collectives" in run.match_warnings[0]
    assert "rank 0: 4, rank 1: 5" in run.match_warnings[0]
    assert run.matches["match"].nunique() == 4  # the four both ranks have are still matched
    assert data["late_ranks"]["warnings"] == run.match_warnings
    assert f"warning: {run.match_warnings[0]}" in ranks.render_ranks(data)


def test_a_collective_named_differently_is_left_unmatched(tmp_path):
    run, _ = summary(ranks_folder(tmp_path, 2, 1, [100.0, 100.0], rename=True))
    assert len(run.match_warnings) == 1 and "differ in name" in run.match_warnings[0]
    assert "allreduce / broadcast" in run.match_warnings[0]
    assert run.matches["match"].nunique() == 3
    assert sorted(run.matches["collective"].unique()) == ["allreduce", "broadcast"]


def _rows(starts: list[int], seqs: list[int] | None, names: list[str] | None = None, dur: int = 100) -> pd.DataFrame:
    n = len(starts)
    return pd.DataFrame(
        {
            "pg_name": "0",
            "pg_desc": "default_pg",
            "pg_ranks": "[0, 1]",
            "collective": names or ["allreduce"] * n,
            "comm_seq": seqs if seqs is not None else [late.NULL] * n,
            "order": range(n),
            "start_ns": starts,
            "end_ns": [s + dur for s in starts],
            "dur_ns": dur,
            "kernels": 1,
            "kernel_name": ALLREDUCE,
            "stage": "backward",
            "step": 0,
            "in_nelems": 8,
            "out_nelems": 8,
            "comm_dtype": "Float",
            "group_size": 2,
        }
    )


def test_seq_matches_across_a_profiler_window_that_starts_later():
    """Rank 1's trace starts one collective later: by Seq, its collectives still meet their partners."""
    rank0 = _rows([1000, 2000, 3000], [7, 8, 9])
    rank1 = _rows([2030, 3010], [8, 9])
    matches, warnings = late.match([(0, rank0), (1, rank1)])
    assert matches["seq"].unique().tolist() == [8, 9] and set(matches["seq_source"]) == {"Seq"}
    assert matches.loc[matches["rank"] == 0, "waiting_ns"].tolist() == [30, 10]
    assert matches["last_rank"].tolist() == [1, 1, 1, 1]
    assert len(warnings) == 1 and "matched by Seq" in warnings[0]
    by_order, _ = late.match([(0, rank0.assign(comm_seq=late.NULL)), (1, rank1.assign(comm_seq=late.NULL))])
    assert set(by_order["seq_source"]) == {"order"}  # without Seq the order pairs 1000 with 2030: wrong but stated
    assert by_order.loc[by_order["rank"] == 0, "start_ns"].tolist() == [1000, 2000]


def test_a_seq_twice_on_one_rank_is_left_unmatched_with_a_warning():
    matches, warnings = late.match([(0, _rows([10, 20, 30], [1, 2, 2])), (1, _rows([10, 25, 30], [1, 2, 3]))])
    assert matches["seq"].unique().tolist() == [1]
    assert warnings == [
        "process group '0': 2 sequence numbers are not recorded exactly once on every rank (first: #2); left unmatched"
    ]


def test_waiting_is_clipped_to_the_kernel():
    """A kernel that ended before the last rank arrived (clock skew, or a lost record) waits its whole length."""
    matches, _ = late.match([(0, _rows([0], [1], dur=100)), (1, _rows([500], [1], dur=100))])
    early = matches[matches["rank"] == 0].iloc[0]
    assert (early["waiting_ns"], early["transfer_ns"]) == (100, 0)


def test_ties_and_single_rank_groups():
    matches, warnings = late.match([(0, _rows([50], [1])), (1, _rows([50], [1]))])
    assert matches["last_rank"].isna().all() and (matches["delay_ns"] == 0).all() and not matches["is_last"].any()
    alone, warnings = late.match([(0, _rows([50], [1]))])
    assert alone.empty and warnings == []


# -- outputs: parse DIR writes collective_matches, summarize DIR shows the section ------------------------------------


def test_parse_writes_collective_matches_and_summarize_reads_them_back(tmp_path, capsys):
    folder = ranks_folder(tmp_path, 2, 1, [200.0, 100.0], extra_allreduce=True)
    out = tmp_path / "tables"
    assert main(["parse", str(folder), "-o", str(out), "-j", "1"]) == 0
    assert "collectives: warning: " in capsys.readouterr().err
    written = ranks.read_table(out, "collective_matches")
    direct, warnings = late.match((r, late.collective_rows(parse(folder / f"rank{r}.json.gz"))) for r in (0, 1))
    assert len(written) == len(direct) == 8
    assert written["waiting_ns"].astype("int64").tolist() == direct["waiting_ns"].tolist()
    assert written["last_rank"].isna().tolist() == direct["last_rank"].isna().tolist()
    assert ranks.read_matches(out)[1] == warnings
    for fmt in ("json", "csv", "text", "markdown"):
        assert main(["summarize", str(folder), "--format", fmt, "-q"]) == 0
        from_folder = capsys.readouterr().out
        assert main(["summarize", str(out), "--format", fmt, "-q"]) == 0
        from_dataset = capsys.readouterr().out
        if fmt == "json":
            json_text = from_dataset
            a, b = json.loads(from_folder)["late_ranks"], json.loads(from_dataset)["late_ranks"]
            assert a == b and a["stages"][-1]["late_rank"] == 1
        elif fmt == "csv":
            csv = pd.read_csv(io.StringIO(from_dataset))
            back = csv[csv["stage"] == "backward"].set_index("rank")
            assert back.loc[1, "times_last"] == 2 and back.loc[0, "waiting_ns"] == 300_000
            assert back.loc[1, "waiting_ns"] == 0
            waits = json.loads(json_text)["late_ranks"]["path_waits"]  # each rank's path time waiting for rank 1
            assert waits and {w["waited_rank"] for w in waits} == {1}
            want = {(w["stage"], w["rank"]): w["wait_ns"] for w in waits}
            got = {(r.stage, r.rank): r.path_wait_ns for r in csv.itertuples() if r.path_wait_ns}
            assert got == want and csv["path_wait_ns"].notna().all()
        else:
            assert "Late ranks" in from_dataset and "slow_kernel" in from_dataset


def _page_payload(page: Path) -> dict:
    """The JSON the report page embeds in its ``<script id="payload">``."""
    text = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="payload">(.*?)</script>', text, re.S).group(1))


def test_report_shows_the_late_ranks_summarize_prints(tmp_path, capsys):
    """Folder and written dataset alike: the page's late ranks are summarize's (rank 1, backward, both steps)."""
    folder = ranks_folder(tmp_path, 3, 1, [200.0, 100.0])
    dataset = tmp_path / "tables"
    assert main(["parse", str(folder), "-o", str(dataset), "-j", "1", "-q"]) == 0
    for source in (folder, dataset):
        assert main(["summarize", str(source), "--format", "json", "-q", "-j", "1"]) == 0
        printed = json.loads(capsys.readouterr().out)["late_ranks"]
        assert main(["summarize", str(source), "-q", "-j", "1"]) == 0
        text = capsys.readouterr().out
        assert "backward: rank 1 arrived last in 2 of 2 collectives" in text, source
        page = tmp_path / f"{source.name}.html"
        assert main(["report", str(source), "-o", str(page), "-q", "-j", "1"]) == 0
        shown = _page_payload(page)["ranks"]["late_ranks"]
        late = [(s["stage"], s["late_rank"], s["times_last"]) for s in shown["stages"] if s["late_rank"] is not None]
        assert late == [("backward", 1, 2)], source  # ground truth: only rank 1 was delayed, in backward
        unlabelled = json.loads(
            json.dumps(shown), object_hook=lambda row: {k: v for k, v in row.items() if k != "label"}
        )
        assert unlabelled == printed, source  # the page adds summarize's shortened names as `label`, nothing else


def test_an_older_dataset_without_matches_says_so(tmp_path, capsys):
    folder = ranks_folder(tmp_path, 2, 1, [100.0])
    out = tmp_path / "tables"
    assert main(["parse", str(folder), "-o", str(out), "-j", "1", "-q"]) == 0
    shutil.rmtree(out / "collective_matches")
    assert main(["summarize", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)["late_ranks"]
    assert data["available"] is False and data["stages"] == []
    assert main(["summarize", str(out)]) == 0
    assert "not in this dataset" in capsys.readouterr().out


# -- real trace: the A100 DDP rank copied as two ranks ---------------------------------------------------------------


def _kernel_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl")]


@pytest.mark.skipif(not A100.exists(), reason="shared GPU traces not present")
def test_real_ddp_trace_as_two_ranks(tmp_path):
    doc = json.loads(gzip.decompress(A100.read_bytes()))
    raw = _kernel_events(doc)
    names = sorted(late._normal_name(e["name"].split("_")[1]) for e in raw)
    folder = tmp_path / "ddp"
    folder.mkdir()
    (folder / "rank0.json.gz").write_bytes(A100.read_bytes())
    allreduces = sorted((e for e in raw if "AllReduce" in e["name"]), key=lambda e: e["ts"])
    moved = allreduces[2]
    shift_us = 500.0
    assert moved["dur"] > shift_us  # the wait fits inside rank 0's kernel
    for e in _kernel_events(doc):
        if e["ts"] == moved["ts"] and e["name"] == moved["name"]:
            e["ts"] += shift_us
            e["dur"] -= shift_us  # rank 1 arrives later; both kernels end together
    (folder / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    run = ranks.parse_ranks(folder, None, jobs=1, rank_from="name")
    assert not run.failed
    m = run.matches
    assert run.match_warnings == []
    assert m["match"].nunique() == len(raw) == 21
    assert sorted(m[m["rank"] == 0]["collective"]) == names
    comms = sorted((e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"), key=lambda e: e["ts"])
    for name in ("allreduce", "broadcast"):  # sizes and group from the record_param_comms that launched each kernel
        args = [e["args"] for e in comms if e["args"]["Collective name"] == name]
        mine = m[(m["rank"] == 0) & (m["collective"] == name)].sort_values("start_ns")
        assert mine["in_nelems"].tolist() == [a["In msg nelems"] for a in args]
        assert mine["comm_dtype"].tolist() == [a["dtype"] for a in args]
    assert set(m["pg_name"]) == {"0"} and set(m["group_size"]) == {2} and set(m["seq_source"]) == {"order"}
    late_rows = m[m["is_last"]]
    assert late_rows["rank"].tolist() == [1] and late_rows["delay_ns"].tolist() == [int(shift_us * 1000)]
    waited = m[(m["rank"] == 0) & (m["match"] == late_rows["match"].iloc[0])]
    assert waited["waiting_ns"].tolist() == [int(shift_us * 1000)]
    assert m["waiting_ns"].sum() == int(shift_us * 1000)
    assert ((m["waiting_ns"] + m["transfer_ns"]) == m["dur_ns"]).all()
    kernels = parse(A100).kernels
    stage = str(kernels[kernels["name"] == moved["name"]].sort_values("ts_ns")["stage"].iloc[2])
    assert stage == "backward"
    data = ranks.ranks_summary_data(run.results, matches=m, match_warnings=run.match_warnings)
    by_stage = {s["stage"]: s for s in data["late_ranks"]["stages"]}
    assert by_stage[stage]["late_rank"] == 1 and by_stage[stage]["times_last"] == 1


# -- CPU (gloo) collectives: no kernel, the gloo worker thread's range is the collective ------------------------------

GLOO = 300  # the gloo worker thread


def cpu_collective(b: TraceBuilder, name: str, seq: int, cpu_ts: float, start: float, end: float, tid: int, gloo: bool):
    """A CPU collective: ``c10d::<name>_`` queues it; with ``gloo`` the worker thread's ``gloo:<name>`` range runs it
    from ``start`` to ``end`` (us), else (another CPU backend) a ``record_param_comms`` with the args is all there is
    and the op's own span is the collective."""
    if gloo:
        b.op(f"c10d::{name}_", cpu_ts, 3, tid=tid)
        b.annotation(f"gloo:{name}", start, end - start, tid=GLOO)
    else:
        b.op("record_param_comms", start, end - start, tid=tid, **comm_args(name.replace("_", ""), seq))


def cpu_rank_trace(path: Path, delays_us: list[float], *, gloo: bool, queued_before: bool = False) -> Path:
    """:func:`rank_trace` on a CPU rank: a broadcast in forward, an allreduce in backward, no GPU at all.

    In step ``s`` this rank runs ``aten::slow_op`` for ``delays_us[s]`` before its allreduce; ``queued_before`` adds
    a gloo range that started before the first host op (queued before the profiler window: not a collective here).
    """
    b = TraceBuilder()
    b.header = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "world_size": 2}}
    if queued_before:
        b.annotation("gloo:all_reduce", 1, 5, tid=GLOO)
    seq = 0
    for step, delay in enumerate(delays_us):
        t0 = step * STEP_US
        b.annotation(f"ProfilerStep#{step}", t0, STEP_US - 10)
        b.py("nn.Module: Linear_0", t0 + 1, 60)
        b.op("aten::linear", t0 + 2, 15)
        cpu_collective(b, "broadcast", seq, t0 + 20, t0 + 25, t0 + 25 + TRANSFER_US, tid=MAIN, gloo=gloo)
        seq += 1
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 200, 30, tid=AUTOGRAD)
        b.op("AddmmBackward0", t0 + 201, 25, tid=AUTOGRAD)
        if delay:
            b.op("aten::slow_op", t0 + 232, delay, tid=AUTOGRAD)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 240, 5, tid=AUTOGRAD)
        start = t0 + 250 + delay
        cpu_collective(b, "all_reduce", seq, start - 5, start, start + TRANSFER_US, tid=AUTOGRAD, gloo=gloo)
        seq += 1
        b.annotation("Optimizer.step#AdamW.step", t0 + 800, 20)
        b.op("aten::_foreach_add_", t0 + 801, 10)
    return b.write(path)


def _stretch_cpu_ends(path: Path, delays_us: list[float], gloo: bool) -> None:
    """The on-time rank's allreduce ends when the late rank's does (it waited for it)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        step = int(e.get("ts", 0) // STEP_US)
        is_allreduce = (
            e.get("name") == "gloo:all_reduce" if gloo else e.get("args", {}).get("Collective name") == "allreduce"
        )
        if is_allreduce and e["ts"] > 100 and step < len(delays_us):
            e["dur"] += delays_us[step]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize("gloo", [True, False], ids=["gloo_ranges", "record_param_comms_only"])
def test_cpu_collectives_name_the_late_rank_and_its_delay(tmp_path, gloo):
    delays = [300.0, 120.0]
    folder = tmp_path / "cpu"
    folder.mkdir()
    cpu_rank_trace(folder / "rank0.json.gz", [0.0, 0.0], gloo=gloo, queued_before=gloo)
    _stretch_cpu_ends(folder / "rank0.json.gz", delays, gloo)
    cpu_rank_trace(folder / "rank1.json.gz", delays, gloo=gloo)
    rows = late.collective_rows(parse(folder / "rank0.json.gz"))
    assert len(rows) == 4 and (rows["kernels"] == 0).all()  # the range queued before the window is not one
    assert rows["collective"].tolist() == ["broadcast", "allreduce"] * 2
    assert rows["stage"].tolist() == ["forward", "backward"] * 2
    assert rows["kernel_name"].tolist() == (["gloo:broadcast", "gloo:all_reduce"] * 2 if gloo else [late.COMM_OP] * 4)
    run, data = summary(folder)
    assert run.match_warnings == []
    m = run.matches
    assert set(m["seq_source"]) == {"order" if gloo else "Seq"}
    allreduce = m[m["collective"] == "allreduce"].sort_values(["seq", "rank"])
    for step, delay in enumerate(delays):
        part = allreduce[allreduce["seq"] == allreduce["seq"].unique()[step]]
        assert part["last_rank"].unique().tolist() == [1] and part["match_stage"].unique().tolist() == ["backward"]
        assert part["delay_ns"].unique().tolist() == [int(delay * 1000)]
        assert part["waiting_ns"].tolist() == [int(delay * 1000), 0]
        assert (part["transfer_ns"] == int(TRANSFER_US * 1000)).all()
    assert m[m["collective"] == "broadcast"]["last_rank"].isna().all()
    assert ((m["waiting_ns"] + m["transfer_ns"]) == m["dur_ns"]).all()
    by_stage = {s["stage"]: s for s in data["late_ranks"]["stages"]}
    assert by_stage["backward"]["late_rank"] == 1 and by_stage["backward"]["mean_delay_ns"] == 210_000
    assert by_stage["backward"]["differences"]["ops"][0]["name"] == "aten::slow_op"
    assert by_stage["forward"]["late_rank"] is None


def test_a_gpu_rank_s_kernel_less_host_collectives_are_not_cpu_collectives(tmp_path):
    """On a rank with NCCL kernels, a ``record_param_comms`` whose kernel the trace lost is no CPU collective."""
    path = rank_trace(tmp_path / "rank0.json.gz", [0.0])
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": MAIN,
                               "ts": 900.0, "dur": 3.0, "args": comm_args("allreduce", 9)})  # fmt: skip
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    rows = late.collective_rows(parse(path))
    assert len(rows) == 2 and (rows["kernels"] == 1).all() and rows["comm_seq"].tolist() == [0, 1]


# -- a real gloo DDP capture: rank 1 sleeps in backward ----------------------------------------------------------

LATE_RANK, LATE_STAGE, SLEEP_S = 1, "backward", 0.4  # 20% of it (80 ms) is above the ranks' own jitter here


@pytest.fixture(scope="module")
def gloo_ddp_folder(tmp_path_factory) -> Path:
    """Two gloo DDP ranks of the tiny Qwen2 (2 steps); rank 1 sleeps 400 ms at the start of each backward."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    from profparse.capture.patterns import LateSleep, capture_ddp, rank_path

    def capture(out: Path) -> None:
        first = capture_ddp(out / "capture" / "ddp.json.gz", False, LateSleep(LATE_RANK, LATE_STAGE, SLEEP_S))
        (out / "ranks").mkdir()
        for rank in (0, 1):
            shutil.copy(rank_path(first, rank), out / "ranks" / f"rank{rank}.json.gz")

    # three test files read it (test_ranks_advice, test_ranks_critical_path): captured once per run
    return once_per_run(tmp_path_factory, "gloo_ddp", capture) / "ranks"


def test_gloo_ddp_capture_names_the_sleeping_rank_its_stage_and_delay(gloo_ddp_folder, capsys):
    run, data = summary(gloo_ddp_folder)
    assert run.match_warnings == []
    m = run.matches
    assert (m["kernel_name"].str.startswith("gloo:")).all() and set(m["rank"]) == {0, 1}
    assert ((m["waiting_ns"] + m["transfer_ns"]) == m["dur_ns"]).all()
    by_stage = {s["stage"]: s for s in data["late_ranks"]["stages"]}
    slept = by_stage[LATE_STAGE]
    injected = SLEEP_S * 1e9
    assert slept["late_rank"] == LATE_RANK and slept["times_last"] == slept["collectives"] == 2  # one bucket a step
    assert abs(slept["mean_delay_ns"] - injected) <= 0.2 * injected, slept["mean_delay_ns"]
    mine = m[(m["match_stage"] == LATE_STAGE) & (m["rank"] != LATE_RANK)]
    assert ((mine["delay_ns"] - injected).abs() <= 0.2 * injected).all()  # every backward allreduce, not just the mean
    assert ((mine["waiting_ns"] - mine["delay_ns"]).abs() <= 0.2 * injected).all()  # the on-time rank waited it
    # the other training stages stand out far less (load is left out: the two processes start and load the model
    # unsynchronised, DDP's first allgather waited up to 77 ms for the later one on this machine)
    others = [by_stage[s] for s in ("forward", "optimizer") if s != LATE_STAGE and s in by_stage]
    assert all(s["mean_delay_ns"] is None or s["mean_delay_ns"] < slept["mean_delay_ns"] / 2 for s in others), others
    assert main(["summarize", str(gloo_ddp_folder), "-q", "-j", "1"]) == 0
    assert f"{LATE_STAGE}: rank {LATE_RANK} arrived last in 2 of 2 collectives" in capsys.readouterr().out
