"""Each op's math mode from its kernels (TF32, bf16, fp32 SIMT...), MFU against the peak of that mode, no op and no
stage above its roof on any real trace, and --peak-tflops reaching every verb that measures MFU."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, SAMPLE_TRACES, SHARED_TRACES, parsed, sample_traces, shared_traces
from tracebuilder import TraceBuilder

import profparse
from profparse.analysis.math_modes import MATH_MODE_RULES, MODES, kernel_rule
from profparse.outputs.summary.efficiency import efficiency_data

F32, BF16 = "float", "c10::BFloat16"
A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}  # the peak table's A100 row, dense TFLOP/s
TF32_GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)"
# (op, shape side, dtype, kernel, kernel us, expected mode, expected rule)
OPS = [
    ("aten::mm", 1024, F32, TF32_GEMM, 70.0, "tf32", "tf32 tensor cores"),
    ("aten::mm", 512, F32, "ampere_sgemm_128x64_nn", 20.0, "fp32", "fp32 simt"),
    ("aten::mm", 1024, BF16, "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn", 10.0, "bf16", "bf16 types"),
    ("aten::mm", 256, BF16, "my_fused_gemm", 5.0, "bf16", "input dtype"),
]


def flops_of(side: int) -> int:
    return 2 * side**3


def a100_trace(path, device="NVIDIA A100-SXM4-40GB"):
    """One step whose forward runs the four matmuls of OPS back to back on one stream (busy = the kernels' sum)."""
    b = TraceBuilder()
    b.header["deviceProperties"] = [{"id": 0, "name": device}]
    b.annotation("ProfilerStep#1", 0, 1000)
    b.py("nn.Module: Model_0", 5, 400)
    t, gpu = 10.0, 20.0
    for name, side, dtype, kernel, dur, *_ in OPS:
        b.op(name, t, 30, **{"Input Dims": [[side, side], [side, side]], "Input type": [dtype, dtype],
                             "Concrete Inputs": ["", ""]})  # fmt: skip
        b.launch(t + 1, gpu, dur, name=kernel)
        t, gpu = t + 40, gpu + dur
    return b.write(path)


@pytest.fixture(scope="module")
def a100(tmp_path_factory):
    return profparse.parse(a100_trace(tmp_path_factory.mktemp("mode") / "a100.json"))


def test_each_rule_matches_its_example_first():
    for index, rule in enumerate(MATH_MODE_RULES):
        assert rule.mode in (*MODES, "")
        found = next(i for i, r in enumerate(MATH_MODE_RULES) if re.search(r.pattern, rule.example))
        assert found == index, (rule.name, MATH_MODE_RULES[found].name)
        assert kernel_rule(rule.example) == (index if rule.mode else -1)


# real kernel names (from the shared traces and public traces of each library) and the mode each ran in
KERNELS = [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "tf32"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", "tf32"),
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4>", "tf32"),
    ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "fp32"),
    ("volta_sgemm_64x64_nt", "fp32"),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int)", "fp32"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "fp16"),
    ("turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn", "fp16"),
    ("cutlass_tensorop_s1688gemm_f16_256x128_32x2_nt_align8", "fp16"),
    ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN", "fp16"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "bf16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "bf16"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::bfloat16_t>>", "bf16"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "fp16"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", "fp8"),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", "fp32"),
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1", "bf16"),
    ("Custom_Cijk_Ailk_Bljk_HHS_BH_Bias_SAV_UserArgs_MT128x128x64_MI16x16x1", "fp16"),
    ("Cijk_Ailk_Bljk_F8F8S_BH_Bias_HA_S_SAV_UserArgs_MT256x256x128", "fp8"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x64x32_wt32x32x8_ws1x1_wr1x2", "bf16"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", ""),  # not math
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)", ""),
    ("batched_transpose_32x32_half", ""),  # MIOpen's layout change around a bf16 convolution
]


@pytest.mark.parametrize(("kernel", "mode"), KERNELS, ids=[k[:40] for k, _ in KERNELS])
def test_kernel_names(kernel, mode):
    found = kernel_rule(kernel)
    assert (MATH_MODE_RULES[found].mode if found >= 0 else "") == mode


def test_each_op_takes_the_mode_of_its_kernels_else_its_dtype(a100):
    f = a100.flops.sort_values("trace_index")
    assert f["math_mode"].tolist() == [op[5] for op in OPS]
    assert f["math_mode_rule"].tolist() == [op[6] for op in OPS]
    tf32 = f.iloc[0]
    # the case: a TF32 GEMM at ~30 TFLOP/s is above the fp32 peak (19.5) and well under its own (156)
    assert A100["fp32"] < tf32["achieved_tflops"] < A100["tf32"]
    assert a100.peak.mode_tflops == {"tf32": 156.0, "bf16": 312.0, "fp32": 19.5}
    assert a100.peak.basis.startswith("each op's math mode")


def test_stage_mfu_weights_each_mode_by_its_flops(a100):
    eff = a100.efficiency
    fwd = eff[(eff["scope"] == "stage") & (eff["stage"] == "forward")].iloc[0]
    at_peak_s = sum(flops_of(side) / (A100[mode] * 1e12) for _, side, _, _, _, mode, _ in OPS)
    busy_s = sum(op[4] for op in OPS) * 1e-6
    total = sum(flops_of(op[1]) for op in OPS)
    assert fwd["time_ns"] == round(busy_s * 1e9)
    assert fwd["mfu"] == pytest.approx(at_peak_s / busy_s) and fwd["hfu"] == pytest.approx(fwd["mfu"])
    assert fwd["peak_tflops"] == pytest.approx(total / at_peak_s / 1e12)
    assert fwd["math_mode"] == "bf16"  # the most FLOPs: 2 x (1024^3 + 256^3) bf16 against 2 x 1024^3 TF32
    assert fwd["mfu"] < 1 < total / busy_s / (A100["fp32"] * 1e12)  # against the fp32 peak alone it was > 100%
    g = a100.gemms.set_index(["m", "math_mode"])
    assert g.loc[(1024, "tf32"), "peak_tflops"] == 156.0
    assert g.loc[(1024, "tf32"), "pct_of_peak"] == pytest.approx(100 * flops_of(1024) / 70e-6 / 156e12)
    data = efficiency_data(a100)
    assert data["peak"]["basis"] == a100.peak.basis and data["peak"]["tflops"] == pytest.approx(a100.peak.tflops)
    shares = {m["mode"]: m["flops_share"] for m in data["peak"]["modes"]}
    assert shares["tf32"] == pytest.approx(flops_of(1024) / total) and sum(shares.values()) == pytest.approx(1)
    stage = next(s for s in data["stages"] if s["stage"] == "forward")
    assert stage["math_mode"] == "bf16" and stage["peak_tflops"] == pytest.approx(fwd["peak_tflops"])


def test_peak_override_applies_to_every_mode(tmp_path):
    p = profparse.parse(a100_trace(tmp_path / "a100.json"), peak_tflops=100.0)
    assert p.peak.basis == "--peak-tflops" and set(p.peak.mode_tflops.values()) == {100.0}
    eff = p.efficiency
    fwd = eff[(eff["scope"] == "stage") & (eff["stage"] == "forward")].iloc[0]
    total = sum(flops_of(op[1]) for op in OPS)
    assert fwd["peak_tflops"] == 100.0
    assert fwd["mfu"] == pytest.approx(total / (sum(op[4] for op in OPS) * 1e-6) / 100e12)


def test_a_real_trace_rewritten_to_tf32_kernels(tmp_path):
    """v100_resnet50_legacy2021 moved to an A100 with its fp32 SIMT kernels renamed to a TF32 GEMM: exactly the ops
    whose kernels were SIMT now run TF32 against 156 TFLOP/s; the others keep their mode; FLOPs do not change."""
    source = SHARED_TRACES / "v100_resnet50_legacy2021.json.gz"
    if not source.exists():
        pytest.skip(f"{source.name} not in {SHARED_TRACES}")
    document = json.loads(gzip.decompress(source.read_bytes()))
    simt = next(i for i, r in enumerate(MATH_MODE_RULES) if r.name == "fp32 simt")
    renamed = 0
    for event in document["traceEvents"]:
        if str(event.get("cat", "")).lower() == "kernel" and kernel_rule(event["name"]) == simt:
            event["name"] = "cutlass_80_tensorop_s1688gemm_" + event["name"]
            renamed += 1
    for props in document["deviceProperties"]:
        props["name"] = "NVIDIA A100-SXM4-40GB"
    path = tmp_path / "a100_tf32.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    before, after = parsed(source).flops, profparse.parse(path).flops
    assert renamed > 100 and before["trace_index"].tolist() == after["trace_index"].tolist()
    was_simt = (before["math_mode_rule"] == "fp32 simt").to_numpy()
    assert was_simt.sum() > 50
    assert (after.loc[was_simt, "math_mode_rule"] == "tf32 tensor cores").all()
    assert after.loc[~was_simt, "math_mode"].tolist() == before.loc[~was_simt, "math_mode"].tolist()
    assert after["flops"].sum() == before["flops"].sum()
    p = profparse.parse(path)
    roofs = p.peak.roofs(after["math_mode"])
    assert set(roofs[was_simt]) == {156.0} and set(roofs[~was_simt & (after["flops"] > 0).to_numpy()]) == {19.5}


def every_trace():
    paths = [*sample_traces(), *shared_traces(), *sorted((SHARED_TRACES / "critical_path").glob("*.json.gz"))]
    return paths or [SAMPLE_TRACES]


@pytest.mark.parametrize("path", every_trace(), ids=lambda p: p.name)
def test_no_op_and_no_stage_above_its_roof(path):
    p = parsed(path)
    f, eff = p.flops, p.efficiency
    if not np.isfinite(p.peak.tflops):  # CPU-only: no MFU at all
        assert eff["mfu"].isna().all(), p.peak.note
        return
    timed = f[(f["flops"] > 0) & (f["gpu_ns"] > 0) & f["status"].isin(["counted", "backward via forward op"])]
    roof = p.peak.roofs(timed["math_mode"])
    above = timed[timed["achieved_tflops"].to_numpy() > roof * (1 + 1e-9)]
    assert above.empty, above[["name", "math_mode", "achieved_tflops"]].head().to_string()
    rows = eff[(eff["flops"] > 0) & (eff["time_ns"] > 0)]
    assert (rows["hfu"] <= 1 + 1e-9).all() and (rows["mfu"] <= rows["hfu"] + 1e-12).all()
    on_time = rows[rows["counted_gpu_ns"] > 0]
    assert (on_time["achieved_tflops"] <= on_time["peak_tflops"] * (1 + 1e-9)).all()
    assert eff.loc[eff["flops"] == 0, "mfu"].isna().all()  # nothing counted: "-", never 0%
    assert (p.gemms["pct_of_peak"] <= 100 + 1e-9).all()


def test_foreach_optimizer_step_is_counted_on_mi250():
    path = SHARED_TRACES / "mi250_minitoy.json.gz"
    if not path.exists():
        pytest.skip("mi250_minitoy not available")
    p = parsed(path)
    f = p.flops
    foreach = f[f["name"] == "aten::_foreach_add_"]
    assert foreach["status"].tolist() == ["counted"] and foreach["flops"].tolist() == [128 * 128 + 128]
    eff = p.efficiency
    opt = eff[(eff["scope"] == "total") & (eff["stage"] == "optimizer")].iloc[0]
    assert opt["flops"] == f.loc[f["stage"] == "optimizer", "flops"].sum() > 0 and opt["mfu"] > 0


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "profparse.cli.main", *args], capture_output=True, text=True, cwd=REPO, timeout=600
    )


def test_peak_tflops_reaches_plot_report_and_parse_dir(tmp_path):
    trace = a100_trace(tmp_path / "a100.json")
    out = cli("plot", str(trace), "-o", str(tmp_path / "plots"), "--kind", "roofline", "--format", "svg",
              "--peak-tflops", "123")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "peak 123 TFLOP/s" in (tmp_path / "plots" / "roofline.svg").read_text()
    out = cli("report", str(trace), "-o", str(tmp_path / "r.html"), "--peak-tflops", "123")
    assert out.returncode == 0, out.stderr
    assert "--peak-tflops 123 for every math mode" in (tmp_path / "r.html").read_text()
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(2):
        (folder / f"rank{rank}.json").write_bytes(trace.read_bytes() + b"\n" * rank)
    out = cli("parse", str(folder), "-o", str(tmp_path / "ds"), "-j", "1", "--peak-tflops", "123")
    assert out.returncode == 0, out.stderr
    for rank in range(2):
        eff = pd.read_parquet(tmp_path / "ds" / "efficiency" / f"rank={rank}" / "part-0.parquet")
        assert set(eff.loc[eff["flops"] > 0, "peak_tflops"]) == {123.0}
