"""Turning a set of critical-path segments into a finding: saving per step, stages, steps, top events."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.base.arrays import in_categories

_HOST = ("python", "cpu_op", "launch", "data", "sync_wait")
_GPU = ("gpu_compute", "gpu_comm", "memcpy")

#: a stage is named in a finding when it holds at least this share of the saving
STAGE_SHARE = 0.1


def ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def stages(ctx: AdviceContext, segment_mask: np.ndarray) -> str:
    """The stages holding the segments' time, most first (those with at least :data:`STAGE_SHARE` of it)."""
    seg = ctx.path.loc[segment_mask]
    if seg.empty:
        return "other"
    by_stage = seg.groupby("stage", observed=True)["ns"].sum().sort_values(ascending=False)
    kept = by_stage[by_stage >= STAGE_SHARE * by_stage.sum()]
    return ",".join(str(s) for s in kept.index)


#: a step shows the pattern when its saving is at least this share of the mean step's
MATERIAL = 0.25


def material_steps(per_step: pd.Series) -> list[int]:
    """The steps whose saving is material: at least :data:`MATERIAL` of the mean (a per-step pattern recurs; a
    one-off shows in one step)."""
    mean = float(per_step.mean()) if len(per_step) else 0.0
    return [int(s) for s, v in per_step.items() if v > 0 and v >= MATERIAL * mean]


def from_path(
    ctx: AdviceContext,
    kind: str,
    segment_mask: np.ndarray,
    confidence: str,
    message: str,
    evidence: dict[str, Any] | None = None,
    key: np.ndarray | None = None,
    scale: float = 1.0,
    weight: np.ndarray | None = None,
) -> list[Finding]:
    """A finding whose saving is ``scale`` times the path time of the segments in ``segment_mask`` (each counted
    at its ``weight``, a share of it, when given) per steady step; no finding when that is zero. ``message`` may
    hold ``{saving}`` and ``{share}``."""
    per_step = ctx.per_step(segment_mask, weight) * scale
    saving = float(per_step.mean()) if len(per_step) else 0.0
    if saving <= 0:
        return []
    steps = material_steps(per_step)
    found = {
        "path_ms_per_step": round(saving / scale / 1e6, 3),
        "top_events": ctx.top(segment_mask, key),
        **(evidence or {}),
    }
    if ctx.warm_up:
        found["warm_up_steps_left_out"] = ctx.warm_up
    text = message.format(saving=ms(saving), share=share(saving, ctx.step_ns))
    finding = Finding(kind, stages(ctx, segment_mask), steps, saving, ctx.step_ns, confidence, text, found)
    finding.what_if, finding.template = from_segments(ctx, segment_mask, scale), message
    finding.typical = min(float(per_step.median()) / saving, 1.0)
    return [finding]


def from_segments(ctx: AdviceContext, mask: np.ndarray, scale: float = 1.0) -> WhatIf:
    """The fix of a path-based finding: its host segments' time removed, its GPU segments' activities shortened,
    both by ``scale`` (the share of them the fix saves)."""
    path = ctx.path
    host = mask & in_categories(path["bound"], _HOST)
    gpu = mask & in_categories(path["bound"], _GPU)
    rows = ctx.segment_rows[gpu]
    intervals = np.stack([path["start_ns"].to_numpy()[host], path["end_ns"].to_numpy()[host]], axis=1)
    return WhatIf(intervals, scale, np.unique(rows[rows >= 0]), 1.0 - scale)
