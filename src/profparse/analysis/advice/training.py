"""Findings about the training loop's own work: gradient zeroing, unbatched optimizers, recomputed forwards."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.analysis.advice.build import from_path, from_segments
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding, WhatIf
from profparse.analysis.advice.kinds import detector
from profparse.base.marks import STAGES
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, GPU_TRACK_KINDS
from profparse.trace.link import kind_mask

#: ops only a forward runs (backward formulas call mm, mul and *_backward ops instead)
FORWARD_ONLY_OP = re.compile(
    r"^aten::(linear|embedding|matmul|conv[123]d|convolution|layer_norm|rms_norm|scaled_dot_product_attention"
    r"|softmax|silu|gelu|relu|dropout)$"
)
CHECKPOINT_FRAME = re.compile(r"torch/utils/checkpoint\.py\(\d+\)")
TORCH_FRAME = re.compile(r"^(torch/|<built-in|<frozen|contextlib|functools|threading|typing|abc)")
ZERO_GRAD_RANGE = re.compile(r"^Optimizer\.zero_grad#|(?i:^(?!Optimizer\.).*zero_grad)")
ZERO_OP = re.compile(r"^aten::(zero_|fill_|_foreach_zero_)$")
ACCUMULATE_GRAD = re.compile(r"^torch::autograd::AccumulateGrad$")
IN_PLACE_ADD = re.compile(r"^aten::(add_|_foreach_add_)$")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
BATCHED_OP = re.compile(r"^aten::_(foreach|fused)_")
#: an optimizer step with at least this many per-tensor ops per step (and no batched op) is not batched
MIN_PER_TENSOR_OPS = 16
BACKWARD = STAGES.index("backward")
FORWARD = STAGES.index("forward")


@detector
def recompute(ctx: AdviceContext) -> list[Finding]:
    """Forward ops inside backward: activation checkpointing recomputing the forward. A recomputation runs at the
    start of the backward node that needs its saved tensors (non-reentrant) or inside the checkpoint's own node
    (reentrant), so it spans from that node's start to the end of its last forward op; the saving is the path
    time inside those spans."""
    events = ctx.events
    ops = kind_mask(events, {"cpu_op"}) & ctx.parsed.links.host
    in_backward = ctx.parsed.attribution.stage == BACKWARD
    forward = ops & in_backward & ctx.in_steps() & ctx.names(FORWARD_ONLY_OP)
    if not forward.any():
        return []
    owner = ctx.owner(forward)
    outermost = np.unique(owner[forward])
    node = ctx.parsed.links.parent.astype(np.int64)[outermost]
    keep = node >= 0
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    spans = pd.DataFrame({"node": node[keep], "end": end[outermost[keep]]}).groupby("node")["end"].max()
    starts, ends = ts[spans.index.to_numpy()], _own_work_start(ctx, spans, ops & ~forward)
    evidence = {
        "recomputing_nodes_per_step": round(len(spans) / len(ctx.steps), 1),
        "recomputed_ops_per_step": round(len(outermost) / len(ctx.steps), 1),
        "recomputed_allocated_mb_per_step": round(_allocated(ctx, owner) / len(ctx.steps) / 2**20, 2),
    }
    path = ctx.path
    inside = _overlap(path["start_ns"].to_numpy(), path["end_ns"].to_numpy(), starts, ends)
    share = np.divide(inside, path["ns"].to_numpy(), out=np.zeros(len(path)), where=path["ns"].to_numpy() > 0)
    hooks = _checkpoint_hooks(ctx)
    if hooks is not None:  # with stacks: the recomputation and the checkpoint's own hooks, frame by frame
        segments, share, confidence = hooks, None, "high"
        evidence["counted"] = "path time under torch/utils/checkpoint.py frames (recomputation and hooks)"
    else:
        segments, confidence = inside > 0, "medium"
        evidence["counted"] = "the recomputation only: the checkpoint's hooks need Python stacks (with_stack=True)"
    found = from_path(
        ctx,
        "recompute",
        segments,
        confidence,
        "backward recomputes the forward (activation checkpointing): {saving} per step ({share}) on the critical path",
        evidence,
        weight=share,
    )
    gpu = np.flatnonzero(ctx.under(forward) & kind_mask(events, GPU_ACTIVITY_KINDS))
    for f in found:  # the recomputing spans' host time and the recomputed kernels gone
        f.what_if = WhatIf(np.stack([starts, np.maximum(ends, starts)], axis=1), 1.0, gpu, 0.0)
        if hooks is not None and f.what_if is not None:
            f.what_if.host = np.concatenate([f.what_if.host, from_segments(ctx, hooks).host])
    return found


def _checkpoint_hooks(ctx: AdviceContext) -> np.ndarray | None:
    """With Python stacks, the path segments that checkpointing adds: in backward everything under one of
    ``torch/utils/checkpoint.py``'s frames (the unpack hooks run the recomputation), in forward what runs with
    such a frame as its nearest frame outside torch (the pack hooks; the checkpointed forward itself runs in the
    model's frames). None without such frames."""
    frames = ctx.names(CHECKPOINT_FRAME) & kind_mask(ctx.events, {"python_function"})
    if not (frames & ctx.in_steps()).any():
        return None
    stage = ctx.parsed.attribution.stage
    backward_rows = ctx.under(frames & (stage == BACKWARD))
    # torch's own frames (grad modes, nn.Module's call) are transparent: what decides is the nearest frame that
    # is checkpoint's or the model's
    python = kind_mask(ctx.events, {"python_function"})
    innermost = ctx.innermost(python & (frames | ~ctx.names(TORCH_FRAME)))
    forward_rows = np.zeros(len(frames), dtype=bool)
    has = innermost >= 0
    forward_rows[has] = frames[innermost[has]]
    forward_rows &= stage == FORWARD
    return ctx.segments_of(backward_rows | forward_rows)


def _own_work_start(ctx: AdviceContext, last_forward_end: pd.Series, others: np.ndarray) -> np.ndarray:
    """Per recomputing node (``last_forward_end``: node row -> end of its last forward op): where the node's own
    backward work starts, the first other op under it that starts after that end (the checkpoint's bookkeeping
    between the two is recomputation too); the node's end when there is none."""
    events = ctx.events
    ts = events["ts_ns"].to_numpy()
    parent = ctx.parsed.links.parent.astype(np.int64)
    nodes = last_forward_end.index.to_numpy()
    rows = np.flatnonzero(others & np.isin(parent, nodes))
    after = pd.DataFrame({"node": parent[rows], "ts": ts[rows]})
    after = after[after["ts"] >= last_forward_end.reindex(after["node"]).to_numpy()]
    first = after.groupby("node")["ts"].min()
    node_end = pd.Series(ts[nodes] + events["dur_ns"].to_numpy()[nodes], index=nodes)
    return first.reindex(nodes).fillna(node_end).to_numpy(dtype=np.int64)


def _overlap(seg_start: np.ndarray, seg_end: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per segment: ns inside the union of the spans (``starts``/``ends``)."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    ends = np.maximum.accumulate(ends)  # nested or overlapping spans: merged
    new = np.concatenate([[True], starts[1:] > ends[:-1]])
    merged_start = starts[new]
    merged_end = np.maximum.reduceat(ends, np.flatnonzero(new))
    before = np.concatenate([[0], np.cumsum(merged_end - merged_start)])

    def covered(t: np.ndarray) -> np.ndarray:  # span time before t
        i = np.searchsorted(merged_start, t, side="right")
        prev = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.clip(t - merged_start[prev], 0, merged_end[prev] - merged_start[prev]), 0)
        return before[np.maximum(i - 1, 0)] * (i > 0) + inside

    return covered(seg_end) - covered(seg_start)


def _allocated(ctx: AdviceContext, owner: np.ndarray) -> float:
    """Bytes allocated by [memory] events under the recomputed ops (what checkpointing keeps from forward)."""
    events = ctx.events
    memory = np.flatnonzero(kind_mask(events, {"memory"}) & (owner >= 0))
    if not len(memory):
        return 0.0
    nbytes = pd.array(events["mem_bytes"].iloc[memory], dtype="Int64").fillna(0).to_numpy(dtype=np.int64)
    return float(nbytes[nbytes > 0].sum())


@detector
def grad_zeroing(ctx: AdviceContext) -> list[Finding]:
    """Gradients zeroed instead of dropped: the zeroing ops inside ``zero_grad``, plus the in-place adds with which
    the next backward accumulates into them (``AccumulateGrad``), which a dropped gradient does not need. With
    several backward passes per step only the first pass's adds go."""
    in_steps = ctx.in_steps()
    zero_ops = ctx.names(ZERO_OP) & ctx.under(ctx.names(ZERO_GRAD_RANGE)) & in_steps
    if not zero_ops.any():
        return []
    accumulate = ctx.names(ACCUMULATE_GRAD) & in_steps
    adds = ctx.names(IN_PLACE_ADD) & ctx.under(accumulate) & _first_backward(ctx)
    adding = np.zeros(len(adds), dtype=bool)  # the AccumulateGrad calls that add (a dropped gradient is taken)
    owners = ctx.owner(accumulate)[adds]
    adding[owners[owners >= 0]] = True
    segments = ctx.segments_of(ctx.under(zero_ops) | ctx.under(adding))
    per_step = max(len(ctx.steps), 1)
    outermost = zero_ops & (ctx.owner(zero_ops) == np.arange(len(zero_ops)))  # not the fill_ under a zero_
    evidence = {
        "zeroing_ops_per_step": round(int(outermost.sum()) / per_step, 1),
        "accumulating_adds_per_step": round(int(adds.sum()) / per_step, 1),
    }
    return from_path(
        ctx,
        "grad_zeroing",
        segments,
        "high",
        "gradients are zeroed and then added to instead of dropped: {saving} per step ({share}) on the critical path",
        evidence,
    )


def _first_backward(ctx: AdviceContext) -> np.ndarray:
    """Boolean per row: the row starts before the first forward that follows the step's first backward event.
    Host rows only decide it: the GPU runs the forward's queued kernels well after the host began the backward."""
    attribution = ctx.parsed.attribution
    ts = ctx.events["ts_ns"].to_numpy()
    steps = ctx.steps.sort_values("step")
    numbers, ends = steps["step"].to_numpy(dtype=np.int64), steps["end_ns"].to_numpy(dtype=np.int64)
    if not len(numbers):
        return np.zeros(len(ts), dtype=bool)
    step = np.asarray(attribution.step, dtype=np.int64)
    at = np.minimum(np.searchsorted(numbers, step), len(numbers) - 1)  # each row's steady step, where it has one
    steady = numbers[at] == step
    host = steady & ~kind_mask(ctx.events, GPU_TRACK_KINDS)
    never = np.iinfo(np.int64).max
    first_backward = np.full(len(numbers), never)
    rows = host & (attribution.stage == BACKWARD)
    np.minimum.at(first_backward, at[rows], ts[rows])
    rows = host & (attribution.stage == FORWARD)
    forward_at, forward_ts = at[rows], ts[rows]
    later = forward_ts > first_backward[forward_at]
    cut = np.full(len(numbers), never)
    np.minimum.at(cut, forward_at[later], forward_ts[later])
    limit = np.where(cut < never, cut, ends)  # no forward after the backward: the step's end
    return steady & (ts < limit[at])


@detector
def optimizer_not_batched(ctx: AdviceContext) -> list[Finding]:
    """An optimizer step that runs its math one tensor at a time. Batched, it makes one pass over all parameters
    per op kind at the cost of the most expensive kind, so the saving is the step's path time minus that pass:
    per op kind the time its calls take beyond the cheapest call (the fixed cost of a call, which batching pays
    once), the most of them."""
    events = ctx.events
    steps = ctx.names(OPTIMIZER_STEP) & ctx.in_steps()
    if not steps.any():
        return []
    # the outermost ops inside the range (with stacks they sit under the optimizer's Python frames)
    enclosing = ctx.parsed.links.enclosing_op.astype(np.int64)
    ops = kind_mask(events, {"cpu_op"}) & ~steps & ctx.under(steps)
    child = ops & ((enclosing < 0) | steps[np.maximum(enclosing, 0)])
    if (child & ctx.names(BATCHED_OP)).any():
        return []
    rows = np.flatnonzero(child)
    if len(rows) < MIN_PER_TENSOR_OPS * len(ctx.steps):
        return []
    calls = pd.DataFrame({"name": ctx.name_of(rows), "dur": events["dur_ns"].to_numpy()[rows]})
    beyond = calls["dur"] - calls.groupby("name", observed=True)["dur"].transform("min")
    one_pass = float(beyond.groupby(calls["name"], observed=True).sum().max()) / len(ctx.steps)
    segments = ctx.segments_of(ctx.under(steps))
    path_ns = float(ctx.per_step(segments).mean())
    if path_ns <= one_pass:
        return []
    per_step = len(rows) / len(ctx.steps)
    evidence = {
        "per_tensor_ops_per_step": round(per_step, 1),
        "op_kinds": int(calls["name"].nunique()),
        "batched_pass_ms_per_step": round(one_pass / 1e6, 3),
    }
    found = from_path(
        ctx,
        "optimizer_not_batched",
        segments,
        "medium",
        f"the optimizer step runs {per_step:,.0f} per-tensor ops per step; batched it would save {{saving}} per step"
        " ({share})",
        evidence,
        scale=1 - one_pass / path_ns,
    )
    for finding in found:
        finding.fix = _batched_fix(ctx, steps)
    return found


def _batched_fix(ctx: AdviceContext, steps: np.ndarray) -> str:
    """The fix, naming the optimizer's class from its range (``Optimizer.step#SGD.step``)."""
    name = str(ctx.name_of(np.flatnonzero(steps)[:1])[0])
    cls = name.partition("#")[2].partition(".")[0] or "AdamW"
    return (
        f"batch the optimizer over all parameters: torch.optim.{cls}(..., fused=True) where it has a fused kernel"
        " (Adam, AdamW, SGD, Adagrad; on CPU and GPU), else foreach=True"
    )
