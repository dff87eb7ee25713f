"""Stages for collective kernels whose launch is not in the trace, from the c10d ops that issued them.

NCCL / RCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``, ``rccl*``, ``msccl*``) sometimes have a correlation id
but no launching runtime call in the trace: some ROCm tracers do not record RCCL's launches, and a launch made
just before the host side of a trace began is lost. They are long and of irregular length, so
``gpu.sequence_match`` cannot place them. The host side still holds the collective ops that issued them, in order;
such a kernel takes its op's stage and step, with the rule ``gpu.collective_match``.

A *c10d op* is the outermost span of a nest of collective host spans (names matching ``rules.COLLECTIVE``:
``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce``). Its process group (``Process Group Name``),
``Seq`` and External ids come from any span of the nest. Ops that launch no kernel are left out (``wait``, gloo's).
An op is *free* when no linked collective kernel was launched inside it. Each unlinked collective kernel takes a free
op, strongest evidence first:

1. ``Seq``: the kernel carries ``Seq`` (newer traces copy the op's args onto the kernel): the free op with the same
   ``Seq`` in the same process group (in any group when the kernel names none and the number is unique).
2. External id: the kernel's ``External id`` (Kineto's correlation with the host) is that of a span of a free op.
3. Order and time, per process group and stream: ops of a group are issued in order and its kernels run in order on
   the group's stream. A stream and a group are paired by the ops of the stream's kernels with a known op (linked,
   or matched above): one group on the stream, on no other stream; else the one stream without such kernels with the
   one group without them. Known pairs split both sequences into segments; within a segment the kernels and the free
   ops pair by rank, from the end when the kernels outnumber the ops (their ops were issued before the trace began),
   from the start otherwise (the last ops' kernels had not run when it ended).

Every pair is causal: an op that starts after its kernel does is no match. Whatever is left stays
``other.gpu_unlinked`` and goes on to :mod:`profparse.stages.gpu_inference`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.base.arrays import as_text
from profparse.stages.rules import COLLECTIVE, COLLECTIVE_KERNEL, COLLECTIVE_MATCH, GPU_UNLINKED, HOST_SPANS
from profparse.trace.ancestors import outermost_flagged
from profparse.trace.kinds import NULL
from profparse.trace.link import Links, first_row_of, kind_mask, name_mask, track_keys

COLLECTIVE_RULE_NAMES = (COLLECTIVE_MATCH,)
#: collective host spans that launch no GPU kernel: waiting on a work object, CPU (gloo) collectives
NO_KERNEL = re.compile(r"(?i)^wait$|^gloo:|[:_]wait_?$")


def match_collectives(
    events: pd.DataFrame,
    links: Links,
    rule_names: list[str],
    rule: np.ndarray,
    stage: np.ndarray,
    step: np.ndarray,
) -> None:
    """Give unlinked collective kernels the stage and step of the c10d op they match (in place)."""
    comm = name_mask(events, COLLECTIVE_KERNEL) & kind_mask(events, {"kernel"})
    wanted = comm & (rule == rule_names.index(GPU_UNLINKED))
    if not wanted.any():
        return
    ops, span_rows, span_op = c10d_ops(events, links)
    if ops.empty:
        return
    kernels = np.flatnonzero(comm)
    op_of = np.full(len(kernels), -1, dtype=np.int64)  # the c10d op (its root row) of each collective kernel
    linked = links.launch[kernels] >= 0
    op_of[linked] = outermost_flagged(links.parent, links.launch[kernels[linked]], _flags(len(links.parent), ops.index))
    query = wanted[kernels]
    free = ops[ops["launches"].to_numpy() & ~ops.index.isin(op_of[linked & (op_of >= 0)])]
    _by_seq(events, kernels, query, op_of, free)
    _by_external_id(events, kernels, query, op_of, free, span_rows, span_op)
    _by_order(events, kernels, query, op_of, ops, free)
    done = query & (op_of >= 0)
    done[done] &= ops["ts_ns"].reindex(op_of[done]).to_numpy() <= events["ts_ns"].to_numpy()[kernels[done]]
    if not done.any():
        return
    target, source = kernels[done], op_of[done]
    rule[target] = rule_names.index(COLLECTIVE_MATCH)
    stage[target] = stage[source]
    step[target] = step[source]


def _flags(n: int, rows: pd.Index | np.ndarray) -> np.ndarray:
    flag = np.zeros(n, dtype=bool)
    flag[np.asarray(rows, dtype=np.int64)] = True
    return flag


def c10d_ops(events: pd.DataFrame, links: Links) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The c10d ops, one row per nest of collective host spans, indexed by its outermost span's row: ``ts_ns``,
    ``pg`` (process group name, "" when none), ``seq`` (NULL when none) and ``launches`` (False for ``wait`` and
    gloo ops); and, per collective span (its row), its op's row."""
    spans = np.flatnonzero(links.host & kind_mask(events, HOST_SPANS) & name_mask(events, COLLECTIVE))
    if not spans.size:
        return pd.DataFrame(columns=["ts_ns", "pg", "seq", "launches"]), spans, spans
    root = outermost_flagged(links.parent, spans, _flags(len(links.parent), spans))
    no_kernel = np.fromiter(
        (isinstance(text, str) and NO_KERNEL.search(text) is not None
         for column in ("name", "collective") for text in _text_at(events, column, spans)),
        dtype=bool, count=2 * len(spans),
    ).reshape(2, -1).any(axis=0)  # fmt: skip
    frame = pd.DataFrame(
        {
            "root": root,
            "pg": _text_at(events, "pg_name", spans),
            "seq": events["comm_seq"].to_numpy()[spans] if "comm_seq" in events else NULL,
            "no_kernel": no_kernel,
        }
    )
    ops = frame.groupby("root", sort=True).agg(pg=("pg", "first"), seq=("seq", "max"), no_kernel=("no_kernel", "any"))
    ops["pg"] = as_text(ops["pg"].fillna(""))
    ops["launches"] = ~ops.pop("no_kernel")
    ops.insert(0, "ts_ns", events["ts_ns"].to_numpy()[ops.index.to_numpy()])
    return ops, spans, root


def _text_at(events: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    """The values of a categorical text column at ``rows`` (None where missing), without converting the column."""
    out = np.full(len(rows), None, dtype=object)
    if column in events and len(rows):
        codes = events[column].cat.codes.to_numpy()[rows]
        out[codes >= 0] = np.asarray(events[column].cat.categories, dtype=object)[codes[codes >= 0]]
    return out


def _kernel_pg(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The process group name each kernel carries ("" when none)."""
    return np.array([str(g) if g is not None else "" for g in _text_at(events, "pg_name", rows)], dtype=object)


def _by_seq(events: pd.DataFrame, kernels: np.ndarray, query: np.ndarray, op_of: np.ndarray, ops: pd.DataFrame) -> None:
    """Step 1: kernels that carry ``Seq`` take the free op with that ``Seq`` in their group (in place)."""
    if "comm_seq" not in events:
        return
    seq = events["comm_seq"].to_numpy()[kernels]
    todo = np.flatnonzero(query & (op_of < 0) & (seq != NULL))
    known = ops[ops["seq"] != NULL]
    if not todo.size or known.empty:
        return
    pg = _kernel_pg(events, kernels[todo])
    keyed = pd.DataFrame({"pg": known["pg"].to_numpy(), "seq": known["seq"].to_numpy(), "op": known.index})
    by_pair = keyed.drop_duplicates(["pg", "seq"], keep=False).set_index(["pg", "seq"])["op"]
    by_seq = keyed.drop_duplicates("seq", keep=False).set_index("seq")["op"]
    pair_hit = by_pair.reindex(pd.MultiIndex.from_arrays([pg, seq[todo]])).to_numpy()
    seq_hit = by_seq.reindex(seq[todo]).to_numpy()
    hit = np.where(pg != "", pair_hit, seq_hit)
    ok = pd.notna(hit)
    op_of[todo[ok]] = hit[ok].astype(np.int64)


def _by_external_id(
    events: pd.DataFrame,
    kernels: np.ndarray,
    query: np.ndarray,
    op_of: np.ndarray,
    ops: pd.DataFrame,
    span_rows: np.ndarray,
    span_op: np.ndarray,
) -> None:
    """Step 2: a kernel whose External id is that of a span of a free op takes that op (in place)."""
    ext = events["external_id"].to_numpy()
    todo = np.flatnonzero(query & (op_of < 0) & (ext[kernels] != NULL))
    keep = np.isin(span_op, ops.index.to_numpy()) & (ext[span_rows] != NULL)
    if not todo.size or not keep.any():
        return
    span = first_row_of(ext[span_rows[keep]], np.flatnonzero(keep), ext[kernels[todo]])
    ok = span >= 0
    op_of[todo[ok]] = span_op[span[ok]]


def _by_order(
    events: pd.DataFrame,
    kernels: np.ndarray,
    query: np.ndarray,
    op_of: np.ndarray,
    ops: pd.DataFrame,
    free: pd.DataFrame,
) -> None:
    """Step 3: the rest pair with free ops by order within (stream, process group) pairs (in place)."""
    todo = query & (op_of < 0)
    free = free[~free.index.isin(op_of[query & (op_of >= 0)])]
    if not todo.any() or free.empty:
        return
    stream = track_keys(events)[0][kernels]
    ts = events["ts_ns"].to_numpy()[kernels]
    known = op_of >= 0
    pairs = _stream_groups(stream, todo, known, op_of, ops, free)
    op_ts = ops["ts_ns"]
    for key, pg in pairs:
        on_stream = np.flatnonzero(stream == key)
        on_stream = on_stream[np.argsort(ts[on_stream], kind="stable")]
        group = free[free["pg"] == pg]
        op_of[on_stream] = _align(op_of[on_stream], todo[on_stream], group, op_ts)


def _stream_groups(
    stream: np.ndarray, todo: np.ndarray, known: np.ndarray, op_of: np.ndarray, ops: pd.DataFrame, free: pd.DataFrame
) -> list[tuple[int, str]]:
    """(stream, process group) pairs to align: paired by the groups of the stream's kernels with a known op."""
    all_pg = ops["pg"]
    anchored = pd.DataFrame({"stream": stream[known], "pg": all_pg.reindex(op_of[known]).to_numpy()}).dropna()
    anchored = anchored.drop_duplicates()
    groups_of_stream = anchored.groupby("stream")["pg"].nunique()
    streams_of_group = anchored.groupby("pg")["stream"].nunique()
    pairs = [
        (int(s), str(g))
        for s, g in anchored.itertuples(index=False)
        if groups_of_stream[s] == 1 and streams_of_group[g] == 1 and todo[stream == s].any()
    ]
    lone_streams = np.setdiff1d(np.unique(stream[todo]), anchored["stream"].to_numpy())
    lone_groups = np.setdiff1d(free["pg"].unique(), anchored["pg"].unique())
    if len(lone_streams) == 1 and len(lone_groups) == 1:
        pairs.append((int(lone_streams[0]), str(lone_groups[0])))
    return pairs


def _align(op_of: np.ndarray, todo: np.ndarray, group: pd.DataFrame, op_ts: pd.Series) -> np.ndarray:
    """One stream's kernels in time order (``op_of``: their known ops, ``todo``: those to match) against the free ops
    of its group: the segments between known ops pair by rank (module docstring). Returns the new ``op_of``."""
    out = op_of.copy()
    anchor = op_of >= 0
    new_op = anchor.copy()
    anchor_rows = np.flatnonzero(anchor)
    new_op[anchor_rows[1:]] = op_of[anchor_rows[1:]] != op_of[anchor_rows[:-1]]
    kernel_segment = np.cumsum(new_op)[todo]
    anchor_ts = np.sort(op_ts.reindex(np.unique(op_of[anchor])).to_numpy())
    group = group.sort_values("ts_ns", kind="stable")
    op_segment = np.searchsorted(anchor_ts, group["ts_ns"].to_numpy(), side="right")
    segments = int(max(kernel_segment.max(initial=0), op_segment.max(initial=0))) + 1
    kernel_rank = _rank_in_segment(kernel_segment)
    op_rank = _rank_in_segment(op_segment)
    surplus = np.bincount(kernel_segment, minlength=segments) - np.bincount(op_segment, minlength=segments)
    kernel_rank -= np.maximum(surplus, 0)[kernel_segment]  # more kernels than ops: aligned at the end
    span = np.int64(len(kernel_segment) + len(op_segment) + 1)
    op_key = op_segment.astype(np.int64) * span + op_rank
    at = np.searchsorted(op_key, kernel_segment.astype(np.int64) * span + kernel_rank)
    hit = (kernel_rank >= 0) & (at < len(op_key))
    hit[hit] &= op_key[at[hit]] == kernel_segment[hit].astype(np.int64) * span + kernel_rank[hit]
    matched = np.full(len(kernel_segment), -1, dtype=np.int64)
    matched[hit] = group.index.to_numpy()[at[hit]]
    out[np.flatnonzero(todo)] = matched
    return out


def _rank_in_segment(segment: np.ndarray) -> np.ndarray:
    """Per item of a non-decreasing segment array: its position within its segment."""
    if not len(segment):
        return np.zeros(0, dtype=np.int64)
    start = np.concatenate([[True], segment[1:] != segment[:-1]])
    first = np.maximum.accumulate(np.where(start, np.arange(len(segment)), 0))
    return np.arange(len(segment), dtype=np.int64) - first
