"""FLOPs per op, MFU/HFU per stage and step, modules, GEMMs: a hand-built trace with known answers, invariants and
real traces."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, SAMPLE_TRACES, SHARED_TRACES, parsed
from tracebuilder import AUTOGRAD, TraceBuilder, backward_node, forward_op

import profparse

BF16 = "c10::BFloat16"
H100_BF16 = 989.5  # TFLOP/s, the peak table's H100 SXM row
ADDMM = 2 * 128 * 256 * 512
BMM = 2 * 8 * 64 * 32 * 64
MM_BWD = 2 * 128 * 512 * 256  # each of the two matmuls of AddmmBackward0
RECOMPUTE = 2 * 64 * 64 * 64
FORWARD = ADDMM + BMM
BACKWARD_HW = 2 * MM_BWD + 2 * BMM + RECOMPUTE  # BmmBackward0 has no shapes inside: 2x its forward op
BACKWARD_MODEL = BACKWARD_HW - RECOMPUTE


def shapes(dims, types, concrete=None):
    return {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or [""] * len(dims)}


def build(path, device="NVIDIA H100 80GB HBM3"):
    """One step: Linear_0 (linear -> addmm, 10 us kernel), Attn_0 (bmm, 4 us); backward: AddmmBackward0 with two
    aten::mm (8 us each), BmmBackward0 with no shapes (6 us), a recomputed Linear_1 (mm, 2 us); AdamW (5 us)."""
    b = TraceBuilder()
    b.header["deviceProperties"] = [{"id": 0, "name": device}]
    b.annotation("ProfilerStep#1", 0, 1000)
    b.py("nn.Module: Linear_0", 10, 100)
    lin = forward_op(b, "aten::linear", 11, 80, seq=1)
    lin["args"].update(shapes([[128, 256], [512, 256], [512]], [BF16] * 3))
    b.op("aten::t", 12, 5, **shapes([[512, 256]], [BF16]))
    b.op("aten::addmm", 20, 60, **shapes([[512], [128, 256], [256, 512], [], []], [BF16] * 3 + ["Scalar"] * 2))
    b.launch(21, 30, 10, name="gemm_fwd")
    b.py("nn.Module: Attn_0", 120, 100)
    bmm = forward_op(b, "aten::bmm", 121, 50, seq=2)
    bmm["args"].update(shapes([[8, 64, 32], [8, 32, 64]], [BF16] * 2))
    b.launch(122, 130, 4, name="bmm_fwd")
    backward_node(b, "AddmmBackward0", 300, 100, seq=1)
    b.op("aten::mm", 310, 20, tid=AUTOGRAD, **shapes([[128, 512], [512, 256]], [BF16] * 2))
    b.launch(311, 315, 8, tid=AUTOGRAD, name="gemm_dgrad")
    b.op("aten::mm", 340, 20, tid=AUTOGRAD, **shapes([[512, 128], [128, 256]], [BF16] * 2))
    b.launch(341, 345, 8, tid=AUTOGRAD, name="gemm_wgrad")
    backward_node(b, "BmmBackward0", 420, 40, seq=2)
    b.launch(425, 430, 6, tid=AUTOGRAD, name="bmm_bwd")
    backward_node(b, "CheckpointFunctionBackward", 465, 60, seq=99)
    b.py("nn.Module: Linear_1", 470, 40, tid=AUTOGRAD)
    b.op("aten::mm", 475, 20, tid=AUTOGRAD, **shapes([[64, 64], [64, 64]], [BF16] * 2))
    b.launch(476, 480, 2, tid=AUTOGRAD, name="gemm_recompute")
    b.annotation("Optimizer.step#AdamW.step", 700, 50)
    b.op("aten::_foreach_add_", 701, 40, **shapes([[], [], []], ["TensorList", "TensorList", "Scalar"]))
    b.launch(702, 705, 5, name="adam_kernel")
    return b.write(path)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return build(tmp_path_factory.mktemp("eff") / "step.json")


def rows(eff, scope, stage=None):
    out = eff[eff["scope"] == scope]
    return out if stage is None else out[out["stage"] == stage]


def test_flops_per_op_counted_once_at_the_innermost_op(synthetic):
    p = profparse.parse(synthetic)
    f = p.flops
    counted = f[f["status"] == "counted"]
    assert sorted(counted["name"].astype(str)) == ["aten::addmm", "aten::bmm", "aten::mm", "aten::mm", "aten::mm"]
    assert "aten::linear" not in set(f["name"].astype(str))  # its FLOPs are addmm's: not counted twice
    linked = f[f["status"] == "backward via forward op"]
    assert linked["name"].astype(str).tolist() == ["autograd::engine::evaluate_function: BmmBackward0"]
    assert linked["flops"].tolist() == [2 * BMM] and linked["family"].tolist() == ["matmul"]
    bmm_index = counted.loc[counted["name"] == "aten::bmm", "trace_index"].iloc[0]
    assert linked["forward_trace_index"].tolist() == [bmm_index]
    # AddmmBackward0 has its own aten::mm with shapes: the node itself gets nothing
    assert not f["name"].astype(str).str.contains("AddmmBackward0").any()
    assert f.groupby("stage", observed=True)["flops"].sum().to_dict() == {
        "forward": FORWARD,
        "backward": BACKWARD_HW,
        "optimizer": 0,
    }
    addmm = counted[counted["name"] == "aten::addmm"].iloc[0]
    assert (addmm["gpu_ns"], addmm["dtype"], addmm["family"]) == (10_000, "bf16", "matmul")
    assert addmm["achieved_tflops"] == pytest.approx(ADDMM / 10_000 / 1e3)
    assert addmm["bytes"] == (128 * 256 + 256 * 512 + 128 * 512) * 2 + 512 * 2
    assert addmm["intensity"] == pytest.approx(ADDMM / addmm["bytes"])
    # the optimizer's _foreach op recorded no shapes (long TensorLists are written as []): listed with its time
    adam = f[f["name"] == "aten::_foreach_add_"].iloc[0]
    assert (adam["status"], adam["gpu_ns"], adam["flops"]) == ("shapes not recorded or unfit", 5_000, 0)
    # every kernel's time is in exactly one row
    assert f["gpu_ns"].sum() == (10 + 4 + 8 + 8 + 6 + 2 + 5) * 1000


def test_recompute_is_hardware_flops_not_model_flops(synthetic):
    f = profparse.parse(synthetic).flops
    assert f.loc[f["recompute"], "flops"].tolist() == [RECOMPUTE]
    eff = profparse.parse(synthetic).efficiency
    bwd = rows(eff, "stage", "backward").iloc[0]
    assert (bwd["flops"], bwd["model_flops"]) == (BACKWARD_HW, BACKWARD_MODEL)


def test_mfu_and_hfu_per_stage_and_step_against_the_device_peak(synthetic):
    p = profparse.parse(synthetic)
    assert p.peak.tflops == H100_BF16 and p.peak.dtype == "bf16" and "H100 SXM" in p.peak.note
    eff = p.efficiency
    fwd = rows(eff, "stage", "forward").iloc[0]
    assert (fwd["step"], fwd["flops"], fwd["counted_gpu_ns"], fwd["time_ns"]) == (1, FORWARD, 14_000, 14_000)
    assert fwd["achieved_tflops"] == pytest.approx(FORWARD / 14_000 / 1e3)
    assert fwd["mfu"] == pytest.approx(FORWARD / (14_000e-9 * H100_BF16 * 1e12))
    bwd = rows(eff, "stage", "backward").iloc[0]
    assert (bwd["counted_gpu_ns"], bwd["time_ns"]) == (24_000, 24_000)
    assert bwd["mfu"] == pytest.approx(BACKWARD_MODEL / (24_000e-9 * H100_BF16 * 1e12))
    assert bwd["hfu"] == pytest.approx(BACKWARD_HW / (24_000e-9 * H100_BF16 * 1e12))
    opt = rows(eff, "stage", "optimizer").iloc[0]
    assert (opt["flops"], opt["not_counted_gpu_ns"]) == (0, 5_000)
    assert np.isnan(opt["mfu"]) and np.isnan(opt["hfu"])  # nothing counted: MFU unknown ("-"), not 0%
    step = rows(eff, "step").iloc[0]
    assert (step["step"], step["time_ns"], step["flops"]) == (1, 1_000_000, FORWARD + BACKWARD_HW)
    assert step["mfu"] == pytest.approx((FORWARD + BACKWARD_MODEL) / (1e-3 * H100_BF16 * 1e12))


def test_peak_override_and_unknown_device(synthetic, tmp_path):
    eff = profparse.parse(synthetic, peak_tflops=100.0).efficiency
    step = rows(eff, "step").iloc[0]
    assert step["peak_tflops"] == 100.0
    assert step["mfu"] == pytest.approx((FORWARD + BACKWARD_MODEL) / (1e-3 * 100e12))
    unknown = profparse.parse(build(tmp_path / "fake.json", device="Fake GPU"))
    assert "'Fake GPU' is not in the peak table" in unknown.peak.note and "--peak-tflops" in unknown.peak.note
    assert rows(unknown.efficiency, "step")["mfu"].isna().all()
    assert rows(unknown.efficiency, "step")["flops"].tolist() == [FORWARD + BACKWARD_HW]  # FLOPs still counted


def test_module_flops(synthetic):
    eff = profparse.parse(synthetic).efficiency
    mods = rows(eff, "module").set_index(["module", "stage", "recompute"])
    assert mods.loc[("Linear_0", "forward", False), "flops"] == ADDMM
    assert mods.loc[("Linear_0", "backward", False), "flops"] == 2 * MM_BWD  # AddmmBackward0 -> seq 1 -> Linear_0
    assert mods.loc[("Attn_0", "forward", False), "flops"] == BMM
    assert mods.loc[("Attn_0", "backward", False), "flops"] == 2 * BMM
    recompute = mods.loc[("Linear_1", "backward", True)]
    assert (recompute["flops"], recompute["model_flops"]) == (RECOMPUTE, 0)
    assert mods.loc[("Linear_0", "forward", False), "counted_gpu_ns"] == 10_000


def test_gemm_table(synthetic):
    g = profparse.parse(synthetic).gemms
    got = {tuple(int(x) for x in r[:4]): int(r[4]) for r in g[["batch", "m", "n", "k", "gpu_ns"]].to_numpy()}
    assert got == {
        (1, 128, 512, 256): 10_000,
        (8, 64, 64, 32): 4_000,
        (1, 128, 256, 512): 8_000,
        (1, 512, 256, 128): 8_000,
        (1, 64, 64, 64): 2_000,
    }
    top = g.iloc[0]
    assert (top["dtype"], top["count"], top["flops"]) == ("bf16", 1, ADDMM)
    assert top["pct_of_peak"] == pytest.approx(100 * ADDMM / 10_000 / 1e3 / H100_BF16)


def check_invariants(p):
    eff, f = p.efficiency, p.flops
    stage_rows = rows(eff, "stage")
    for step, frame in stage_rows.groupby("step"):
        step_row = eff[(eff["scope"] == "step") & (eff["step"] == step)]
        assert frame["flops"].sum() == pytest.approx(step_row["flops"].sum(), rel=1e-12)
    totals = rows(eff, "total").set_index("stage")["flops"]
    by_stage = stage_rows.groupby("stage", observed=True)["flops"].sum()
    for stage, value in by_stage.items():
        assert totals[stage] == pytest.approx(value, rel=1e-12)
    modules = rows(eff, "module")
    for (stage, _), frame in modules.groupby(["stage", "recompute"], observed=True):
        assert frame["flops"].max() <= totals.get(stage, 0) * (1 + 1e-12)
    assert (eff["model_flops"] <= eff["flops"]).all()
    kernels = p.kernels
    launched = kernels[(kernels["kind"] == "kernel") & kernels["launch_op_trace_index"].notna()]
    assert f["gpu_ns"].sum() == launched["dur_ns"].sum()


@pytest.mark.parametrize("name", ["mi300x_resnet18_train", "v100_resnet50_legacy2021", "mi250_minitoy"])
def test_real_gpu_traces(name):
    path = SHARED_TRACES / f"{name}.json.gz"
    if not path.exists():
        pytest.skip(f"{path.name} not in {SHARED_TRACES}")
    p = parsed(path)
    check_invariants(p)
    assert p.peak.tflops > 0, p.peak.note
    eff = p.efficiency
    measured = eff[eff["scope"].isin(["stage", "step"]) & (eff["model_flops"] > 0)]
    assert (measured["time_ns"] > 0).all()  # device FLOPs only: each counted op launched a kernel
    assert len(measured) and ((measured["mfu"] > 0) & (measured["mfu"] <= 1)).all()
    # every GEMM with shapes is counted (itself, or the matmul op inside it)
    f = p.flops
    gemm = f["name"].astype(str).isin(["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"])
    assert gemm.any() and (f.loc[gemm, "status"] == "counted").all()
    ops = p.raw.events
    gemm_ops = ops["name"].astype(str).isin(["aten::mm", "aten::addmm", "aten::bmm"]) & ops["input_dims"].notna()
    assert p.gemms["count"].sum() == gemm_ops.sum()


def test_cpu_trace_counts_the_tiny_qwen_matmuls_and_has_no_mfu():
    """Qwen2-tiny (manifest: hidden 64, intermediate 256, 2 layers, 4 heads, 2 KV heads, vocab 1024; batch 2 x 64):
    forward matmul FLOPs per step by hand; backward = 2x the linears + 2.5x attention."""
    path = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
    config = json.loads((SAMPLE_TRACES / "qwen2_tiny_cpu_marks.manifest.json").read_text())
    c, opts = config["model"]["config"], config["options"]
    tokens, hidden, inter = opts["batch"] * opts["seq_len"], c["hidden_size"], c["intermediate_size"]
    heads, kv, head_dim = (
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["hidden_size"] // c["num_attention_heads"],
    )
    linear = 2 * tokens * (2 * hidden * hidden + 2 * hidden * kv * head_dim + 3 * hidden * inter)
    attention = 2 * (2 * opts["batch"] * heads * opts["seq_len"] ** 2 * head_dim)
    lm_head = 2 * tokens * hidden * c["vocab_size"]
    forward = c["num_hidden_layers"] * (linear + attention) + lm_head
    backward = c["num_hidden_layers"] * (2 * linear + 2.5 * attention) + 2 * lm_head
    p = parsed(path)
    f = p.flops
    tensor = f[f["family"].isin(["matmul", "attention"]) & f["status"].isin(["counted", "backward via forward op"])]
    per_step = tensor.groupby(["step", "stage"], observed=True)["flops"].sum().unstack()
    assert len(per_step) == opts["steps"]
    assert (per_step["forward"] == forward).all() and (per_step["backward"] == backward).all()
    assert np.isnan(p.peak.tflops) and "CPU-only" in p.peak.note
    assert rows(p.efficiency, "step")["mfu"].isna().all()
    check_invariants(p)


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "profparse.cli.main", *args], capture_output=True, text=True, cwd=REPO, timeout=600
    )


def test_a_tiny_mfu_keeps_two_significant_digits(synthetic):
    """A tiny model's MFU (or a huge peak) reads 0.033%, not 0.0%: the per-step MFU as text is the JSON value."""
    from profparse.base.formats import utilisation_text

    assert [utilisation_text(x) for x in (0.253, 0.001, 0.00033, 3.3e-5, 5e-7, 0.0, None)] == [
        "25.3%",
        "0.1%",
        "0.033%",
        "0.0033%",
        "<0.0001%",
        "0.0%",
        "-",
    ]
    text = cli("summarize", "--peak-tflops", "100000", str(synthetic)).stdout
    data = json.loads(cli("summarize", "--peak-tflops", "100000", "--format", "json", str(synthetic)).stdout)
    mfu = data["efficiency"]["steps"][0]["mfu"]
    assert 1e-6 < mfu < 1e-3
    per_step = text[text.index("MFU per step") :].splitlines()
    assert per_step[3].split()[-1] == utilisation_text(mfu) == f"{mfu * 100:.2g}%"


def test_cli_summary_section_and_parquet_tables(synthetic, tmp_path):
    out = cli("summarize", "--peak-tflops", "100", str(synthetic))
    assert out.returncode == 0, out.stderr
    section = out.stdout[out.stdout.index("Efficiency (ms)") :]
    assert section.splitlines()[6].strip().startswith("peak: --peak-tflops 100")  # below the table
    mfu = (FORWARD + BACKWARD_MODEL) / (1e-3 * 100e12)
    per_step = section[section.index("MFU per step") :].splitlines()
    assert per_step[3].split() == ["1", f"{(FORWARD + BACKWARD_HW) / 1e9:,.1f}", f"{mfu:.1%}"]
    assert "aten::_foreach_add_" in section  # not counted, with its time
    data = json.loads(cli("summarize", "--format", "json", str(synthetic)).stdout)["efficiency"]
    assert data["peak"]["tflops"] == H100_BF16
    assert {r["stage"]: r["flops"] for r in data["stages"]}["backward"] == BACKWARD_HW
    bad = cli("summarize", "--peak-tflops", "-3", str(synthetic))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--peak-tflops" in bad.stderr
    assert cli("parse", str(synthetic), "-o", str(tmp_path / "pq")).returncode == 0
    for table in ("flops", "efficiency", "gemms"):
        frame = pd.read_parquet(tmp_path / "pq" / f"{table}.parquet")
        assert len(frame), table
    assert pd.read_parquet(tmp_path / "pq" / "flops.parquet")["flops"].sum() == FORWARD + BACKWARD_HW


def test_roofline_view(synthetic, tmp_path):
    from profparse.outputs.views import roofline

    prepared, why = roofline.data(profparse.parse(synthetic))
    assert why is None and prepared["peak_tflops"] == H100_BF16 and prepared["memory_gbps"] == 3350
    points = prepared["points"].set_index(["name", "stage"])
    addmm = points.loc[("aten::addmm", "forward")]
    assert addmm["tflops"] == pytest.approx(ADDMM / 10_000 / 1e3)
    assert addmm["intensity"] == pytest.approx(ADDMM / ((128 * 256 + 256 * 512 + 128 * 512 + 512) * 2))
    assert points.loc[("aten::mm", "backward"), "count"] == 3  # two in AddmmBackward0, one recomputed
    fig = roofline.draw(prepared)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {"forward", "backward", f"peak {H100_BF16:g} TFLOP/s", "memory 3350 GB/s"} <= set(labels)
    b = TraceBuilder()  # no shapes recorded: nothing to plot, and the reason says so
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::mm", 1, 10)
    b.launch(2, 3, 5)
    prepared, why = roofline.data(profparse.parse(b.write(tmp_path / "noshapes.json")))
    assert prepared is None and "record_shapes" in why


def test_nesting_rules_on_a_cpu_trace(tmp_path):
    """Tensor formulas count at the innermost op, vector formulas at the outermost, views only alone."""
    b = TraceBuilder(autograd_thread=False)
    b.annotation("ProfilerStep#1", 0, 200)
    f32 = ["float"] * 3
    b.op("aten::linear", 1, 30, **shapes([[4, 64], [32, 64]], f32[:2]))
    b.op("aten::matmul", 2, 25, **shapes([[4, 64], [64, 32]], f32[:2]))
    b.op("aten::mm", 3, 20, **shapes([[4, 64], [64, 32]], f32[:2]))
    b.op(
        "aten::layer_norm", 40, 30, **shapes([[4, 64], [], [64], [64], []], ["float", "ScalarList", *f32[:2], "Scalar"])
    )
    b.op("aten::native_layer_norm", 41, 25, **shapes([[4, 64], [], [64], [64], []], ["float", "", *f32[:2], "Scalar"]))
    b.op("aten::reshape", 80, 30, **shapes([[4, 64], []], ["float", "ScalarList"]))
    b.op("aten::clone", 81, 20, **shapes([[4, 64], []], ["float", ""]))
    b.op("aten::view", 120, 5, **shapes([[4, 64], []], ["float", "ScalarList"]))
    f = profparse.parse(b.write(tmp_path / "cpu.json")).flops.set_index("name")
    assert f.loc["aten::mm", "flops"] == 2 * 4 * 64 * 32 and f.loc["aten::mm", "status"] == "counted"
    assert f.loc["aten::layer_norm", "flops"] == 7 * 256 and "aten::native_layer_norm" not in f.index
    assert f.loc["aten::clone", "bytes"] == 2 * 256 * 4 and f.loc["aten::clone", "status"] == "counted"
    assert f.loc["aten::reshape", "status"] == "around counted ops" and f.loc["aten::reshape", "flops"] == 0
    assert (f.loc["aten::view", "status"], f.loc["aten::view", "bytes"]) == ("counted", 0)
    assert f.loc["aten::linear", "status"] == "around counted ops" and "aten::matmul" in f.index
    assert f["flops"].sum() == 2 * 4 * 64 * 32 + 7 * 256
