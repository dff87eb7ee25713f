"""The math mode each op ran in (fp32 SIMT, TF32, bf16, fp16, fp8, int8, fp64), read from the kernels it launched.

An ``fp32`` matmul on an A100 runs on TF32 tensor cores by default (``cutlass_80_tensorop_s1688gemm``), eight
times the plain FP32 rate: dividing its FLOPs by the FP32 peak puts it above its own roof. The kernel's name says
which units ran it, so the rules below (data, like the stage rules) read it; the first rule whose pattern is found
in a kernel name decides, and an op takes the rule of its kernels with the most GPU time. Ops whose kernels match
no rule fall back to their input dtype (:func:`profparse.analysis.flops.dominant_dtype`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from profparse.trace.link import Links, kind_mask

MODES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")  # keys of the peak table (analysis/peaks.py)
TENSILE = r"Cijk_A[a-z]+_B[a-z]+_"  # rocBLAS/hipBLASLt (Tensile) GEMMs: the type token follows the layouts


@dataclass(frozen=True)
class MathModeRule:
    """A kernel name pattern (a regular expression, searched) and the math mode it means; ``example`` is a real
    kernel name it must match (tests check each)."""

    name: str
    mode: str
    pattern: str
    example: str


MATH_MODE_RULES: tuple[MathModeRule, ...] = (
    # mode "": not math (collectives name their element type: ncclKernel_..._int8_t); the op falls back to its dtype
    MathModeRule("collective", "", r"(?i)nccl|rccl|msccl", "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)"),
    MathModeRule("fp8 types", "fp8", r"(?i)e4m3|e5m2|fp8|f8f8|qgmma", "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n"),
    MathModeRule("tensile fp8", "fp8", TENSILE + r"(?:F8|B8)", "Cijk_Ailk_Bljk_F8HS_BH_Bias_HA_S_SAV_UserArgs_MT128"),
    MathModeRule("int8 imma", "int8", r"(?i)imma|i8816|i8i8|s8s8|int8", "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tile"),
    MathModeRule("tensile int8", "int8", TENSILE + r"I8", "Cijk_Ailk_Bljk_I8II_BH_MT128x128x64_MI32x32x8x1_SN"),
    # bf16 before fp16 ("bf16" holds "f16"), both before tf32 (cutlass "s1688gemm_f16" is fp16 on s1688 units)
    MathModeRule("bf16 types", "bf16", r"(?i)bf16|bfloat16|bhalf|nvjet_t", "ampere_bf16_s16816gemm_bf16_128x128_ldg8"),
    MathModeRule("tensile bf16", "bf16", TENSILE + r"B", "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64"),
    MathModeRule(
        "fp16 types",
        "fp16",
        r"(?i)fp16|f16|half_t|__half|c10::half|hmma|h884|h1688|h16816|hgemm|nvjet_h",
        "volta_h884gemm_64x64_nn",
    ),
    MathModeRule("tensile fp16", "fp16", TENSILE + r"H", "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0"),
    MathModeRule(
        "tf32 tensor cores",
        "tf32",
        r"(?i)tf32|tfloat32|xf32|tensorop_s1688|_s1688(?:gemm|dgrad|fprop|wgrad)",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
        "256x64_16x4_nn_align4::Params)",
    ),
    MathModeRule("fp64", "fp64", r"(?i)dgemm|dmma", "volta_dgemm_64x64_nn"),
    MathModeRule("tensile fp64", "fp64", TENSILE + r"D", "Cijk_Ailk_Bljk_DB_MT64x64x8_SN_1LDSB0_APM1_AF0EM1"),
    MathModeRule(
        "fp32 simt",
        "fp32",
        r"(?i)sgemm|scudnn|gemmsn|gemv2?t?_kernel<[^>]*float|dgrad_engine<float|wgrad_alg\d_engine<float|_fp32_",
        "volta_sgemm_64x64_nt",
    ),
    MathModeRule(
        "tensile fp32",
        "fp32",
        TENSILE + r"S",
        "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1",
    ),
)
RULE_MODES = np.array([MODES.index(rule.mode) if rule.mode else -1 for rule in MATH_MODE_RULES], dtype=np.int64)
assert len(MATH_MODE_RULES) < 128  # op_kernel_rules keeps rule indices in int8


@lru_cache(maxsize=1)
def _compiled() -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(rule.pattern) for rule in MATH_MODE_RULES)


def kernel_rule(name: str) -> int:
    """The index in :data:`MATH_MODE_RULES` of the first rule found in kernel ``name``; -1 when none is, or when
    that rule says the kernel does no math."""
    found = next((i for i, pattern in enumerate(_compiled()) if pattern.search(name)), -1)
    return found if found >= 0 and RULE_MODES[found] >= 0 else -1


def op_kernel_rules(events: pd.DataFrame, links: Links, owner: np.ndarray) -> np.ndarray:
    """Per event row: the rule of the kernels it owns (``owner`` of each launching op) with the most GPU time,
    -1 where none of its kernels matches a rule. Each distinct kernel name is matched once."""
    n = len(events)
    out = np.full(n, -1, dtype=np.int8)  # an index into MATH_MODE_RULES: 1 byte per event, not 8
    kernels = np.flatnonzero(kind_mask(events, {"kernel"}) & (links.launch_op >= 0))
    if kernels.size == 0:
        return out
    who = owner[links.launch_op[kernels]]
    codes = events["name"].cat.codes.to_numpy()[kernels].astype(np.int64)
    used = np.unique(codes[codes >= 0])
    categories = events["name"].cat.categories
    rule_of_code = np.full(len(categories), -1, dtype=np.int64)
    rule_of_code[used] = [kernel_rule(str(name)) for name in categories[used].tolist()]  # once per distinct name
    rule = np.where(codes >= 0, rule_of_code[np.maximum(codes, 0)], -1)
    ok = (who >= 0) & (rule >= 0)
    if not ok.any():
        return out
    width = len(MATH_MODE_RULES)
    keys, inverse = np.unique(who[ok] * width + rule[ok], return_inverse=True)
    time = np.bincount(inverse.ravel(), weights=events["dur_ns"].to_numpy()[kernels[ok]].astype(np.float64))
    row, rule_index = keys // width, keys % width
    order = np.lexsort((-time, row))  # per row, the rule with the most time first
    first = np.concatenate([[True], row[order][1:] != row[order][:-1]])
    out[row[order][first]] = rule_index[order][first]
    return out
