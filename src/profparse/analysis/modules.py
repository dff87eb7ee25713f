"""Forward and backward time per ``nn.Module`` instance.

Forward: every ``nn.Module: <Class>_<instance>`` event (a Python frame recorded with ``with_stack``/``with_modules``)
is one call; its host time is the call's duration, its GPU time the activity launched from inside it. Module
times are inclusive (a layer includes its sub-modules); ``host_self_ns`` is the part not inside a sub-module.

Backward: a backward node (an op with ``Fwd thread id`` > 0) shares its ``Sequence number`` with the forward op
that created it. The node's time (its outermost event: the ``autograd::engine::evaluate_function: ...`` wrapper
when present) and the GPU activity launched inside it count for the innermost module call around that forward op,
and roll up to the enclosing modules. Module calls that run inside backward (activation-checkpoint recompute)
are counted in the backward stage with ``recompute`` = True.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.base.arrays import grouped
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.rows import stage_categorical
from profparse.trace.ancestors import innermost_ancestor_of_kind
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask, name_mask

MODULE_EVENT = re.compile(r"^nn\.Module: .")
MODULE_NAME = r"^(.+?)(?:_(\d+))?$"  # Class_instance
NO_MODULE = "(none)"
BACKWARD = STAGES.index("backward")
HOST_KINDS = frozenset({"python_function", "user_annotation", "cpu_op"})
COLUMNS = (
    "module",
    "class",
    "instance",
    "parent",
    "depth",
    "stage",
    "recompute",
    "calls",
    "backward_nodes",
    "host_ns",
    "host_self_ns",
    "gpu_ns",
    "op_count",
    "kernel_count",
    "first_ts_ns",
)


def _innermost(parent: np.ndarray, depth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row: the row itself if in ``mask``, else its innermost ancestor in ``mask`` (-1 = none)."""
    found = innermost_ancestor_of_kind(parent, depth, mask)
    return np.where(mask, np.arange(len(mask)), found)


def call_levels(up: np.ndarray) -> np.ndarray:
    """Number of enclosing calls of each call, by pointer jumping: O(n log depth), not O(n * depth)."""
    level = (up >= 0).astype(np.int64)
    ptr = up.copy()
    active = np.flatnonzero(ptr >= 0)
    while active.size:
        a = ptr[active]
        level[active] += level[a]  # both right-hand sides are read before either write: one synchronous step
        ptr[active] = ptr[a]
        active = active[ptr[active] >= 0]
    return level


def roll_up(values: dict[str, np.ndarray], up: np.ndarray, level: np.ndarray) -> dict[str, np.ndarray]:
    """Inclusive sums over a tree of module calls: add each call's total to its parent call, deepest first.

    All measures are summed as the columns of one matrix, and calls are sorted by level once, so each level is a
    slice: the cost is one pass over the calls plus a small constant per level.
    """
    if not values:
        return {}
    keys = list(values)
    out = np.stack([values[k] for k in keys], axis=1).astype(np.int64)
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(int(level.max(initial=0)) + 2))
    for d in range(len(bounds) - 2, 0, -1):
        rows = order[bounds[d] : bounds[d + 1]]
        rows = rows[up[rows] >= 0]
        np.add.at(out, up[rows], out[rows])
    return {k: out[:, i] for i, k in enumerate(keys)}


@dataclass
class CallTree:
    """The ``nn.Module`` calls of a trace as a tree: ``calls`` (their rows), ``inner`` (per row, the innermost
    call around it, itself included; -1 for none), ``call_pos`` (per row, its position in ``calls``), ``up``
    (per call, the position of its enclosing call) and ``level`` (per call, its depth in the tree)."""

    calls: np.ndarray
    inner: np.ndarray
    call_pos: np.ndarray
    up: np.ndarray
    level: np.ndarray

    def per_call(self, rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Exclusive sums per call: each row counts for the innermost call around it."""
        owner = self.call_pos[np.maximum(self.inner[rows], 0)]
        ok = (self.inner[rows] >= 0) & (owner >= 0)
        w = None if weights is None else weights[ok]
        return np.bincount(owner[ok], weights=w, minlength=len(self.calls)).astype(np.int64)


def call_tree(events: pd.DataFrame, links: Links) -> CallTree | None:
    """The module call tree, or None when the trace has no ``nn.Module`` events."""
    n = len(events)
    module = name_mask(events, MODULE_EVENT) & links.host & kind_mask(events, HOST_KINDS)
    calls = np.flatnonzero(module)
    if calls.size == 0:
        return None
    enclosing = innermost_ancestor_of_kind(links.parent, links.depth, module)  # nearest module call above each row
    # row numbers in the links' integer type (int32), as efficiency's module rows keep them: arrays of every event
    inner = np.where(module, np.arange(n, dtype=links.parent.dtype), enclosing)
    call_pos = np.full(n, -1, dtype=links.parent.dtype)
    call_pos[calls] = np.arange(len(calls))
    up = np.where(enclosing[calls] >= 0, call_pos[np.maximum(enclosing[calls], 0)], -1)
    return CallTree(calls, inner, call_pos, up, call_levels(up))


def module_table(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """One row per (module instance, stage, recompute); empty when the trace has no ``nn.Module`` events."""
    tree = call_tree(events, links)
    if tree is None:
        return _empty()
    calls, up, level = tree.calls, tree.up, tree.level
    dur = events["dur_ns"].to_numpy()
    ops = np.flatnonzero(kind_mask(events, {"cpu_op"}) & links.host)
    activity = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS) & (links.launch >= 0))
    kernels = activity[kind_mask(events, {"kernel"})[activity]]

    fwd = {
        "host": dur[calls].astype(np.int64),
        "gpu": tree.per_call(links.launch[activity], dur[activity]),
        "ops": tree.per_call(ops),
        "kernels": tree.per_call(links.launch[kernels]),
    }
    fwd_incl = {"host": fwd["host"], **roll_up({k: v for k, v in fwd.items() if k != "host"}, up, level)}
    child_host = np.zeros(len(calls), dtype=np.int64)
    has_up = up >= 0
    np.add.at(child_host, up[has_up], fwd["host"][has_up])

    # backward nodes -> their forward op (same sequence number) -> the innermost call around that op
    node_rows, node_call, bwd_vals = backward_node_measures(
        events, links, tree.inner, tree.call_pos, activity, kernels, ops
    )
    known = node_call >= 0
    bwd_excl = {
        k: np.bincount(node_call[known], weights=v[known], minlength=len(calls)).astype(np.int64)
        for k, v in bwd_vals.items()
    }
    node_count = np.bincount(node_call[known], minlength=len(calls)).astype(np.int64)
    bwd_incl = roll_up({**bwd_excl, "nodes": node_count}, up, level)
    nodes_incl = bwd_incl.pop("nodes")

    codes = events["name"].cat.codes.to_numpy()[calls]
    names = np.asarray(events["name"].cat.categories[codes].astype(str).str.removeprefix("nn.Module: "))
    call_stage = attribution.stage[calls].astype(np.int64)
    base = pd.DataFrame(
        {
            "module": names.astype(object),
            "parent": np.where(up >= 0, names[np.maximum(up, 0)], "").astype(object),
            "depth": level,
            "ts": events["ts_ns"].to_numpy()[calls],
        }
    )
    forward = base.assign(
        stage=call_stage,
        recompute=call_stage == BACKWARD,
        calls=1,
        backward_nodes=0,
        host_ns=fwd["host"],
        host_self_ns=fwd["host"] - child_host,
        gpu_ns=fwd_incl["gpu"],
        op_count=fwd_incl["ops"],
        kernel_count=fwd_incl["kernels"],
    )
    with_nodes = nodes_incl > 0
    backward = base[with_nodes].assign(
        stage=BACKWARD,
        recompute=False,
        calls=1,
        backward_nodes=nodes_incl[with_nodes],
        host_ns=bwd_incl["host"][with_nodes],
        host_self_ns=bwd_excl["host"][with_nodes],
        gpu_ns=bwd_incl["gpu"][with_nodes],
        op_count=bwd_incl["ops"][with_nodes],
        kernel_count=bwd_incl["kernels"][with_nodes],
    )
    frames = [forward, backward]
    if not known.all():
        orphans = {k: v[~known] for k, v in bwd_vals.items()}
        frames.append(_orphan_row(events["ts_ns"].to_numpy(), node_rows[~known], orphans))
    return _aggregate(pd.concat(frames, ignore_index=True))


def _orphan_row(ts: np.ndarray, rows: np.ndarray, measures: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row for the backward nodes whose forward op lies in no module call."""
    return pd.DataFrame(
        {
            "module": [NO_MODULE],
            "parent": [""],
            "depth": [0],
            "ts": [int(ts[rows].min())],
            "stage": [BACKWARD],
            "recompute": [False],
            "calls": [0],
            "backward_nodes": [len(rows)],
            "host_ns": [int(measures["host"].sum())],
            "gpu_ns": [int(measures["gpu"].sum())],
            "op_count": [int(measures["ops"].sum())],
            "kernel_count": [int(measures["kernels"].sum())],
            "host_self_ns": [int(measures["host"].sum())],
        }
    )


def backward_nodes(events, links, inner, call_pos):
    """Backward nodes (outermost event per node), the call of their forward op, and per event the position of the
    node around it (itself included; -1: none)."""
    n = len(events)
    seq = events["sequence_number"].to_numpy()
    fwd_tid = events["fwd_thread_id"].to_numpy()
    has_seq = (seq != NULL) & links.host
    is_bwd = has_seq & (fwd_tid != NULL) & (fwd_tid > 0)
    parent = links.parent
    # outermost event of each node: its parent is not a backward event of the same sequence number
    p = np.maximum(parent, 0)
    same_as_parent = (parent >= 0) & is_bwd[p] & (seq[p] == seq)
    node = is_bwd & ~same_as_parent
    # a node running inside another node (reentrant checkpointing) is counted in the outer one
    node &= innermost_ancestor_of_kind(parent, links.depth, node) < 0
    node_rows = np.flatnonzero(node)
    # in the links' integer type (int32): an array of every event
    node_of = np.full(n, -1, dtype=parent.dtype)
    if node_rows.size == 0:
        return node_rows, np.zeros(0, np.int64), node_of
    node_of[node_rows] = np.arange(len(node_rows))
    outer_node = innermost_ancestor_of_kind(parent, links.depth, node)
    inside = ~node & (outer_node >= 0)
    node_of[inside] = node_of[outer_node[inside]]

    # forward op of each sequence number: the latest-starting forward op that recorded it
    fwd_rows = np.flatnonzero(has_seq & ~is_bwd)
    ts = events["ts_ns"].to_numpy()
    order = fwd_rows[np.lexsort((ts[fwd_rows], seq[fwd_rows]))]
    last = np.r_[seq[order][1:] != seq[order][:-1], True] if order.size else np.zeros(0, bool)
    creator = order[last]
    creator_seq = seq[creator]
    node_seq = seq[node_rows]
    pos = np.searchsorted(creator_seq, node_seq)
    found = pos < len(creator_seq)  # (none, where no forward op recorded a sequence number: the window began later)
    found[found] = creator_seq[pos[found]] == node_seq[found]
    fwd_op = np.full(len(node_rows), -1, dtype=np.int64)
    fwd_op[found] = creator[pos[found]]
    call = np.where(fwd_op >= 0, inner[np.maximum(fwd_op, 0)], -1)
    node_call = np.where(call >= 0, call_pos[np.maximum(call, 0)], -1)
    return node_rows, node_call, node_of


def backward_node_measures(events, links, inner, call_pos, activity, kernels, ops):
    """Backward nodes (outermost event per node), the call of their forward op, and their host/GPU measures."""
    node_rows, node_call, node_of = backward_nodes(events, links, inner, call_pos)
    if node_rows.size == 0:
        return node_rows, node_call, {k: np.zeros(0, np.int64) for k in ("host", "gpu", "ops", "kernels")}

    # measures per node: host duration; ops, GPU time and kernels inside it
    def per_node(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        owner = node_of[rows]
        ok = owner >= 0
        w = None if weights is None else weights[ok]
        return np.bincount(owner[ok], weights=w, minlength=len(node_rows)).astype(np.int64)

    dur = events["dur_ns"].to_numpy()
    launch = links.launch
    values = {
        "host": dur[node_rows].astype(np.int64),
        "gpu": per_node(launch[activity], dur[activity]),
        "ops": per_node(ops),
        "kernels": per_node(launch[kernels]),
    }
    return node_rows, node_call, values


def _aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """Sum the per-call rows per (module, stage, recompute); keep tree order (first call). The parent is the first
    call's (in time, not in the file's order: a module called from two places has one answer whatever the order)."""
    rows = rows.sort_values(["ts", "depth", "parent", "module"], kind="stable")
    keys = {name: rows[name].to_numpy() for name in ("module", "stage", "recompute")}
    sums = ("calls", "backward_nodes", "host_ns", "host_self_ns", "gpu_ns", "op_count", "kernel_count")
    out = grouped(
        keys,
        {
            "parent": (rows["parent"].to_numpy(), "first"),
            "depth": (rows["depth"].to_numpy(), "min"),
            **{name: (rows[name].to_numpy(), "sum") for name in sums},
            "first_ts_ns": (rows["ts"].to_numpy(), "min"),
        },
        sort=False,
    )
    first = out.groupby("module", sort=False)["first_ts_ns"].transform("min")
    out = out.assign(_first=first).sort_values(["_first", "stage", "recompute"], kind="stable").drop(columns="_first")
    parts = out["module"].str.extract(MODULE_NAME)
    out["class"] = parts[0].where(out["module"] != NO_MODULE, NO_MODULE)
    instance = pd.to_numeric(parts[1], errors="coerce")
    out["instance"] = np.where(instance.isna(), NULL, instance.fillna(0)).astype(np.int64)
    out["stage"] = stage_categorical(out["stage"].to_numpy())
    for column in (
        "depth",
        "calls",
        "backward_nodes",
        "host_ns",
        "host_self_ns",
        "gpu_ns",
        "op_count",
        "kernel_count",
        "first_ts_ns",
    ):
        out[column] = out[column].to_numpy().astype(np.int64)
    out["recompute"] = out["recompute"].astype(bool)
    return out[list(COLUMNS)].reset_index(drop=True)


def _empty() -> pd.DataFrame:
    frame = pd.DataFrame({c: np.array([], np.int64) for c in COLUMNS})
    frame["module"] = frame["module"].astype(object)
    frame["class"] = frame["class"].astype(object)
    frame["parent"] = frame["parent"].astype(object)
    frame["stage"] = stage_categorical(np.array([], np.int8))
    frame["recompute"] = frame["recompute"].astype(bool)
    return frame
