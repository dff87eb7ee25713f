"""Peak dense TFLOP/s per dtype and memory bandwidth per GPU, keyed by the name Kineto writes in ``deviceProperties``.

A table of data, like the stage rules: one :class:`Peak` row per device, matched by a name pattern (first match
wins, so the specific rows come first). Numbers are the vendor datasheet's *dense* figures (NVIDIA quotes tensor
FLOPs "with sparsity": those are halved here). ``fp32`` is the plain FP32 (SIMT) rate and ``tf32`` the TF32
tensor-core rate that cuDNN convolutions use by default and matmuls with ``allow_tf32``; on AMD ``fp32`` is the FP32
matrix-core rate, which rocBLAS uses for FP32 GEMMs. AMD MI250/MI250X
appear to PyTorch as two devices, one per GCD (die): their rows hold half the package figure. ROCm may name a
device just ``AMD Radeon Graphics``; those rows also match by (``computeMajor``, ``computeMinor``, ``numSms``).
:func:`choose_peak` picks the busiest device's row; each op is measured against the peak of its math mode
(:mod:`profparse.analysis.math_modes`: from its kernels' names, else its input dtype).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.math_modes import MATH_MODE_RULES
from profparse.trace.link import kind_mask


@dataclass(frozen=True)
class Peak:
    """One device: dense peak TFLOP/s by dtype (fp64, fp32, tf32, bf16, fp16, fp8, int8), memory GB/s, source."""

    device: str
    pattern: str  # regex searched (case-insensitive) in deviceProperties' name
    tflops: dict[str, float]
    memory_gbps: float
    source: str
    arch: tuple[int, int, int] | None = field(default=None)  # (computeMajor, computeMinor, numSms) for bare names

    def tflops_for(self, dtype: str) -> float | None:
        """Peak for ``dtype``; fp16/bf16 fall back to each other, unknown dtypes to fp32."""
        for key in (dtype, {"bf16": "fp16", "fp16": "bf16"}.get(dtype, ""), "fp32"):
            if key in self.tflops:
                return self.tflops[key]
        return None


def _nv(fp64: float, fp32: float, tf32: float, bf16: float, fp8: float | None = None) -> dict[str, float]:
    out = {"fp64": fp64, "fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "int8": 2 * bf16}
    return out | ({"fp8": fp8} if fp8 else {})


V100_DS = "NVIDIA Tesla V100 datasheet (2020): tensor 125/112/130 TFLOPS, FP32 15.7/14/16.4, 900/1134 GB/s"
A100_DS = "NVIDIA A100 datasheet (2021): BF16 312 dense (624 sparse), TF32 156, FP32 19.5; 1555/1935/2039 GB/s"
H100_DS = "NVIDIA H100 datasheet (2023): BF16 1979/1513/1671 with sparsity (halved), FP32 67/51/60; 3.35/2/3.9 TB/s"
H200_DS = "NVIDIA H200 datasheet (2024): BF16 1979 (NVL 1671) with sparsity (halved), FP32 67 (60); 4.8 TB/s"
B200_DS = "NVIDIA HGX B200 datasheet (2024), per GPU = 8-GPU figure / 8: BF16 36 PF sparse -> 2.25 dense; 8 TB/s"
L4_DS = "NVIDIA L4 datasheet (2023): BF16 242 with sparsity (halved), TF32 120 (halved), FP32 30.3; 300 GB/s"
A10_DS = "NVIDIA A10 datasheet (2021): BF16 125 dense (250 sparse), TF32 62.5, FP32 31.2; 600 GB/s"
MI250_DS = "AMD Instinct MI250X/MI250 datasheets: BF16 383/362.1, FP32 matrix 95.7/90.5, 3.2768 TB/s per package (x1/2)"
MI300_DS = "AMD Instinct MI300X datasheet (2023): BF16 1307.4 dense, FP8 2614.9, TF32 653.7, FP32 163.4; 5.3 TB/s"
MI325_DS = "AMD Instinct MI325X datasheet (2024): BF16 1307.4 dense, FP8 2614.9, FP32 163.4; 6 TB/s"

PEAKS: tuple[Peak, ...] = (
    Peak("V100S PCIe", r"V100S", _nv(8.2, 16.4, 16.4, 130) | {"int8": 0.0}, 1134, V100_DS),
    Peak("V100 PCIe", r"V100.*PCIE", _nv(7.0, 14.0, 14.0, 112) | {"int8": 0.0}, 900, V100_DS),
    Peak("V100 SXM2/DGXS", r"V100", _nv(7.8, 15.7, 15.7, 125) | {"int8": 0.0}, 900, V100_DS),
    Peak("A100 80GB PCIe", r"A100.*80GB.*PCIE|A100.*PCIE.*80GB", _nv(9.7, 19.5, 156, 312), 1935, A100_DS),
    Peak("A100 80GB SXM", r"A100.*80GB", _nv(9.7, 19.5, 156, 312), 2039, A100_DS),
    # A100-PG509-200: the SXM4 40 GB board (part PG509) in Meta's clusters, as in the shared HTA trace
    Peak("A100 40GB (SXM/PCIe)", r"A100", _nv(9.7, 19.5, 156, 312), 1555, A100_DS),
    Peak("H100 PCIe", r"H100.*PCIE", _nv(25.6, 51.2, 378, 756.5, 1513), 2000, H100_DS),
    Peak("H100 NVL", r"H100.*NVL", _nv(30.0, 60.0, 417.5, 835.5, 1670.5), 3900, H100_DS),
    Peak("H100 SXM", r"H100", _nv(33.5, 67.0, 494.5, 989.5, 1979), 3350, H100_DS),
    Peak("H200 NVL", r"H200.*NVL", _nv(30.0, 60.0, 417.5, 835.5, 1670.5), 4800, H200_DS),
    Peak("H200 SXM", r"H200", _nv(33.5, 67.0, 494.5, 989.5, 1979), 4800, H200_DS),
    Peak("B200", r"B200", _nv(37.0, 75.0, 1125, 2250, 4500), 8000, B200_DS),
    Peak("L4", r"\bL4\b", _nv(0.49, 30.3, 60, 121, 242.5), 300, L4_DS),
    Peak("A10", r"\bA10\b", _nv(0.98, 31.2, 62.5, 125), 600, A10_DS),
    Peak(
        "MI325X",
        r"MI325X",
        {"fp64": 81.7, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9},
        6000,
        MI325_DS,
        (9, 4, 304),
    ),
    Peak(
        "MI300X",
        r"MI300X",
        {"fp64": 81.7, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9},
        5300,
        MI300_DS,
        (9, 4, 304),
    ),
    Peak(
        "MI250X (one GCD)",
        r"MI250X",
        {"fp64": 47.85, "fp32": 47.85, "bf16": 191.5, "fp16": 191.5, "int8": 191.5},
        1638.4,
        MI250_DS,
        (9, 0, 110),
    ),
    Peak(
        "MI250 (one GCD)",
        r"MI250",
        {"fp64": 45.25, "fp32": 45.25, "bf16": 181.05, "fp16": 181.05, "int8": 181.05},
        1638.4,
        MI250_DS,
        (9, 0, 104),
    ),
)


def _arch(props: dict[str, Any]) -> tuple[Any, Any, Any]:
    return props.get("computeMajor"), props.get("computeMinor"), props.get("numSms")


def find_peak(props: dict[str, Any]) -> Peak | None:
    """The row for one ``deviceProperties`` entry: by name pattern, else (AMD bare names) by architecture."""
    name = str(props.get("name", ""))
    for peak in PEAKS:
        if re.search(peak.pattern, name, re.IGNORECASE):
            return peak
    if "AMD" in name.upper() or "RADEON" in name.upper():
        matches = [peak for peak in PEAKS if peak.arch is not None and peak.arch == _arch(props)]
        if matches:
            return matches[-1] if props.get("totalGlobalMem", 0) < 250e9 else matches[0]  # MI325X has 256 GB
    return None


def device_peaks(header: dict[str, Any]) -> dict[int, tuple[str, Peak | None]]:
    """Per device id in the trace header: (Kineto's name, the matching row or None)."""
    out: dict[int, tuple[str, Peak | None]] = {}
    for props in header.get("deviceProperties") or []:
        if isinstance(props, dict) and isinstance(props.get("id"), int):
            out[int(props["id"])] = (str(props.get("name", "")), find_peak(props))
    return out


@dataclass(frozen=True)
class PeakChoice:
    """The peaks MFU is measured against: ``tflops`` (the trace's FLOPs-weighted peak over the math modes of its
    counted ops; NaN when none), ``dtype`` (the mode with the most FLOPs), device, a note saying why, ``basis``
    (how each op's peak was chosen) and ``mode_tflops`` (the peak of each math mode the trace ran)."""

    tflops: float
    dtype: str
    device: str
    note: str
    memory_gbps: float = float("nan")
    source: str = ""  # the datasheet the peak comes from
    basis: str = ""  # "each op's math mode (...)", "--peak-tflops", "" (no MFU)
    mode_tflops: dict[str, float] = field(default_factory=dict)  # math mode -> dense peak TFLOP/s
    mode_share: dict[str, float] = field(default_factory=dict)  # math mode -> share of the counted FLOPs
    row: Peak | None = None  # the device's row of PEAKS (None: --peak-tflops, or no known device)
    override: float | None = None  # --peak-tflops

    def roof(self, mode: str) -> float:
        """Dense peak TFLOP/s of one math mode: ``--peak-tflops``, else the device row's, else NaN."""
        if self.override is not None:
            return float(self.override)
        value = self.row.tflops_for(mode or "fp32") if self.row is not None else None
        return float(value) if value else float("nan")

    def roofs(self, modes: Any) -> np.ndarray:
        """:meth:`roof` of each element of ``modes`` (one lookup per distinct mode)."""
        values = np.asarray(modes, dtype=object).astype(str)
        distinct, inverse = np.unique(values, return_inverse=True)
        return np.array([self.roof(m) for m in distinct], dtype=np.float64)[inverse.ravel()]


def mode_flops(flops: pd.DataFrame) -> pd.Series:
    """Counted FLOPs of the ops that ran on the device, per math mode, most first."""
    counted = flops[flops["status"].isin(["counted", "backward via forward op"]) & flops["on_device"]]
    by_mode = counted[counted["flops"] > 0].groupby("math_mode", observed=True)["flops"].sum()
    return by_mode[by_mode.index != ""].sort_values(ascending=False, kind="stable")


def _share_text(share: float) -> str:
    return "<1%" if share < 0.005 else f"{share:.0%}"


def _basis(flops: pd.DataFrame) -> str:
    """Which part of the counted FLOPs took its math mode from kernel names, and which from the input dtype."""
    counted = flops[flops["status"].isin(["counted", "backward via forward op"]) & flops["on_device"]]
    total = float(counted["flops"].sum())
    from_kernels = counted["math_mode_rule"].isin([rule.name for rule in MATH_MODE_RULES])
    by_kernel = float(counted.loc[from_kernels, "flops"].sum())
    if total <= 0:
        return "each op's math mode"
    return f"each op's math mode: kernel names for {by_kernel / total:.0%} of FLOPs, input dtypes for the rest"


def choose_peak(
    header: dict[str, Any], events: pd.DataFrame, flops: pd.DataFrame, peak_tflops: float | None
) -> PeakChoice:
    """The dense peaks of the busiest device for each op's math mode (``peak_tflops``, the option, wins for every
    mode)."""
    by_mode = mode_flops(flops)
    dtype = str(by_mode.index[0]) if len(by_mode) else "fp32"
    share = {str(m): float(v / by_mode.sum()) for m, v in by_mode.items()}
    kernels = kind_mask(events, {"kernel"})
    if peak_tflops is not None:
        note = f"--peak-tflops {peak_tflops:g} for every math mode"
        modes = dict.fromkeys(share, float(peak_tflops))
        return PeakChoice(float(peak_tflops), dtype, "", note, basis="--peak-tflops", mode_tflops=modes,
                          mode_share=share, override=float(peak_tflops))  # fmt: skip
    if not kernels.any():
        return PeakChoice(float("nan"), dtype, "", "no MFU: CPU-only trace (no GPU kernels), FLOPs still counted")
    device = events["device"].to_numpy()[kernels]
    dur = events["dur_ns"].to_numpy()[kernels]
    busiest = pd.Series(dur).groupby(device).sum().idxmax()
    peaks = device_peaks(header)
    name, peak = peaks.get(int(busiest), peaks.get(min(peaks), ("", None)) if peaks else ("", None))
    if peak is None:
        why = f"device {name!r} is not in the peak table" if name else "the trace names no device"
        return PeakChoice(float("nan"), dtype, name, f"no MFU: {why}; pass --peak-tflops")
    choice = PeakChoice(float("nan"), dtype, name, "", peak.memory_gbps, peak.source, _basis(flops), row=peak)
    modes = {m: choice.roof(m) for m in share} or {dtype: choice.roof(dtype)}
    time_at_peak = sum(share.get(m, 1.0) / value for m, value in modes.items())  # per FLOP, in 1/TFLOP/s
    parts = [f"{m} {value:g} TFLOP/s" + (f" ({_share_text(share[m])} of FLOPs)" if len(modes) > 1 else "")
             for m, value in modes.items()]  # fmt: skip
    note = f"{name} = {peak.device}, dense peak of {', '.join(parts)}"
    tflops = next(iter(modes.values())) if len(modes) == 1 else 1.0 / time_at_peak  # one mode: its peak, exactly
    return replace(choice, tflops=tflops, note=note, mode_tflops=modes, mode_share=share)
