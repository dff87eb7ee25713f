"""Collectives and exposed communication (issue 9 part 2): ``collectives``, ``comm_exposure``, summary, view."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_TRACES, parsed
from hypothesis import given, settings
from hypothesis import strategies as st
from tracebuilder import AUTOGRAD, TraceBuilder

import profparse
from profparse.analysis import comm
from profparse.base.intervals import group_union
from profparse.outputs.summary import render_summary
from profparse.outputs.views import communication as view

A100 = SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
COMM_STREAM = 40
US = 1000  # ns per microsecond (the builder's unit)


# -- formulas -------------------------------------------------------------------------------------------------------


def test_bus_factors_are_nccl_tests_definitions() -> None:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter,
    all-to-all), 1 (broadcast, reduce, send/recv); computed here by hand."""
    assert comm.bus_factor("all_reduce", 8) == 14 / 8
    assert comm.bus_factor("all_reduce", 2) == 1.0
    assert comm.bus_factor("all_gather", 4) == 3 / 4
    assert comm.bus_factor("reduce_scatter", 8) == 7 / 8
    assert comm.bus_factor("all_to_all", 16) == 15 / 16
    for kind in ("broadcast", "reduce", "send", "recv", "send_recv"):
        assert comm.bus_factor(kind, 8) == 1.0
        assert comm.bus_factor(kind, None) == 1.0  # no group size needed
    assert math.isnan(comm.bus_factor("all_reduce", None))
    assert math.isnan(comm.bus_factor("barrier", 8))


def test_collective_names_are_normalised() -> None:
    cases = {
        "allreduce": "all_reduce",
        "all_reduce": "all_reduce",
        "allreduce_coalesced": "all_reduce",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
        "_allgather_base": "all_gather",
        "allgather_into_tensor_coalesced": "all_gather",
        "ncclDevKernel_AllGather_RING_LL": "all_gather",
        "_reduce_scatter_base": "reduce_scatter",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "reduce_scatter",
        "alltoall_base": "all_to_all",
        "all_to_all": "all_to_all",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "broadcast",
        "ncclDevKernel_SendRecv": "send_recv",
        "send": "send",
        "recv": "recv",
        "ncclDevKernel_Reduce_Sum_f32_RING_LL": "reduce",
        "barrier": "barrier",
        "ncclDevKernel_Generic": "other",
    }
    assert {name: comm.collective_kind(name) for name in cases} == cases


def test_dtype_sizes() -> None:
    assert [comm.dtype_bytes(d) for d in ("Float", "BFloat16", "c10::Half", "Long", "Byte", "Double")] == [
        4, 2, 2, 8, 1, 8,
    ]  # fmt: skip
    assert comm.dtype_bytes("NoSuchType") is None and comm.dtype_bytes(None) is None


# -- exposed communication on hand-built intervals --------------------------------------------------------------------


def _kernel(b: TraceBuilder, ts: float, dur: float, *, name: str = "gemm", stream: int = 7, device: int = 0,
            launch_at: float | None = None, tid: int = AUTOGRAD, **args: object) -> dict:  # fmt: skip
    """A kernel on ``stream`` of ``device`` launched from ``tid`` at ``launch_at`` (default: 2 us before)."""
    _, gpu = b.launch(ts - 2 if launch_at is None else launch_at, ts, dur, tid=tid, name=name, **args)
    gpu["tid"], gpu["pid"] = stream, device
    gpu["args"].update(stream=stream, device=device)
    return gpu


def _overlap_trace(tmp_path: Path) -> Path:
    """One step whose backward runs five collectives (times in us, device 0 unless said):

    A [100, 110) under compute [95, 120): fully hidden; B [200, 220) with compute [210, 230): half hidden;
    C [300, 310) alone on device 0 (device 1 computes meanwhile, which does not hide it);
    D [400, 430) with compute [405, 420) and [410, 425) on two streams: 20 us hidden, not 15 + 15;
    E [500, 510) and E' [505, 515) on two comm streams, no compute: 20 us of kernels, 15 us of communication.
    """
    b = TraceBuilder()
    b.annotation("ProfilerStep#3", 0, 600)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 10, 580, tid=AUTOGRAD)
    for ts, dur in ((100, 10), (200, 20), (300, 10), (400, 30), (500, 10)):
        _kernel(b, ts, dur, name=NCCL, stream=COMM_STREAM)
    _kernel(b, 505, 10, name=NCCL, stream=COMM_STREAM + 1)
    _kernel(b, 95, 25)
    _kernel(b, 210, 20)
    _kernel(b, 300, 10, device=1)
    _kernel(b, 405, 15)
    _kernel(b, 410, 15, stream=8)
    return b.write(tmp_path / "overlap.json")


def test_exposed_per_collective_ground_truth(tmp_path: Path) -> None:
    table = profparse.load(_overlap_trace(tmp_path)).collectives
    got = list(zip(table["ts_ns"] // US - table["ts_ns"].min() // US + 100, table["overlapped_ns"] // US,
                   table["exposed_ns"] // US, strict=True))  # fmt: skip
    assert got == [(100, 10, 0), (200, 10, 10), (300, 0, 10), (400, 20, 10), (500, 0, 10), (505, 0, 10)]
    assert (table["overlapped_ns"] + table["exposed_ns"] == table["dur_ns"]).all()
    assert set(table["kind"]) == {"all_reduce"} and set(table["stage"]) == {"backward"}
    assert (table["step"] == 3).all() and (table["device"] == 0).all()


def test_comm_exposure_ground_truth(tmp_path: Path) -> None:
    exposure = profparse.load(_overlap_trace(tmp_path)).comm_exposure
    step = exposure[exposure["scope"] == "step"]
    assert len(step) == 1
    row = step.iloc[0]
    assert (row["step"], row["stage"], row["device"], row["comm_count"]) == (3, "backward", 0, 6)
    assert row["comm_kernel_ns"] == 90 * US  # 10 + 20 + 10 + 30 + 10 + 10
    assert row["comm_ns"] == 85 * US  # E and E' overlap by 5 us: counted once
    assert row["overlapped_ns"] == 40 * US  # 10 + 10 + 0 + 20 + 0
    assert row["exposed_ns"] == 45 * US
    assert row["overlap_pct"] == pytest.approx(100 * 40 / 85)


def test_exposure_invariants(tmp_path: Path) -> None:
    """exposed + overlapped = collective time in every row; totals add up the step rows."""
    b = TraceBuilder()
    for step, t0 in ((1, 0), (2, 1000)):
        b.annotation(f"ProfilerStep#{step}", t0, 900)
        b.py("nn.Module: Linear_0", t0 + 5, 110)
        b.op("aten::linear", t0 + 10, 100)
        _kernel(b, t0 + 50, 40, tid=100)
        _kernel(b, t0 + 60, 50, name=NCCL, stream=COMM_STREAM, tid=100)  # forward: 30 us hidden
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 200, 500, tid=AUTOGRAD)
        _kernel(b, t0 + 300, 100)
        _kernel(b, t0 + 250, 200, name=NCCL, stream=COMM_STREAM)  # backward: 100 of 200 us hidden
    p = profparse.load(b.write(tmp_path / "two_steps.json"))
    x = p.comm_exposure
    assert (x["overlapped_ns"] + x["exposed_ns"] == x["comm_ns"]).all()
    steps = x[x["scope"] == "step"].groupby("stage", observed=True)[["comm_ns", "overlapped_ns", "exposed_ns"]].sum()
    totals = x[x["scope"] == "total"].set_index("stage")[["comm_ns", "overlapped_ns", "exposed_ns"]]
    assert steps.equals(totals.loc[steps.index])
    assert totals.loc["forward"].tolist() == [100 * US, 60 * US, 40 * US]
    assert totals.loc["backward"].tolist() == [400 * US, 200 * US, 200 * US]
    assert x.loc[x["scope"] == "step", "step"].tolist() == [1, 1, 2, 2]
    table = p.collectives
    assert table["exposed_ns"].sum() == totals["exposed_ns"].sum()  # no collectives overlap each other here


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15), st.integers(0, 1)), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15), st.integers(0, 1)), min_size=0, max_size=12),
)
def test_covered_matches_brute_force(comms: list, computes: list) -> None:
    """The sort + sweep coverage equals counting covered nanoseconds one by one."""
    start = np.array([c[0] for c in comms], dtype=np.int64)
    end = start + np.array([c[1] for c in comms], dtype=np.int64)
    device = np.array([c[2] for c in comms], dtype=np.int64)
    frame = pd.DataFrame(
        {
            "kind": pd.Categorical(["kernel"] * (len(comms) + len(computes)), categories=["kernel", "cpu_op"]),
            "ts_ns": np.concatenate([start, [c[0] for c in computes]]).astype(np.int64),
            "dur_ns": np.concatenate([end - start, [c[1] for c in computes]]).astype(np.int64),
            "device": np.concatenate([device, [c[2] for c in computes]]).astype(np.int64),
            "pid": np.zeros(len(comms) + len(computes), dtype=np.int64),
        }
    )
    from profparse.trace.kinds import KINDS

    frame["kind"] = pd.Categorical(frame["kind"].astype(str), categories=list(KINDS))
    got = comm._covered_by_compute(frame, np.arange(len(comms)), device, start, end)
    grid = np.zeros((2, 80), dtype=bool)
    for s, d, dev in computes:
        grid[dev, s : s + d] = True
    want = [int(grid[dev, s:e].sum()) for s, e, dev in zip(start, end, device, strict=True)]
    assert got.tolist() == want
    group = device.copy()
    pg, ps, pe = group_union(group, start, end)
    for g in np.unique(group):
        line = np.zeros(80, dtype=bool)
        for s, e in zip(start[group == g], end[group == g], strict=True):
            line[s:e] = True
        assert int((pe - ps)[pg == g].sum()) == int(line.sum())


# -- bytes and bandwidth from the collective args ---------------------------------------------------------------------


def _args_trace(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Backward: an all_reduce of 2,048,000 BFloat16 over 4 ranks in 100 us (args on record_param_comms) and an
    all_gather of 1,000 -> 4,000 Float over 4 ranks in 10 us (args on the kernel itself); forward: a broadcast
    without any args."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.py("nn.Module: DistributedDataParallel_0", 2, 40)
    b.op("c10d::broadcast_", 5, 20)
    b.op("record_param_comms", 6, 18)
    _kernel(b, 30, 5, name="ncclKernel_Broadcast_RING_LL_Sum_int8_t", stream=COMM_STREAM, launch_at=7, tid=100)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 100, 800, tid=AUTOGRAD)
    op_args = {
        "Collective name": "allreduce", "In msg nelems": 2_048_000, "Out msg nelems": 2_048_000, "dtype": "BFloat16",
        "Group size": 4, "Process Group Name": "0", "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1, 2, 3]",
    }  # fmt: skip
    b.op("record_param_comms", 110, 30, tid=AUTOGRAD, **op_args)
    _kernel(b, 200, 100, name=NCCL, stream=COMM_STREAM, launch_at=115)
    kernel_args = {
        "Collective name": "_allgather_base", "In msg nelems": 1000, "Out msg nelems": 4000, "dtype": "Float",
        "Group size": 4, "Process Group Name": "1", "Process Group Description": "fsdp_shard",
        "Process Group Ranks": "[0, 1, 2, 3]",
    }  # fmt: skip
    b.op("record_param_comms", 400, 30, tid=AUTOGRAD)
    _kernel(b, 500, 10, name="ncclDevKernel_AllGather_RING_LL", stream=COMM_STREAM, launch_at=405, **kernel_args)
    return b.write(tmp_path / "args.json"), [op_args, kernel_args]


def test_bytes_and_bandwidth_from_args(tmp_path: Path) -> None:
    path, _ = _args_trace(tmp_path)
    p = profparse.load(path)
    table = p.collectives.set_index("kind")
    ar = table.loc["all_reduce"]
    assert ar["bytes"] == 2_048_000 * 2 and ar["args_from"] == "op_args" and ar["group_size"] == 4
    assert ar["algbw_gbps"] == pytest.approx(4_096_000 / 100e-6 / 1e9)  # 40.96 GB/s
    assert ar["busbw_gbps"] == pytest.approx(40.96 * 2 * 3 / 4)
    assert (ar["pg_name"], ar["pg_desc"], ar["pg_ranks"]) == ("0", "default_pg", "[0, 1, 2, 3]")
    ag = table.loc["all_gather"]
    assert ag["bytes"] == 4000 * 4 and ag["args_from"] == "kernel_args"  # S = the whole gathered buffer
    assert ag["algbw_gbps"] == pytest.approx(16_000 / 10e-6 / 1e9)
    assert ag["busbw_gbps"] == pytest.approx(1.6 * 3 / 4)
    bc = table.loc["broadcast"]
    assert bc["bytes"] is pd.NA and bc["args_from"] == "unknown" and pd.isna(bc["algbw_gbps"])
    assert table.loc["all_reduce", "stage"] == "backward" and bc["stage"] == "forward"


def test_unknown_bytes_are_never_zero(tmp_path: Path) -> None:
    """Without collective args: kind from the kernel name, bytes null, and the summary says unknown."""
    p = profparse.load(_overlap_trace(tmp_path))
    assert p.raw.events["collective"].isna().all()
    table = p.collectives
    assert table["bytes"].isna().all() and (table["args_from"] == "unknown").all()
    assert table["algbw_gbps"].isna().all() and table["busbw_gbps"].isna().all()
    data = profparse.outputs.summary.summary_data(p)["communication"]
    assert [(r["kind"], r["count"], r["bytes"]) for r in data["by_stage"]] == [("all_reduce", 6, None)]
    section = render_summary(p)
    section = section[section.index("Communication per stage") :]
    assert "unknown" in section.splitlines()[3]


def test_summary_aggregates_per_stage_and_kind(tmp_path: Path) -> None:
    path, _ = _args_trace(tmp_path)
    p = profparse.load(path)
    data = profparse.outputs.summary.summary_data(p)["communication"]
    rows = {(r["stage"], r["kind"]): r for r in data["by_stage"]}
    assert set(rows) == {("forward", "broadcast"), ("backward", "all_reduce"), ("backward", "all_gather")}
    ar = rows[("backward", "all_reduce")]
    assert (ar["pg"], ar["count"], ar["bytes"], ar["time_ns"]) == ("default_pg", 1, 4_096_000, 100 * US)
    assert ar["busbw_gbps"] == pytest.approx(61.44)
    exposure = {r["stage"]: r for r in data["exposure"]}
    assert exposure["backward"]["exposed_ns"] == 110 * US and exposure["backward"]["overlap_pct"] == 0.0


# -- view ---------------------------------------------------------------------------------------------------------


def test_view_data_and_draw(tmp_path: Path) -> None:
    p = profparse.load(_overlap_trace(tmp_path))
    prepared, reason = view.data(p)
    assert reason is None and view.KIND == "communication"
    frame = prepared["stages"]
    assert frame[["stage", "comm_ns", "overlapped_ns", "exposed_ns"]].values.tolist() == [
        ["backward", 85 * US, 40 * US, 45 * US]
    ]
    fig = view.draw(prepared)
    bars = [patch for patch in fig.axes[0].patches]
    assert len(bars) == 2 and bars[0].get_height() + bars[1].get_height() == pytest.approx(85)  # us
    fig.savefig(tmp_path / "communication.png")
    assert (tmp_path / "communication.png").stat().st_size > 0


def test_view_skips_traces_without_collectives(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    _kernel(b, 20, 10, tid=100)
    prepared, reason = view.data(profparse.load(b.write(tmp_path / "plain.json")))
    assert prepared is None and "no collective" in reason


# -- the real DDP trace ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not A100.exists(), reason="a100 DDP trace not present")
def test_a100_ddp_all_reduce_in_backward() -> None:
    p = parsed(A100)
    table = p.collectives
    kernels = p.kernels
    nccl = kernels[kernels["name"].astype(str).str.startswith("nccl")]
    assert len(table) == len(nccl) == 21
    by = table.groupby(["stage", "kind"], observed=True).size().to_dict()
    assert by == {("forward", "broadcast"): 6, ("backward", "all_reduce"): 15}  # DDP: buffers, then gradient buckets
    x = p.comm_exposure
    assert (x["overlapped_ns"] + x["exposed_ns"] == x["comm_ns"]).all()
    backward = x[(x["scope"] == "total") & (x["stage"] == "backward")].iloc[0]
    assert backward["comm_ns"] == table.loc[table["kind"] == "all_reduce", "dur_ns"].sum()
    assert 0 < backward["overlapped_ns"] < backward["comm_ns"]
    ar = table[table["kind"] == "all_reduce"]
    assert ar["args_from"].isin(["kernel_args", "op_args"]).all() and (ar["group_size"] == 2).all()
    assert (ar["bytes"] == ar["in_nelems"] * 4).all() and (ar["dtype"] == "Float").all()
    assert (ar["busbw_gbps"] > 0).all() and (ar["pg_desc"] == "default_pg").all()
    assert (ar["busbw_gbps"] == ar["algbw_gbps"]).all()  # all_reduce over 2 ranks: 2(n-1)/n = 1
    # the sizes are those of the launching record_param_comms (the kernel repeats them in this trace)
    ops = p.events.set_index("trace_index").loc[ar["op_trace_index"].to_numpy()]
    assert (ops["name"] == "record_param_comms").all()
    launcher = p.raw.events.set_index("trace_index").loc[ar["op_trace_index"].to_numpy()]
    assert launcher["comm_in_nelems"].tolist() == ar["in_nelems"].tolist()
    assert set(launcher["collective"].astype(str)) == {"allreduce"}


@pytest.mark.skipif(not A100.exists(), reason="a100 DDP trace not present")
def test_a100_overlap_matches_hta() -> None:
    """HTA's ``get_comm_comp_overlap`` (compute kernels only, whole rank, nanosecond times kept) gives the same
    overlap % as profparse's sweep restricted to kernels."""
    pytest.importorskip("hta")
    from hta_oracle import hta_loaded

    hta = hta_loaded(A100, no_rounding=True).get_comm_comp_overlap(visualize=False)
    p = parsed(A100)
    table = p.collectives
    start = table["ts_ns"].to_numpy()
    end = start + table["dur_ns"].to_numpy()
    _, ps, pe = group_union(np.zeros(len(start), dtype=np.int64), start, end)
    device = np.zeros(len(ps), dtype=np.int64)
    rows = comm.collective_rows(p.raw.events)
    covered = comm._covered_by_compute(p.raw.events, rows, device, ps, pe, kinds=frozenset({"kernel"}))
    ours = 100 * covered.sum() / (pe - ps).sum()
    assert ours == pytest.approx(float(hta["comp_comm_overlap_pctg"].iloc[0]), abs=0.005)  # HTA rounds to 0.01
    x = p.comm_exposure
    total = x[x["scope"] == "total"]
    assert 100 * total["overlapped_ns"].sum() / total["comm_ns"].sum() >= ours  # memcpy/memset hide some more
