"""Findings about the device: exposed communication, launch-bound stages, fp32 matmuls, pageable copies."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.analysis.advice.build import from_path, from_segments, material_steps, ms, share
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.analysis.advice.kinds import detector
from profparse.base.arrays import in_categories
from profparse.base.marks import STAGES
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask

#: a stage is launch bound when host work holds at least this share of its path and its kernels are this short
LAUNCH_HOST_SHARE = 0.5
SMALL_KERNEL_NS = 20_000
_HOST_BOUNDS = ("python", "cpu_op", "launch")
_ON_DEVICE = ("gpu_compute", "gpu_comm", "memcpy", "gpu_idle")


@detector
def exposed_communication(ctx: AdviceContext) -> list[Finding]:
    """Collectives on the path that no other GPU work overlaps: overlap could hide them, up to their exposed time
    (``comm_exposure``)."""
    path = ctx.path
    segments = (path["bound"] == "gpu_comm").to_numpy()
    if not segments.any():
        return []
    exposure = ctx.parsed.table("comm_exposure")
    exposure = exposure[(exposure["scope"] == "step") & exposure["step"].isin(ctx.steps["step"])]
    exposed = exposure.groupby("step")["exposed_ns"].sum().reindex(ctx.steps["step"], fill_value=0)
    on_path = ctx.per_step(segments)
    scale = float(np.minimum(exposed, on_path).sum() / on_path.sum()) if on_path.sum() else 0.0
    evidence = {
        "exposed_ms_per_step": round(float(exposed.mean()) / 1e6, 3),
        "collective_ms_per_step": round(float(exposure["comm_ns"].sum()) / len(ctx.steps) / 1e6, 3),
    }
    found = from_path(
        ctx,
        "exposed_communication",
        segments,
        "medium",
        "collectives that nothing overlaps hold the critical path for {saving} per step ({share})",
        evidence,
        scale=scale,
    )
    for f in found:  # overlap is not simulated yet (the replay runs each stream in its order): the path's estimate
        f.what_if = None
    return found


@detector
def launch_bound(ctx: AdviceContext) -> list[Finding]:
    """Stages whose path is mostly host work (Python, dispatch, launches) while their kernels are short: with the
    launches gone (CUDA graphs, torch.compile) the stage would take its GPU busy time."""
    kernels = kind_mask(ctx.events, GPU_ACTIVITY_KINDS) & ctx.in_steps()
    if not kernels.any():
        return []
    path, n = ctx.path, len(ctx.steps)
    staged = ~in_categories(path["stage"], ("other",))
    host = in_categories(path["bound"], _HOST_BOUNDS) & staged
    counted = host | (in_categories(path["bound"], _ON_DEVICE) & staged)
    # per steady step (rows) and stage (columns); a (step, stage) counts where its path holds time
    total, on_host, busy = ctx.step_stage_sums(counted), ctx.step_stage_sums(host), _step_busy(ctx)
    held = total > 0
    stage_code = ctx.parsed.attribution.stage[kernels]
    durations = ctx.events["dur_ns"].to_numpy()[kernels]
    median = np.array([np.median(durations[stage_code == k]) if (stage_code == k).any() else np.inf
                       for k in range(len(STAGES))])  # fmt: skip
    kernel_count = np.bincount(stage_code, minlength=len(STAGES))
    bound = held & (on_host >= LAUNCH_HOST_SHARE * total) & (busy > 0) & (median <= SMALL_KERNEL_NS)
    saving = np.maximum(np.where(bound, total - busy, 0.0), 0.0)
    steps = ctx.steps["step"].to_numpy()
    found = []
    for stage in sorted(STAGES):  # in the order of the stages' names
        k = STAGES.index(stage)
        rows = held[:, k]
        mean = float(saving[rows, k].sum()) / n
        if mean <= 0:
            continue
        idle = float(np.maximum(total[rows, k] - busy[rows, k], 0).sum()) / n
        template = (
            f"{stage}: the GPU waits for the host to launch short kernels (median {median[k] / 1e3:.1f} us);"
            " without the launches it would save {saving} per step ({share})"
        )
        text = template.format(saving=ms(mean), share=share(mean, ctx.step_ns))
        evidence = {
            "median_kernel_us": round(float(median[k]) / 1e3, 2),
            "kernels_per_step": round(int(kernel_count[k]) / n, 1),
            "host_bound_ms_per_step": round(float(on_host[rows, k].sum()) / n / 1e6, 3),
            "gpu_busy_ms_per_step": round(float(busy[rows, k].sum()) / n / 1e6, 3),
            "gpu_waiting_ms_per_step": round(idle / 1e6, 3),
        }
        material = material_steps(pd.Series(saving[rows, k], index=steps[rows]))
        finding = Finding("launch_bound", stage, material, mean, ctx.step_ns, "medium", text, evidence)
        # graph replay: the stage's host work on the path (dispatch, launches) gone, its kernels as they were
        on_stage = host & in_categories(path["stage"], (stage,))
        finding.what_if, finding.template = from_segments(ctx, on_stage), template
        found.append(finding)
    return found


def _step_busy(ctx: AdviceContext) -> np.ndarray:
    """GPU busy ns per steady step and stage (as :meth:`AdviceContext.step_stage_sums`), from the stage summary."""
    summary = ctx.parsed.table("stage_summary")
    rows = summary[summary["scope"] == "step"]
    busy = np.zeros((len(ctx.steps), len(STAGES)), dtype=np.int64)
    at = pd.Index(ctx.steps["step"].to_numpy()).get_indexer(rows["step"].to_numpy())
    stage = rows["stage"].cat.codes.to_numpy()
    keep = (at >= 0) & (stage >= 0)
    busy[at[keep], stage[keep]] = rows["gpu_busy_ns"].to_numpy()[keep]
    return busy


@detector
def fp32_matmul(ctx: AdviceContext) -> list[Finding]:
    """fp32 matmuls (no TF32) on a GPU whose TF32 is faster: each would take the longer of its time scaled by the
    ratio of the two peaks and the time to move its bytes at the memory bandwidth."""
    peak = ctx.parsed.peak
    row = getattr(peak, "row", None)
    if row is None:
        return []
    fp32, tf32 = row.tflops.get("fp32", 0.0), row.tflops.get("tf32", 0.0)
    if not fp32 or tf32 <= fp32:
        return []
    flops = ctx.parsed.table("flops")
    fp32_ops = flops[
        (flops["math_mode"] == "fp32") & (flops["family"] == "matmul") & flops["step"].isin(ctx.steps["step"])
    ]
    if fp32_ops.empty:
        return []
    rows = np.searchsorted(ctx.events["trace_index"].to_numpy(), fp32_ops["trace_index"].to_numpy())
    flag = np.zeros(len(ctx.events), dtype=bool)
    flag[rows] = True
    under = ctx.under(flag)
    segments = ctx.segments_of(under) & in_categories(ctx.path["bound"], ("gpu_compute",))
    gpu_ns = fp32_ops["gpu_ns"].to_numpy(dtype=np.float64)
    floor = fp32_ops["bytes"].to_numpy(dtype=np.float64) / (row.memory_gbps * 1e9) * 1e9 if row.memory_gbps else 0
    after = np.maximum(gpu_ns * fp32 / tf32, floor)
    scale = float(1 - after.sum() / gpu_ns.sum()) if gpu_ns.sum() else 0.0
    evidence = {
        "fp32_tflops": fp32,
        "tf32_tflops": tf32,
        "fp32_matmul_gpu_ms_per_step": round(float(gpu_ns.sum()) / len(ctx.steps) / 1e6, 3),
        "device": peak.device,
    }
    found = from_path(
        ctx,
        "fp32_matmul",
        segments,
        "low",
        f"matmuls run in plain fp32 on {peak.device}, whose TF32 peak is {tf32 / fp32:.0f}x higher: about {{saving}}"
        " per step ({share})",
        evidence,
        scale=scale,
    )
    kernels = np.flatnonzero(under & kind_mask(ctx.events, {"kernel"}))
    for f in found:  # every fp32 matmul kernel at TF32's rate (or its bytes' time), on the path or not
        f.what_if = WhatIf(gpu_rows=kernels, gpu_factor=1.0 - scale)
    return found
