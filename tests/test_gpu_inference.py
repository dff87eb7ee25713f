"""Stages for GPU activity whose launch is not in the trace, by inference (profparse.stages.gpu_inference)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from conftest import parsed
from tracebuilder import AUTOGRAD, GPU_PID, STREAM, TraceBuilder

import profparse

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"}
INFERRED = (
    *("gpu.sequence_match", "gpu.neighbours", "gpu.forward_only"),
    *("gpu.collective_order", "gpu.collective_neighbours"),  # collectives launched before the trace
)


def train_step(b: TraceBuilder, step: int, t0: float, lag: float = 0) -> None:
    """A 100 us step whose stages share kernel names (gemm, add), so that a name alone does not tell the stage.
    Each kernel starts 2 us + ``lag`` after its launch."""
    b.annotation(f"ProfilerStep#{step}", t0, 100)
    b.py("nn.Module: Block_0", t0 + 1, 28)
    for i, name in enumerate(("gemm", "relu", "gemm", "add")):
        b.op(f"aten::op{i}", t0 + 2 + 6 * i, 5)
        b.launch(t0 + 3 + 6 * i, t0 + 5 + 6 * i + lag, 5, name=name)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 30, 38, tid=AUTOGRAD)
    for i, name in enumerate(("add", "gemm", "relu_bwd", "gemm", "gemm")):
        b.launch(t0 + 31 + 7 * i, t0 + 33 + 7 * i + lag, 6, tid=AUTOGRAD, name=name)
    b.annotation("Optimizer.step#AdamW.step", t0 + 72, 26)
    b.op("aten::_foreach_add_", t0 + 73, 24)
    for i, name in enumerate(("add", "adam", "add")):
        b.launch(t0 + 74 + 7 * i, t0 + 76 + 7 * i + lag, 4, name=name)


def three_steps(lag: float = 0) -> TraceBuilder:
    b = TraceBuilder()
    for step in range(3):
        train_step(b, step + 1, 100 * step, lag)
    return b


def gpu_kernel(b: TraceBuilder, name: str, ts: float, dur: float, cat: str = "kernel") -> None:
    """GPU activity with no runtime call in the trace."""
    b.events.append(
        {"ph": "X", "cat": cat, "name": name, "pid": GPU_PID, "tid": STREAM, "ts": ts, "dur": dur,
         "args": {"correlation": 990000 + len(b.events), "stream": STREAM, "device": 0}}
    )  # fmt: skip


def cut_host_before(doc: dict, cut_us: float) -> tuple[dict, np.ndarray]:
    """The document without the host events that start before ``cut_us`` (GPU tracks and metadata kept whole);
    and, per kept event, its index in the original ``traceEvents``."""
    events = doc["traceEvents"]
    gpu = {(e.get("pid"), e.get("tid")) for e in events if e.get("cat") in GPU_CATS}
    kept = [
        i
        for i, e in enumerate(events)
        if e.get("ph") == "M" or (e.get("pid"), e.get("tid")) in gpu or "ts" not in e or float(e["ts"]) >= cut_us
    ]
    return {**doc, "traceEvents": [events[i] for i in kept]}, np.array(kept, dtype=np.int64)


def write(doc: dict, path) -> str:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return str(path)


def gpu_rows(p: profparse.ParsedTrace) -> pd.DataFrame:
    e = p.events
    return e[e["kind"].isin(["kernel", "gpu_memcpy", "gpu_memset"])].sort_values("ts_ns", kind="stable")


def checks(p: profparse.ParsedTrace) -> dict[str, dict]:
    return {r["check"]: r for r in p.warnings.to_dict("records")}


def compare_cut(full: profparse.ParsedTrace, cut: profparse.ParsedTrace, kept: np.ndarray) -> pd.DataFrame:
    """Per GPU event of the cut trace: its stage, rule and step there and in the full trace, and whether its launch
    was lost by the cut."""
    c = gpu_rows(cut)
    f = full.events.set_index("trace_index").loc[kept[c["trace_index"].to_numpy()]]
    return pd.DataFrame(
        {
            "dur_ns": c["dur_ns"].to_numpy(),
            "stage": c["stage"].astype(str).to_numpy(),
            "rule": c["stage_rule"].astype(str).to_numpy(),
            "step": c["step"].to_numpy(),
            "full_stage": f["stage"].astype(str).to_numpy(),
            "full_step": f["step"].to_numpy(),
            "lost": c["launch_trace_index"].isna().to_numpy() & f["launch_trace_index"].notna().to_numpy(),
        }
    )


def test_cut_off_first_step_gets_its_stages_back(tmp_path):
    b = three_steps()
    full = profparse.parse(b.write(tmp_path / "full.json"))
    doc, kept = cut_host_before(b.document(), 100)  # step 1's host side is gone: ProfilerStep#1, ops, launches
    cut = profparse.parse(write(doc, tmp_path / "cut.json.gz"))
    t = compare_cut(full, cut, kept)
    lost = t[t["lost"]]
    assert len(lost) == 12  # all of step 1's GPU work
    assert (lost["rule"] == "gpu.sequence_match").all()
    assert list(lost["stage"]) == list(lost["full_stage"])
    assert list(lost["full_stage"]) == ["forward"] * 4 + ["backward"] * 5 + ["optimizer"] * 3
    assert (lost["step"] == 1).all() and (lost["full_step"] == 1).all()  # the step before the first window
    full_ns = full.stage_summary.query("scope == 'step' and step == 1").set_index("stage")["gpu_time_ns"]
    cut_ns = cut.stage_summary.query("scope == 'step' and step == 1").set_index("stage")["gpu_time_ns"]
    assert full_ns.to_dict() == cut_ns.to_dict()  # exact ns per stage
    assert (t.loc[~t["lost"], "rule"].isin(INFERRED)).sum() == 0  # linked events keep their own rule
    found = checks(cut)
    assert found["gpu_inferred.sequence_match"]["count"] == 12
    assert found["gpu_inferred.sequence_match"]["value"] == lost["dur_ns"].sum()
    assert "gpu_unlinked" not in found


def test_step_of_a_late_gpu_is_the_step_of_its_estimated_launch(tmp_path):
    b = three_steps(lag=30)  # the GPU runs 30 us behind: step 1's optimizer kernels run inside step 2's window
    full = profparse.parse(b.write(tmp_path / "full.json"))
    doc, kept = cut_host_before(b.document(), 100)
    t = compare_cut(full, profparse.parse(write(doc, tmp_path / "cut.json.gz")), kept)
    lost = t[t["lost"]]
    assert len(lost) == 12 and list(lost["stage"]) == list(lost["full_stage"])
    assert (lost["full_step"] == 1).all() and (lost["step"] == 1).all()


def test_matching_stays_on_the_stream(tmp_path):
    b = three_steps()
    gpu_kernel(b, "adam", 150, 1)  # 'adam' is optimizer work on stream 7, but this one runs on stream 8 alone
    b.events[-1]["tid"] = b.events[-1]["args"]["stream"] = STREAM + 1
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = p.kernels[p.kernels["stream"] == STREAM + 1]
    assert list(k["stage_rule"]) == ["other.gpu_unlinked"]
    b.events[-1]["tid"] = b.events[-1]["args"]["stream"] = STREAM  # the same kernel on stream 7: the name decides
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = p.kernels[(p.kernels["name"] == "adam") & p.kernels["launch_trace_index"].isna()]
    assert (k["stage"].iloc[0], k["stage_rule"].iloc[0]) == ("optimizer", "gpu.sequence_match")


def test_unlinked_between_same_stage_neighbours(tmp_path):
    b = three_steps()
    gpu_kernel(b, "custom_bwd_fused_only_here", 153.2, 0.5)  # between backward's kernels of step 2 (gemm, relu_bwd)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = p.kernels.set_index("name").loc["custom_bwd_fused_only_here"]
    assert (k["stage"], k["stage_rule"], k["step"]) == ("backward", "gpu.neighbours", 2)
    found = checks(p)
    assert found["gpu_inferred.neighbours"]["count"] == 1 and found["gpu_inferred.neighbours"]["value"] == 500
    assert "gpu_unlinked" not in found


def test_unseen_name_between_different_stages_stays_unlinked(tmp_path):
    b = three_steps()
    gpu_kernel(b, "mystery_kernel", 129.5, 2)  # after step 2's last forward kernel, before its first backward one
    p = profparse.parse(b.write(tmp_path / "t.json"))
    k = p.kernels.set_index("name").loc["mystery_kernel"]
    assert (k["stage"], k["stage_rule"]) == ("other", "other.gpu_unlinked")
    found = checks(p)
    assert found["gpu_unlinked"]["count"] == 1
    assert found["gpu_unlinked"]["value"] == pytest.approx(2000 / p.kernels["dur_ns"].sum())
    assert not any(name.startswith("gpu_inferred") for name in found)


def forward_only_trace(with_memcpy: bool = False) -> TraceBuilder:
    b = TraceBuilder(autograd_thread=False)
    gpu_kernel(b, "flash_attn_prefill", 0, 3)  # launched before the profiler started: nothing to match or sit between
    gpu_kernel(b, "rotary_embedding", 3.5, 1)
    if with_memcpy:
        gpu_kernel(b, "Memcpy HtoD (Pageable -> Device)", 5, 1, cat="gpu_memcpy")
    for step in range(2):
        t0 = 10 + 50 * step
        b.annotation(f"ProfilerStep#{step}", t0, 50)
        b.py("nn.Module: Decoder_0", t0 + 1, 40)
        for i, name in enumerate(("gemm", "softmax", "gemm")):
            b.op("aten::linear", t0 + 2 + 10 * i, 8)
            b.launch(t0 + 3 + 10 * i, t0 + 5 + 10 * i, 6, name=name)
    return b


def test_forward_only_trace_unlinked_kernels_are_forward(tmp_path):
    p = profparse.parse(forward_only_trace(with_memcpy=True).write(tmp_path / "t.json"))
    e = gpu_rows(p).set_index("name")
    for name in ("flash_attn_prefill", "rotary_embedding"):
        assert (e.loc[name, "stage"], e.loc[name, "stage_rule"]) == ("forward", "gpu.forward_only")
    # only kernels: an unlinked input copy is not claimed for forward
    assert e.loc["Memcpy HtoD (Pageable -> Device)", "stage_rule"] == "other.gpu_unlinked"
    found = checks(p)
    assert found["gpu_inferred.forward_only"]["count"] == 2 and found["gpu_inferred.forward_only"]["value"] == 4000
    assert found["gpu_unlinked"]["count"] == 1


def test_training_trace_is_not_forward_only(tmp_path):
    b = three_steps()
    gpu_kernel(b, "flash_attn_prefill", 0.5, 3)  # before all linked work: no neighbours, a name seen nowhere else
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert p.kernels.set_index("name").loc["flash_attn_prefill", "stage_rule"] == "other.gpu_unlinked"


def test_backward_kernel_names_block_forward_only(tmp_path):
    b = forward_only_trace()
    gpu_kernel(b, "cutlass_wgrad_kernel", 4.6, 1)  # a backward kernel among the unlinked: not an inference trace
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert set(p.kernels.set_index("name").loc[["flash_attn_prefill", "cutlass_wgrad_kernel"], "stage_rule"]) == {
        "other.gpu_unlinked"
    }


def test_inference_checks_add_up_to_the_launchless_gpu_time(tmp_path):
    b = three_steps()
    gpu_kernel(b, "custom_bwd_fused_only_here", 153.2, 0.5)
    gpu_kernel(b, "mystery_kernel", 129.5, 2)
    doc, _ = cut_host_before(b.document(), 100)
    p = profparse.parse(write(doc, tmp_path / "cut.json.gz"))
    launchless = gpu_rows(p)
    launchless = launchless[launchless["launch_trace_index"].isna()]
    found = checks(p)
    inferred_ns = sum(found[f"gpu_inferred.{r.removeprefix('gpu.')}"]["value"] for r in INFERRED[:2])
    unlinked_ns = found["gpu_unlinked"]["value"] * p.kernels["dur_ns"].sum()
    assert inferred_ns + unlinked_ns == pytest.approx(launchless["dur_ns"].sum())
    by_rule = launchless.groupby(launchless["stage_rule"].astype(str))["dur_ns"].sum()
    assert by_rule.to_dict() == {"gpu.sequence_match": 62_000, "gpu.neighbours": 500, "other.gpu_unlinked": 2_000}


def test_no_unlinked_activity_changes_nothing(tmp_path):
    p = profparse.parse(three_steps().write(tmp_path / "t.json"))
    assert not p.events["stage_rule"].astype(str).isin(INFERRED).any()
    assert set(p.events["stage_rule"].cat.categories) >= set(INFERRED)  # the names are known either way


# -- the shared GPU traces, with the first part of a step cut off -------------------------------------------------


def test_shared_trace_with_a_step_cut_off(shared_trace, tmp_path):
    full = parsed(shared_trace)
    first = full.steps.iloc[0]
    cut_ns = first["start_ns"] + 0.9 * (first["end_ns"] - first["start_ns"])
    with gzip.open(shared_trace) as f:
        doc = json.load(f)
    doc, kept = cut_host_before(doc, cut_ns / 1000)
    cut = profparse.parse(write(doc, tmp_path / "cut.json.gz"))
    t = compare_cut(full, cut, kept)
    lost = t[t["lost"]]
    assert len(lost) > 0
    total = t["dur_ns"].sum()
    agree = lost["stage"] == lost["full_stage"]
    inferred = lost["rule"].isin(INFERRED)
    per_rule = {r: int(lost.loc[lost["rule"] == r, "dur_ns"].sum()) for r in (*INFERRED, "other.gpu_unlinked")}
    print(
        f"\n{shared_trace.name}: lost launch {lost['dur_ns'].sum() / total:.1%} of GPU time; "
        + ", ".join(f"{r} {ns} ns ({ns / total:.1%})" for r, ns in per_rule.items())
        + f"; stage agreement {lost.loc[agree, 'dur_ns'].sum() / lost['dur_ns'].sum():.2%}"
        + f", step agreement {lost.loc[lost['step'] == lost['full_step'], 'dur_ns'].sum() / lost['dur_ns'].sum():.2%}"
    )
    # what is inferred is right, whatever the trace
    assert lost.loc[inferred & agree, "dur_ns"].sum() >= 0.95 * lost.loc[inferred, "dur_ns"].sum()
    assert set(lost.loc[~inferred, "rule"]) <= {"other.gpu_unlinked"}
    if full.kernels["step"].dropna().nunique() >= 2:  # the GPU work repeats, so the lost part can be recovered
        assert lost.loc[agree, "dur_ns"].sum() >= 0.95 * lost["dur_ns"].sum()
        assert t.loc[t["rule"] == "other.gpu_unlinked", "dur_ns"].sum() <= 0.05 * total
    else:  # mi250_minitoy: all its GPU work is in one step; nothing repeats, nothing is guessed
        assert shared_trace.name == "mi250_minitoy.json.gz"
        assert not inferred.any() or lost.loc[inferred, "dur_ns"].sum() < 0.05 * lost["dur_ns"].sum()
