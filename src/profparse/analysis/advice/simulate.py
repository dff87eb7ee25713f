"""Savings as simulated what-ifs: each fix applied to the step's graph without the profiler, then replayed.

A finding that carries a :class:`~profparse.analysis.advice.finding.WhatIf` has its saving replaced by the
replayed step without the profiler's cost (:mod:`profparse.analysis.replay`) less the same with the fix applied;
its share is of that profiler-free step. The critical path's own estimate stays in the evidence
(``path_saving_ms_per_step``). A finding without one keeps the path's estimate (``basis``: ``critical path``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.analysis import replay as rp
from profparse.analysis.advice.build import ms, share
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.analysis.profiler_cost import costs
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask


def simulate(ctx: AdviceContext, found: list[Finding]) -> None:
    """Replace the saving of each finding with a what-if by its replayed saving (in place)."""
    todo = [f for f in found if f.what_if is not None]
    if not todo:
        return
    parsed = ctx.parsed
    model = parsed.value("replay_model")  # the replay table's, when it was made first
    if model is None:
        return
    cost, basis = costs(model, parsed.header, bool(kind_mask(parsed.raw.events, GPU_ACTIVITY_KINDS).any()))
    changes = []
    for f in todo:  # before the replays (their lists would be held under the changes' temporaries)
        changes.append(change(model, f.what_if))  # type: ignore[arg-type]
        f.what_if = None  # its intervals (every host event of a stage, for launch_bound) are in the change now
    before = rp.mean_step(model, cost)
    alone = [max(before - rp.mean_step(model, cost, c), 0.0) for c in changes]
    # the fixes that will be listed are applied one after another: the specific ones first (the biggest first),
    # the catch-all launch_bound (all host work of a stage) on what they leave
    listed = [i for i in range(len(todo)) if alone[i] >= todo[i].threshold_ns(before)]
    order = sorted(listed, key=lambda i: (todo[i].kind == "launch_bound", -alone[i]))
    savings = dict(enumerate(alone))
    marginal = _marginal(model, cost, before, [changes[i] for i in order], alone[order[0]] if order else 0.0)
    savings.update(zip(order, marginal, strict=True))
    for i, f in enumerate(todo):
        saving = savings[i]
        if i in order[1:]:
            f.evidence["applied_after"] = sorted({todo[j].kind for j in order[: order.index(i)]})
        f.evidence["path_saving_ms_per_step"] = round(f.saving_ns_per_step / 1e6, 3)
        f.evidence["basis"] = f"simulated: replayed without the profiler ({basis} costs per event)"
        f.evidence["step_without_profiler_ms"] = round(before / 1e6, 3)
        f.saving_ns_per_step, f.step_ns = saving, before
        if f.template:
            f.message = f.template.format(saving=ms(saving), share=share(saving, before))


def change(model: rp.Model, what: WhatIf) -> rp.Change:
    """The model's change for a fix."""
    removed = None
    if len(what.host):
        # relative to the model's base before float64: trace clocks near 2**60 ns would round to 256 ns
        removed = (rp.Removed.of((what.host - model.base).astype(np.float64), what.host_share),)
    scale = None
    if len(what.gpu_rows):
        at = pd.Index(model.gpu.rows).get_indexer(what.gpu_rows)
        scale = np.ones(len(model.gpu.rows))
        scale[at[at >= 0]] = what.gpu_factor
    dropped = None
    if len(what.call_rows):
        dropped = np.isin(model.calls.rows, what.call_rows)
    return rp.Change(gpu_scale=scale, host_removed=removed, calls_dropped=dropped)


def _marginal(model: rp.Model, cost: np.ndarray, before: float, changes: list[rp.Change], first: float) -> list[float]:
    """Each fix's saving once the ones before it are applied: fixes that free the same time (two stages'
    launches, a stall and the work behind it) are not counted twice, and together they claim what all of them
    save at once. One replay per fix after the first, whose saving alone is ``first``."""
    out, done = [], 0.0
    for k in range(len(changes)):
        if k == 0:  # the first fix joined with none is that fix: its replay is the one ``first`` came from
            total = first
        else:
            total = max(before - rp.mean_step(model, cost, _joined(changes[: k + 1])), 0.0)
        out.append(max(total - done, 0.0))
        done = max(total, done)
    return out


def _joined(changes: list[rp.Change]) -> rp.Change:
    """All the changes at once: host time removed added (a piece loses at most its length), GPU factors
    multiplied, dropped calls together."""
    removed = [c.host_removed for c in changes if c.host_removed is not None]
    scales = [c.gpu_scale for c in changes if c.gpu_scale is not None]
    dropped = [c.calls_dropped for c in changes if c.calls_dropped is not None]
    return rp.Change(
        gpu_scale=np.prod(scales, axis=0) if scales else None,
        host_removed=tuple(part for parts in removed for part in parts) if removed else None,
        calls_dropped=np.any(dropped, axis=0) if dropped else None,
    )
