"""Collective kernels whose launch is not in the trace take their c10d op's stage (profparse.stages.collective_match).

Hand-built RCCL-style DDP traces, where every collective kernel's op (and so its stage and step) is known, and the
shared GPU traces rewritten so that collective kernels lose their launching runtime calls (and, on a harder variant,
their External ids and the host side of the first part of a step): the uncut trace's stages are the ground truth.
"""

from __future__ import annotations

import copy
import gzip
import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import parsed
from test_gpu_inference import compare_cut, cut_host_before, write
from tracebuilder import AUTOGRAD, GPU_PID, MAIN, TraceBuilder

import profparse

RCCL = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
COMM_STREAM, SIDE_STREAM = 9, 10
MATCH = "gpu.collective_match"
COMM_KERNEL = re.compile(r"(?i)nccl|rccl|msccl")
#: per step: (collective, op start, kernel start, kernel duration, thread, stage), times in us from the step start
STEP_COLLECTIVES = (
    ("broadcast", 2, 12, 7, MAIN, "forward"),
    ("allreduce", 100, 104, 9, AUTOGRAD, "backward"),
    ("allreduce", 115, 122, 11, AUTOGRAD, "backward"),
    ("allreduce", 155, 165, 13, MAIN, "optimizer"),
)
STEP_US = 200


def collective(b: TraceBuilder, name: str, ts: float, tid: int, pg: str, seq: int | None, ext: int) -> dict:
    """A c10d op as PyTorch records it: ``c10d::<name>_`` > ``record_param_comms`` (collective args) > ``nccl:...``;
    returns the args a kernel may carry too."""
    args = {"Collective name": name, "Process Group Name": pg, "Group size": 2, "dtype": "Float"}
    if seq is not None:
        args["Seq"] = seq
    b.op(f"c10d::{name}_", ts, 8, tid)
    b.op("record_param_comms", ts + 1, 6, tid, **args, **{"External id": ext})
    b.span(f"nccl:{name}", ts + 2, 4, "user_annotation", tid)
    return args


def ddp_trace(
    steps: int = 3,
    *,
    seq: bool = False,
    ext: bool = False,
    launched: tuple[int, ...] = (),
    missing: tuple[int, ...] = (),
    missing_ops: tuple[int, ...] = (),
    optimizer_pg: str = "0",
) -> tuple[TraceBuilder, list[tuple[str, int]]]:
    """Training steps whose collectives run RCCL kernels on their group's stream, with a correlation id but no
    runtime call unless their index is in ``launched``; ``missing`` kernels and ``missing_ops`` ops are left out.
    Kernels carry ``Seq`` and the group (``seq``) and the op's External id (``ext``). Returns the builder and the
    (stage, step) of each kernel written, in start order."""
    b = TraceBuilder()
    expected: list[tuple[str, int]] = []
    for s in range(steps):
        t0, step = STEP_US * s, s + 1
        b.annotation(f"ProfilerStep#{step}", t0, STEP_US - 1)
        b.py("nn.Module: DistributedDataParallel_0", t0 + 1, 60)
        b.op("aten::linear", t0 + 20, 10)
        b.launch(t0 + 21, t0 + 22, 20, name="gemm")
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 70, 70, tid=AUTOGRAD)
        b.launch(t0 + 72, t0 + 75, 20, tid=AUTOGRAD, name="gemm_bwd")
        b.annotation("Optimizer.step#SGD.step", t0 + 150, 45)
        b.launch(t0 + 180, t0 + 182, 5, name="sgd_kernel")
        b.op("record_param_comms", t0 + 145, 2, MAIN, **{"Collective name": "wait", "Process Group Name": "0"})
        for i, (name, op_ts, k_ts, k_dur, tid, stage) in enumerate(STEP_COLLECTIVES):
            index = len(STEP_COLLECTIVES) * s + i
            pg = optimizer_pg if stage == "optimizer" else "0"
            ext_id = 50_000 + index
            args = collective(b, name, t0 + op_ts, tid, pg, index + 1 if seq else None, ext_id)
            if index in missing_ops:
                del b.events[-3:]
            if index in missing:
                continue
            b.correlation += 1
            if index in launched:
                b.span("hipExtLaunchKernel", t0 + op_ts + 3, 1, "cuda_runtime", tid, correlation=b.correlation)
            stream = COMM_STREAM if pg == "0" else SIDE_STREAM
            kernel_args = {"correlation": b.correlation, "stream": stream, "device": 0}
            kernel_args.update({"Seq": args["Seq"], "Process Group Name": pg} if seq else {})
            kernel_args.update({"External id": ext_id} if ext else {})
            b.events.append(
                {"ph": "X", "cat": "kernel", "name": RCCL, "pid": GPU_PID, "tid": stream, "ts": t0 + k_ts,
                 "dur": k_dur + 0.1 * s, "args": kernel_args}
            )  # fmt: skip
            expected.append((stage, step))
    return b, expected


def comm_kernels(p: profparse.ParsedTrace) -> pd.DataFrame:
    k = p.kernels
    return k[k["name"].astype(str) == RCCL].sort_values("ts_ns", kind="stable")


def stages(p: profparse.ParsedTrace) -> list[tuple[str, int]]:
    k = comm_kernels(p)
    return list(zip(k["stage"].astype(str), k["step"].astype("Int64").fillna(-1).astype(int), strict=True))


def checks(p: profparse.ParsedTrace) -> dict[str, dict]:
    return {r["check"]: r for r in p.warnings.to_dict("records")}


def test_rccl_kernels_without_launches_take_their_ops_stage(tmp_path):
    b, expected = ddp_trace()
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = comm_kernels(p)
    assert len(k) == 12 and (k["stage_rule"] == MATCH).all()
    assert stages(p) == expected  # order and time: no Seq, no External id, no launch
    assert [s for s, _ in expected[:4]] == ["forward", "backward", "backward", "optimizer"]
    found = checks(p)
    assert found["gpu_inferred.collective_match"]["count"] == 12
    assert found["gpu_inferred.collective_match"]["value"] == k["dur_ns"].sum()
    assert "gpu_unlinked" not in found


def test_linked_collectives_anchor_the_order(tmp_path):
    # kernel 4 (step 2's broadcast) never ran: five ops, four kernels before the next linked one (5)
    b, expected = ddp_trace(launched=(5, 10), missing=(4,))
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = comm_kernels(p)
    linked = k["launch_trace_index"].notna().to_numpy()
    assert linked.sum() == 2 and (k.loc[~linked, "stage_rule"] == MATCH).all()
    assert stages(p) == expected
    # without the anchor the surplus op shifts every later kernel by one: kernel 5 would take the broadcast's stage
    b, expected = ddp_trace(missing=(4,))
    assert stages(profparse.parse(b.write(tmp_path / "t2.json"))) != expected


def test_seq_matches_across_a_missing_kernel(tmp_path):
    b, expected = ddp_trace(seq=True, missing=(5,))
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert (comm_kernels(p)["stage_rule"] == MATCH).all()
    assert stages(p) == expected


def test_external_id_matches_across_a_missing_kernel(tmp_path):
    b, expected = ddp_trace(ext=True, missing=(5,))
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert (comm_kernels(p)["stage_rule"] == MATCH).all()
    assert stages(p) == expected


def test_groups_stay_on_their_streams(tmp_path):
    # the optimizer's all-reduce runs in group 1 on its own stream; one linked kernel pairs stream 9 with group 0,
    # which leaves stream 10 and group 1 to each other
    b, expected = ddp_trace(launched=(0,), optimizer_pg="1")
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = comm_kernels(p)
    assert set(k.loc[k["stream"] == SIDE_STREAM, "stage"].astype(str)) == {"optimizer"}
    assert (k["stage_rule"].iloc[1:] == MATCH).all()
    assert stages(p) == expected


def test_kernels_whose_ops_came_before_the_trace(tmp_path):
    # the first three ops are not in the trace (issued before it began): the kernels align from the end
    b, expected = ddp_trace(missing_ops=(0, 1, 2))
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = comm_kernels(p)
    assert not (k["stage_rule"].iloc[:3] == MATCH).any()
    assert (k["stage_rule"].iloc[3:] == MATCH).all()
    assert stages(p)[3:] == expected[3:]


def test_an_op_after_its_kernel_is_no_match(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.launch(1, 2, 5, name="gemm")
    collective(b, "allreduce", 50, MAIN, "0", None, 7)
    b.events.append(
        {"ph": "X", "cat": "kernel", "name": RCCL, "pid": GPU_PID, "tid": COMM_STREAM, "ts": 10, "dur": 5,
         "args": {"correlation": 99, "stream": COMM_STREAM, "device": 0}}
    )  # fmt: skip
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert comm_kernels(p)["stage_rule"].tolist() == ["other.gpu_unlinked"]


def test_no_unlinked_collective_changes_nothing(tmp_path):
    b, expected = ddp_trace(launched=tuple(range(12)))
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert not (p.events["stage_rule"] == MATCH).any()
    assert stages(p) == expected  # the linked kernels' own stages are the ground truth the matching reproduces
    assert MATCH in set(p.events["stage_rule"].cat.categories)


# -- the shared GPU traces, collective launches removed ----------------------------------------------------------


def drop_collective_launches(doc: dict, before_us: float | None = None, strip_external_id: bool = False):
    """The document without the runtime calls that launched collective kernels (starting before ``before_us``), the
    kernels' External ids removed on request; and, per kept event, its index in the given document."""
    events = doc["traceEvents"]
    lost = set()
    for e in events:
        if e.get("cat") == "kernel" and COMM_KERNEL.search(e.get("name", "")):
            if before_us is None or float(e["ts"]) < before_us:
                lost.add(e["args"].get("correlation"))
            if strip_external_id:
                e["args"] = {k: v for k, v in e["args"].items() if k != "External id"}
    runtime = {"cuda_runtime", "cuda_driver", "Runtime"}
    kept = [i for i, e in enumerate(events) if not (e.get("cat") in runtime and e["args"].get("correlation") in lost)]
    return {**doc, "traceEvents": [events[i] for i in kept]}, np.array(kept, dtype=np.int64)


def with_collectives(shared_trace) -> tuple[profparse.ParsedTrace, dict]:
    full = parsed(shared_trace)
    if not full.kernels["name"].astype(str).str.contains(COMM_KERNEL).any():
        pytest.skip("no collective kernels in this trace")
    with gzip.open(shared_trace) as f:
        return full, json.load(f)


def agreement(full, cut, kept) -> pd.DataFrame:
    t = compare_cut(full, cut, kept)
    k = cut.kernels.sort_values("ts_ns", kind="stable")
    t["comm"] = k["name"].astype(str).str.contains(COMM_KERNEL).to_numpy()
    t["stage_ok"] = t["stage"] == t["full_stage"]
    # a step cut away with the host side leaves its ops outside every step: compare steps only where the cut kept it
    window = t["full_step"].isin(cut.steps["step"])
    t["step_ok"] = np.where(window, t["step"] == t["full_step"], t["step"].isna())
    return t


@pytest.mark.parametrize(
    "variant", ["first_step_launches", "all_launches_and_external_ids", "host_cut_and_all_launches"]
)
def test_shared_trace_collectives_without_launches(shared_trace, variant, tmp_path):
    full, doc = with_collectives(shared_trace)
    first = full.steps.iloc[0]
    kept = np.arange(len(doc["traceEvents"]))
    if variant == "host_cut_and_all_launches":  # the host side of the first half of the first step is gone too
        doc, kept = cut_host_before(doc, (first["start_ns"] + 0.5 * (first["end_ns"] - first["start_ns"])) / 1000)
    before = first["end_ns"] / 1000 if variant == "first_step_launches" else None
    doc, more = drop_collective_launches(copy.deepcopy(doc), before, strip_external_id=variant != "first_step_launches")
    kept = kept[more]
    cut = profparse.parse(write(doc, tmp_path / "cut.json.gz"))
    t = agreement(full, cut, kept)
    lost = t[t["comm"] & t["lost"]]
    matched = t[t["rule"] == MATCH]
    total = t["dur_ns"].sum()
    unlinked = t.loc[t["rule"] == "other.gpu_unlinked", "dur_ns"].sum()
    print(
        f"\n{shared_trace.name} {variant}: {len(lost)} collective kernels lost their launch "
        f"({lost['dur_ns'].sum() / total:.1%} of GPU time), {len(matched)} matched, stage agreement "
        f"{matched['stage_ok'].mean():.0%}, unstaged {unlinked / total:.2%} of GPU time"
    )
    assert len(lost) > 0 and set(matched.index) <= set(lost.index)
    assert matched["stage_ok"].all() and matched["step_ok"].all()
    if variant != "host_cut_and_all_launches":  # every op is there: every kernel is matched
        assert len(matched) == len(lost)
    assert unlinked <= 0.01 * total
