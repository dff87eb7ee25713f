"""FLOPs per op: which op counts them, and the GPU time of its kernels (the ``flops`` table).

Each CPU op's cost comes from :func:`profparse.analysis.flops.op_cost` on its recorded shapes. Counting once:

- matmul, convolution and attention ops ("tensor" formulas) count at the innermost such op: ``aten::linear`` ->
  ``aten::addmm`` counts at ``addmm``, and any tensor-formula op around it counts nothing;
- norms, softmax, elementwise ops and reductions ("vector" formulas) count at the outermost such op
  (``layer_norm``, not the ``native_layer_norm`` inside; ``mul_``, not the scalar ``to`` inside), unless they run
  inside a counted tensor op (a ``copy_`` inside ``addmm`` is part of the ``addmm``) or around one;
- a backward node (``autograd::engine::evaluate_function: MmBackward0``) with no counted op inside gets its
  forward op's FLOPs (same sequence number) times 2 (2.5 for attention); one with counted ops inside
  (``aten::mm`` under ``MmBackward0``) is counted through them only.

GPU time of an op = the kernels launched by it or by ops inside it (down to the next counted op). Kernels launched
by no counted op are "not counted" time, listed per op with ``status`` saying why. Model FLOPs leave out ops
recomputed in backward (activation checkpointing: ops under an ``nn.Module`` call that runs in backward);
hardware FLOPs include them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.analysis.flops import TENSOR_FAMILIES, OpCost, backward_factor, has_formula, op_cost
from profparse.analysis.math_modes import MATH_MODE_RULES, MODES, RULE_MODES, op_kernel_rules
from profparse.analysis.modules import MODULE_EVENT
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.rows import stage_categorical, take_categorical
from profparse.trace.ancestors import ancestors_of, has_ancestor_in, innermost_ancestor_of_kind
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask, name_mask

SHAPE_COLUMNS = ("input_dims", "input_types", "concrete_inputs")
STATUS = ("counted", "backward via forward op", "no formula", "shapes not recorded or unfit", "around counted ops")
BACKWARD = STAGES.index("backward")
FLOP_COLUMNS = (
    "trace_index", "name", "stage", "step", "status", "family", "dtype", "source", "recompute", "flops", "bytes",
    "gpu_ns", "kernel_count", "host_ns", "achieved_tflops", "intensity", "forward_trace_index", "on_device",
    "math_mode", "math_mode_rule",
)  # fmt: skip


@dataclass
class Counts:
    """Per event row: FLOPs, bytes, status code (-1: covered by a counted op or not a CPU op), owner of kernels."""

    flops: np.ndarray  # float64
    nbytes: np.ndarray  # float64
    status: np.ndarray  # int8 index into STATUS, -1 none
    costs: CostIndex  # each row's formula's cost (where it has one)
    owner: np.ndarray  # counted row whose FLOPs each event's GPU work belongs to (-1 none)
    recompute: np.ndarray  # bool
    forward: np.ndarray  # linked backward node -> its forward op row (-1)
    linked_family: dict[int, str]  # linked node -> family of its forward op's largest FLOPs


@dataclass
class CostIndex:
    """op_cost of each distinct (name, dims, types, concrete) combination, and each row's combination (-1 none)."""

    combo: np.ndarray  # per event row
    flops: np.ndarray  # per combination (and below)
    nbytes: np.ndarray
    tensor: np.ndarray  # bool: a tensor-core formula (matmul, conv, attention)
    factor: np.ndarray  # backward FLOPs per forward FLOP
    family: np.ndarray  # object
    dtype: np.ndarray  # object
    source: np.ndarray  # object


def _costs(events: pd.DataFrame, rows: np.ndarray) -> CostIndex:
    """op_cost per row, computed once per distinct combination (a few thousand even in a large trace)."""
    combo = np.full(len(events), -1, dtype=np.int64)
    found: list[OpCost] = []
    if all(c in events.columns for c in SHAPE_COLUMNS) and rows.size:
        cols = [events["name"], *(events[c] for c in SHAPE_COLUMNS)]
        codes = [c.cat.codes.to_numpy()[rows].astype(np.int64) + 1 for c in cols]  # 0 = missing
        sizes = [len(c.cat.categories) + 1 for c in cols]
        if np.prod(np.array(sizes, dtype=float)) < 2**62:  # one int64 key per row: a 1-D unique, not a row sort
            key = codes[0]
            for code, size in zip(codes[1:], sizes[1:], strict=True):
                key = key * size + code
            distinct, first, inverse = _unique_first_inverse(key)
        else:
            distinct, first, inverse = np.unique(
                np.stack(codes, axis=1), axis=0, return_index=True, return_inverse=True
            )
        cats = [c.cat.categories.tolist() for c in cols]  # (indexing an Arrow-backed index boxes each value)
        for i in first:
            texts = [None if code[i] == 0 else cat[code[i] - 1] for code, cat in zip(codes, cats, strict=True)]
            found.append(op_cost(*texts) if texts[1] is not None else None)
        ok = np.array([f is not None for f in found], dtype=bool)
        inverse = inverse.ravel()
        combo[rows] = np.where(ok[inverse], inverse, -1)
    none = OpCost(0, 0, "", "")
    table = [f or none for f in found]
    return CostIndex(
        combo,
        np.array([f.flops for f in table], dtype=np.float64),
        np.array([f.bytes for f in table], dtype=np.float64),
        np.array([f.family in TENSOR_FAMILIES for f in table], dtype=bool),
        np.array([backward_factor(f.family) for f in table], dtype=np.float64),
        np.array([f.family for f in table], dtype=object),
        np.array([f.dtype for f in table], dtype=object),
        np.array([f.source for f in table], dtype=object),
    )


def _unique_first_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(key, return_index=True, return_inverse=True)`` by a hash factorize and a sort of the few distinct
    values instead of a sort of every key (~3x faster)."""
    codes, uniques = pd.factorize(key)  # codes in order of first appearance
    seen = np.maximum.accumulate(codes)
    first = np.flatnonzero(np.concatenate([[True], seen[1:] > seen[:-1]])) if len(codes) else codes
    by_value = np.argsort(uniques, kind="stable")
    rank = np.empty(len(uniques), dtype=np.int64)
    rank[by_value] = np.arange(len(uniques))
    return np.asarray(uniques)[by_value], first[by_value], rank[codes]


def count_flops(events: pd.DataFrame, links: Links, attribution: Attribution) -> Counts:
    """Decide, for every CPU op, whether and how its FLOPs count (see the module docstring)."""
    n = len(events)
    parent, depth = links.parent, links.depth
    op = kind_mask(events, {"cpu_op"}) & links.host
    costs = _costs(events, np.flatnonzero(op))
    has_cost = costs.combo >= 0
    combo = np.maximum(costs.combo, 0)
    tensor = has_cost & costs.tensor[combo] if len(costs.tensor) else np.zeros(n, bool)
    view = has_cost & (costs.family == "view")[combo] if len(costs.family) else np.zeros(n, bool)  # per combo, not
    # per row: comparing a gathered string per row costs far more than one per combination
    vector = has_cost & ~tensor & ~view
    tensor &= ~ancestors_of(parent, tensor)  # innermost tensor op: linear -> addmm counts at addmm
    vector &= ~ancestors_of(parent, tensor) & ~has_ancestor_in(parent, depth, tensor)
    vector &= ~has_ancestor_in(parent, depth, vector)  # outermost: layer_norm, not its parts
    work = tensor | vector
    # views (no work) count only alone: a reshape that copies is counted at its clone
    view &= ~ancestors_of(parent, work) & ~has_ancestor_in(parent, depth, work | view)
    counted = work | view
    flops, nbytes = np.zeros(n), np.zeros(n)
    counted_rows = np.flatnonzero(counted)
    flops[counted_rows] = costs.flops[combo[counted_rows]]
    nbytes[counted_rows] = costs.nbytes[combo[counted_rows]]

    # backward nodes with nothing counted inside: their forward op's FLOPs times the backward factor
    forward, linked_family = _link_backward_nodes(events, links, op, counted, costs, combo, flops, nbytes)
    linked = forward >= 0
    counted |= linked
    status = np.full(n, -1, dtype=np.int8)
    status[op] = 2  # no formula
    if "input_dims" in events.columns:
        names = events["name"].cat.categories
        known = np.fromiter((has_formula(str(c)) for c in names), bool, len(names))[events["name"].cat.codes.to_numpy()]
        status[op & (known | (events["input_dims"].cat.codes.to_numpy() < 0))] = 3  # shapes absent or unfit
    else:
        status[op] = 3
    counting = innermost_ancestor_of_kind(parent, depth, counted)  # once for covered and owner (one sweep)
    covered = counting >= 0
    status[covered & op] = -1
    status[op & ancestors_of(parent, counted) & (status >= 0)] = 4
    status[counted] = 0
    status[linked] = 1
    # row numbers in int32 where they fit, made in place: held with the counts until the flops table is made
    owner = counting.astype(np.int32 if n < 2**31 else np.int64)
    del counting
    itself = np.flatnonzero(counted | ((owner < 0) & op))  # uncounted ops own their own kernels
    owner[itself] = itself
    del itself
    modules = module_calls(events, links)
    call = innermost_ancestor_of_kind(parent, depth, modules)
    recompute = counted & (call >= 0) & (attribution.stage[np.maximum(call, 0)] == BACKWARD)
    return Counts(flops, nbytes, status, costs, owner, recompute, forward, linked_family)


def _link_backward_nodes(
    events: pd.DataFrame,
    links: Links,
    op: np.ndarray,
    counted: np.ndarray,
    costs: CostIndex,
    combo: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
) -> tuple[np.ndarray, dict[int, str]]:
    """Give each backward node with nothing counted inside the FLOPs of its forward op (same sequence number)
    times the backward factor, in ``flops`` and ``nbytes``; returns each such node's forward op (-1 elsewhere) and
    the family of the forward op's biggest counted part."""
    n = len(events)
    parent, depth = links.parent, links.depth
    counted_rows = np.flatnonzero(counted)
    forward = np.full(n, -1, dtype=np.int32 if n < 2**31 else np.int64)
    linked_family: dict[int, str] = {}
    seq, fwd_tid = events["sequence_number"].to_numpy(), events["fwd_thread_id"].to_numpy()
    has_seq = op & (seq != NULL)
    is_bwd = has_seq & (fwd_tid != NULL) & (fwd_tid > 0)
    node = is_bwd & ~((parent >= 0) & is_bwd[np.maximum(parent, 0)])  # outermost event of each node
    node &= ~ancestors_of(parent, counted) & ~counted
    node_rows = np.flatnonzero(node)
    if node_rows.size and counted_rows.size:
        fwd_op = has_seq & ~is_bwd
        # only the counted rows' creators, and the process ids as they are: arrays of every event were this
        # table's peak on a big trace
        creator = innermost_ancestor_of_kind(parent, depth, fwd_op)[counted_rows]
        creator = np.where(fwd_op[counted_rows], counted_rows, creator)
        ok = creator >= 0
        pid = events["pid"].to_numpy()
        r, c = counted_rows[ok], creator[ok]
        contrib = pd.DataFrame(
            {
                "pid": pid[c],
                "seq": seq[c],
                "creator": c,
                "flops": costs.factor[combo[r]] * flops[r],
                "bytes": 2 * nbytes[r],  # read the forward's inputs and the output gradient, write the gradients
                "own": flops[r],
                "family": costs.family[combo[r]],
            }
        )
        grouped = contrib.groupby(["pid", "seq"], sort=False)
        per_seq = grouped[["flops", "bytes"]].sum()
        biggest = contrib.loc[grouped["own"].idxmax(), ["pid", "seq", "creator", "family"]].set_index(["pid", "seq"])
        per_seq = per_seq.join(biggest)
        keys = pd.MultiIndex.from_arrays([pid[node_rows], seq[node_rows]], names=["pid", "seq"])
        hit = per_seq.reindex(keys)
        good = (hit["flops"] > 0).to_numpy()
        rows_hit = node_rows[good]
        flops[rows_hit] = hit["flops"].to_numpy()[good]
        nbytes[rows_hit] = hit["bytes"].to_numpy()[good]
        forward[rows_hit] = hit["creator"].to_numpy()[good].astype(np.int64)
        linked_family = dict(zip(rows_hit.tolist(), hit["family"].to_numpy()[good].tolist(), strict=True))
    return forward, linked_family


class _KernelTime:
    """Kernel time and count per owner row (the counted op, or the uncounted op, that launched them), for the
    owners that have kernels only (``owners`` ascending): arrays of every event were at the peak of parse."""

    def __init__(self, events: pd.DataFrame, links: Links, owner: np.ndarray) -> None:
        kernels = np.flatnonzero(kind_mask(events, {"kernel"}) & (links.launch_op >= 0))
        who = owner[links.launch_op[kernels]]
        ok = who >= 0
        self.owners, inverse = np.unique(who[ok], return_inverse=True)
        dur = events["dur_ns"].to_numpy()[kernels[ok]]
        # summed per owner in kernel order, as a bincount over every row sums them
        self.ns = np.bincount(inverse.ravel(), weights=dur, minlength=len(self.owners)).astype(np.int64)
        self.count = np.bincount(inverse.ravel(), minlength=len(self.owners)).astype(np.int64)

    def timed(self, n: int) -> np.ndarray:
        """Boolean per row: it owns kernel time."""
        out = np.zeros(n, dtype=bool)
        out[self.owners[self.ns > 0]] = True
        return out

    def at(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` (per owner) of ``rows``, 0 for a row that owns no kernel."""
        position = np.minimum(np.searchsorted(self.owners, rows), max(len(self.owners) - 1, 0))
        found = self.owners[position] == rows if len(self.owners) else np.zeros(len(rows), dtype=bool)
        return np.where(found, values[position] if len(values) else 0, 0).astype(np.int64)


def flop_table(events: pd.DataFrame, links: Links, attribution: Attribution, flop_counts: Counts) -> pd.DataFrame:
    """One row per counted op, and per uncounted op with time of its own ("not counted"), in trace order."""
    kernel_time = _KernelTime(events, links, flop_counts.owner)
    counted = flop_counts.status >= 0
    counted &= flop_counts.status <= 1
    on_gpu = bool(kind_mask(events, GPU_ACTIVITY_KINDS).any())
    if on_gpu:
        timed = kernel_time.timed(len(events))
    else:
        host_time = np.where(counted, events["dur_ns"].to_numpy(), links.self_ns)
        timed = host_time > 0
        del host_time
    worth = (flop_counts.flops > 0) | (flop_counts.nbytes > 0) | timed  # views with no time are no row
    rows = np.flatnonzero((flop_counts.status >= 0) & (counted | timed) & worth)
    del timed, worth
    gpu_ns, kernel_count = kernel_time.at(rows, kernel_time.ns), kernel_time.at(rows, kernel_time.count)
    host_ns = np.where(counted[rows], events["dur_ns"].to_numpy()[rows], links.self_ns[rows])
    fwd = flop_counts.forward[rows]
    combo = flop_counts.costs.combo[rows]
    has = (combo >= 0) & (flop_counts.status[rows] == 0)
    pick = np.maximum(combo, 0)

    def per_row(values: np.ndarray, default: np.ndarray) -> np.ndarray:
        return np.where(has, values[pick] if len(values) else default, default)

    linked_family = np.array([flop_counts.linked_family.get(int(r), "") for r in rows[fwd >= 0]], dtype=object)
    family = np.full(len(rows), "", dtype=object)
    family[fwd >= 0] = linked_family
    source = np.where(fwd >= 0, "forward op", "").astype(object)
    flops, nbytes = flop_counts.flops[rows], flop_counts.nbytes[rows]
    time = (gpu_ns if on_gpu else host_ns).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(time > 0, flops / time / 1e3, np.nan)
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
    trace_index = events["trace_index"].to_numpy()
    forward_ti = np.where(fwd >= 0, trace_index[np.maximum(fwd, 0)], NULL)
    dtype = per_row(flop_counts.costs.dtype, np.full(len(rows), "", dtype=object))
    mode, mode_rule = _math_modes(events, links, flop_counts, rows, dtype, flops)
    return pd.DataFrame(
        {
            "trace_index": trace_index[rows],
            "name": take_categorical(events["name"], rows),
            "stage": stage_categorical(attribution.stage[rows]),
            "step": attribution.step[rows],
            "status": pd.Categorical.from_codes(flop_counts.status[rows], categories=list(STATUS)),
            "family": per_row(flop_counts.costs.family, family),
            "dtype": dtype,
            "source": per_row(flop_counts.costs.source, source),
            "recompute": flop_counts.recompute[rows],
            "flops": flops,
            "bytes": nbytes,
            "gpu_ns": gpu_ns,
            "kernel_count": kernel_count,
            "host_ns": host_ns.astype(np.int64),
            "achieved_tflops": achieved,
            "intensity": intensity,
            "forward_trace_index": forward_ti.astype(np.int64),
            "on_device": gpu_ns > 0 if on_gpu else np.ones(len(rows), bool),
            "math_mode": mode,
            "math_mode_rule": mode_rule,
        }
    )


def _math_modes(
    events: pd.DataFrame, links: Links, counts: Counts, rows: np.ndarray, dtype: np.ndarray, flops: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Math mode and the rule that decided it, per row of the flops table: the kernels' rule (analysis/math_modes)
    with the most time; else the op's input dtype (a linked backward node: its forward op's); else fp32 for an op
    with FLOPs and no floating input (``_foreach_*`` ops record only ``TensorList``; integer step counters);
    else none."""
    rule = op_kernel_rules(events, links, counts.owner)[rows]
    names = np.array([r.name for r in MATH_MODE_RULES] + [""], dtype=object)
    modes = np.array([*MODES, ""], dtype=object)
    mode = modes[np.where(rule >= 0, RULE_MODES[np.maximum(rule, 0)], len(MODES))]
    mode_rule = names[np.where(rule >= 0, rule, len(MATH_MODE_RULES))]
    fwd = counts.forward[rows]
    forward_combo = counts.costs.combo[np.maximum(fwd, 0)]
    forward_dtype = counts.costs.dtype[np.maximum(forward_combo, 0)] if len(counts.costs.dtype) else dtype
    forward_dtype = np.where((fwd >= 0) & (forward_combo >= 0), forward_dtype, "")
    for fallback, why in (
        (dtype, "input dtype"),
        (forward_dtype, "forward op's input dtype"),
        (np.where(flops > 0, "fp32", ""), "no floating input: fp32"),
    ):
        take = (mode == "") & (fallback != "")
        mode = np.where(take, fallback, mode)
        mode_rule = np.where(take, why, mode_rule)
    return mode.astype(object), mode_rule.astype(object)


def module_calls(events: pd.DataFrame, links: Links) -> np.ndarray:
    """Rows that are ``nn.Module: ...`` calls."""
    return name_mask(events, MODULE_EVENT) & links.host
