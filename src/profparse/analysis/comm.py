"""Collectives and exposed communication per stage and step.

A *collective* is a GPU kernel of NCCL/RCCL (name containing ``nccl`` or ``rccl``). Its kind, message size, dtype,
group size and process group come from the collective args Kineto records (``Collective name``, ``In/Out msg
nelems``, ``dtype``, ``Group size``, ``Process Group Name/Description/Ranks``): on the kernel itself in newer traces,
else on the CPU op that launched it (``record_param_comms``); without them the kind comes from the kernel name
and the bytes are unknown (null, never zero).

Bandwidths follow nccl-tests (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): ``algbw`` =
S / t with S the larger of the input and output buffers (the whole gathered buffer for all_gather, the whole input
for reduce_scatter), ``busbw`` = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
all_to_all, 1 for broadcast, reduce, send and recv (n = group size).

*Exposed* communication is collective kernel time on a device not overlapped by any other GPU activity (kernels,
memcpy, memset that are not collectives) on the same device: ``exposed + overlapped = collective time``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from profparse.base.intervals import coverage, group_union, merge, on_one_line
from profparse.stages.attribute import Attribution
from profparse.stages.rules import COLLECTIVE_KERNEL
from profparse.tables.rows import row_ref, stage_categorical
from profparse.tables.scopes import by_scope, scope_rank
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask, name_mask

#: (kind, pattern) in order: the first that matches an arg ``Collective name`` or a kernel name decides.
KIND_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("reduce_scatter", re.compile(r"(?i)reduce_?scatter")),
    ("all_gather", re.compile(r"(?i)all_?gather")),
    ("all_reduce", re.compile(r"(?i)all_?reduce")),
    ("all_to_all", re.compile(r"(?i)all_?to_?all")),
    ("broadcast", re.compile(r"(?i)broadcast")),
    ("send_recv", re.compile(r"(?i)send_?recv")),
    ("send", re.compile(r"(?i)send")),
    ("recv", re.compile(r"(?i)recv")),
    ("reduce", re.compile(r"(?i)reduce")),
    ("gather", re.compile(r"(?i)gather")),
    ("scatter", re.compile(r"(?i)scatter")),
    ("barrier", re.compile(r"(?i)barrier")),
)
KINDS = (*(kind for kind, _ in KIND_PATTERNS), "other")
#: n -> busbw / algbw (nccl-tests PERFORMANCE.md); kinds in neither table have no factor (busbw unknown)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
ONE_HOP = frozenset({"broadcast", "reduce", "send", "recv", "send_recv"})  # busbw = algbw, whatever n
#: bytes per element of the ``dtype`` arg (c10 ScalarType names, lower case, without ``c10::``)
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1, "byte": 1,
    "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "complexhalf": 4, "complexfloat": 8,
    "complexdouble": 16, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip
TEXT_ARGS = ("collective", "comm_dtype", "pg_name", "pg_desc", "pg_ranks")
INT_ARGS = ("comm_in_nelems", "comm_out_nelems", "comm_group_size")
EXPOSURE_COLUMNS = (
    "scope", "step", "stage", "device", "comm_count", "comm_kernel_ns", "comm_ns", "overlapped_ns", "exposed_ns",
    "overlap_pct",
)  # fmt: skip


def collective_kind(name: str) -> str:
    """Normalised kind of a collective name or kernel (``allreduce``, ``_allgather_base``,
    ``ncclDevKernel_AllGather_RING_LL`` -> ``all_reduce``, ``all_gather``, ``all_gather``)."""
    for kind, pattern in KIND_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


def bus_factor(kind: str, group_size: int | None) -> float:
    """busbw / algbw for a collective of ``kind`` over ``group_size`` ranks (NaN when unknown)."""
    if kind in ONE_HOP:
        return 1.0
    factor = BUS_FACTOR.get(kind)
    if factor is None or group_size is None or group_size < 1:
        return float("nan")
    return float(factor(group_size))


def dtype_bytes(dtype: Any) -> int | None:
    """Bytes per element of a ``dtype`` arg (``Float`` -> 4, ``c10::BFloat16`` -> 2), None when unknown."""
    if not isinstance(dtype, str):
        return None
    return DTYPE_BYTES.get(dtype.strip().lower().removeprefix("c10::").removeprefix("torch."))


def _text(events: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    """Values of a categorical text column at ``rows`` (``-1`` = none) as objects, None where missing; reads codes
    only, so the full column is never turned into Python strings."""
    out = np.full(len(rows), None, dtype=object)
    if column not in events.columns or not len(rows):
        return out
    series = events[column]
    if not isinstance(series.dtype, pd.CategoricalDtype):
        values = series.to_numpy()[np.maximum(rows, 0)]
        return np.where((rows >= 0) & pd.notna(values), values, None)
    codes = series.cat.codes.to_numpy()[np.maximum(rows, 0)]
    ok = (rows >= 0) & (codes >= 0)
    out[ok] = np.asarray(series.cat.categories, dtype=object)[codes[ok]]
    return out


def _int(events: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    if column not in events.columns or not len(rows):
        return np.full(len(rows), NULL, dtype=np.int64)
    values = events[column].to_numpy()[np.maximum(rows, 0)]
    return np.where(rows >= 0, values, NULL).astype(np.int64)


def collective_rows(events: pd.DataFrame) -> np.ndarray:
    """Positions of the collective kernels (by kernel name, decided once per name category)."""
    return np.flatnonzero(kind_mask(events, {"kernel"}) & name_mask(events, COLLECTIVE_KERNEL))


def device_ids(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The GPU device of each row: the ``device`` arg, else the pid (Kineto's GPU pid is the device)."""
    device = events["device"].to_numpy()[rows]
    return np.where(device == NULL, events["pid"].to_numpy()[rows], device)


def _args(events: pd.DataFrame, rows: np.ndarray, op: np.ndarray) -> dict[str, np.ndarray]:
    """Each collective arg from the kernel where it has it, else from its launching op; and where it came from."""
    own = _text(events, "collective", rows) != None  # noqa: E711 (elementwise)
    source = np.where(own, rows, op)
    out: dict[str, np.ndarray] = {c: _text(events, c, source) for c in TEXT_ARGS}
    out.update({c: _int(events, c, source) for c in INT_ARGS})
    out["from"] = np.where(own, "kernel_args", np.where(out["collective"] != None, "op_args", "unknown"))  # noqa: E711
    return out


def collectives(events: pd.DataFrame, links: Links, attribution: Attribution, header: dict) -> pd.DataFrame:
    """One row per collective kernel: kind, stage, step, bytes, bandwidths, process group, exposed time."""
    rows = collective_rows(events)
    op = links.launch_op[rows]
    args = _args(events, rows, op)
    kernel_names = _text(events, "name", rows)
    names = zip(args["collective"], kernel_names, strict=True)
    kind = [collective_kind(a if a is not None else str(k)) for a, k in names]
    sizes = np.array([dtype_bytes(d) or 0 for d in args["comm_dtype"]], dtype=np.int64)
    nelems = np.maximum(args["comm_in_nelems"], args["comm_out_nelems"])  # NULL is the smallest int64
    known = (nelems >= 0) & (sizes > 0)
    nbytes = np.where(known, nelems * sizes, NULL)
    group = args["comm_group_size"].copy()
    from_ranks = np.array([_rank_count(r) for r in args["pg_ranks"]], dtype=np.int64)
    group = np.where(group > 0, group, from_ranks)
    dur = events["dur_ns"].to_numpy()[rows]
    algbw = np.full(len(rows), np.nan)
    timed = known & (dur > 0)
    algbw[timed] = nbytes[timed] / dur[timed]  # bytes per ns = GB/s
    factor = np.array(
        [bus_factor(k, int(g) if g > 0 else None) for k, g in zip(kind, group, strict=True)], dtype=np.float64
    )
    ts = events["ts_ns"].to_numpy()[rows]
    device = device_ids(events, rows)
    covered = _covered_by_compute(events, rows, device, ts, ts + dur)
    frame = pd.DataFrame(
        {
            "trace_index": events["trace_index"].to_numpy()[rows],
            "name": pd.Categorical.from_codes(events["name"].cat.codes.to_numpy()[rows], dtype=events["name"].dtype),
            "kind": pd.Categorical(kind, categories=list(KINDS)),
            "ts_ns": ts,
            "dur_ns": dur,
            "device": device.astype(np.int64),
            "stream": events["stream"].to_numpy()[rows],
            "stage": stage_categorical(attribution.stage[rows]),
            "step": attribution.step[rows],
            "op_trace_index": row_ref(op, events["trace_index"].to_numpy()),
            "collective_name": pd.Categorical(args["collective"]),
            "dtype": pd.Categorical(args["comm_dtype"]),
            "in_nelems": args["comm_in_nelems"],
            "out_nelems": args["comm_out_nelems"],
            "bytes": nbytes.astype(np.int64),
            "args_from": pd.Categorical(args["from"], categories=["kernel_args", "op_args", "unknown"]),
            "group_size": np.where(group > 0, group, NULL).astype(np.int64),
            "pg_name": pd.Categorical(args["pg_name"]),
            "pg_desc": pd.Categorical(args["pg_desc"]),
            "pg_ranks": pd.Categorical(args["pg_ranks"]),
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "overlapped_ns": covered,
            "exposed_ns": dur - covered,
        }
    )
    return frame.sort_values(["ts_ns", "trace_index"], kind="stable").reset_index(drop=True)


def _rank_count(ranks: Any) -> int:
    """Ranks in a ``Process Group Ranks`` string such as ``[0, 1]`` (NULL when absent or empty)."""
    if not isinstance(ranks, str) or not ranks.strip("[] "):
        return NULL
    return ranks.count(",") + 1


# -- exposure: collectives' time that other GPU activity does not cover ----------------------------------------------


def _covered_by_compute(
    events: pd.DataFrame,
    comm_rows: np.ndarray,
    device: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    kinds: frozenset[str] = GPU_ACTIVITY_KINDS,
) -> np.ndarray:
    """Per interval [start, end) on ``device``: how much of it other (non-collective) GPU activity of ``kinds``
    covers (``{"kernel"}``: compute kernels only, as HTA's ``get_comm_comp_overlap`` counts)."""
    if not len(start):
        return np.zeros(0, dtype=np.int64)
    other = kind_mask(events, kinds)
    other[comm_rows] = False
    rows = np.flatnonzero(other)
    s = events["ts_ns"].to_numpy()[rows]
    e = s + events["dur_ns"].to_numpy()[rows]
    codes, devices = pd.factorize(np.concatenate([device, device_ids(events, rows)]))
    dq, dc = codes[: len(device)].astype(np.int64), codes[len(device) :].astype(np.int64)
    base = int(min(start.min(), s.min() if len(s) else start.min()))
    span = int(max(end.max(), e.max() if len(e) else end.max())) - base + 1
    if len(devices) * span >= 2**62:  # too far apart to share one line (hand-made times): one device at a time
        out = np.zeros(len(device), dtype=np.int64)
        for d in range(len(devices)):
            q, c = dq == d, dc == d
            out[q] = _covered_by_compute_one(s[c] - base, e[c] - base, start[q] - base, end[q] - base)
        return out
    cs, ce = on_one_line(dc, s, e, base=base, span=span)
    order = np.argsort(cs, kind="stable")
    us, ue = merge(cs[order], ce[order])
    qs, qe = on_one_line(dq, start, end, base=base, span=span)
    return (coverage(us, ue, qe) - coverage(us, ue, qs)).astype(np.int64)


def _covered_by_compute_one(s: np.ndarray, e: np.ndarray, qs: np.ndarray, qe: np.ndarray) -> np.ndarray:
    order = np.argsort(s, kind="stable")
    us, ue = merge(s[order], e[order])
    return (coverage(us, ue, qe) - coverage(us, ue, qs)).astype(np.int64)


def comm_exposure(events: pd.DataFrame, collectives: pd.DataFrame, attribution: Attribution) -> pd.DataFrame:
    """Per (scope, step, stage, device) with collectives: their time, the part other GPU activity overlaps, the
    exposed rest and the overlap %; ``table`` is :func:`collectives`' result.

    ``comm_ns`` is the union of the group's collective kernels (``comm_kernel_ns`` their summed durations: larger
    when collectives run on several streams at once); ``overlapped_ns + exposed_ns == comm_ns``. ``total`` rows add
    up the step and ``outside_steps`` rows of each stage and device.
    """
    if collectives.empty:
        return _empty_exposure()
    step = collectives["step"].to_numpy()
    stage = collectives["stage"].cat.codes.to_numpy().astype(np.int64)
    device = collectives["device"].to_numpy()
    keys = pd.DataFrame({"step": step, "stage": stage, "device": device})
    grouped = keys.groupby(["step", "stage", "device"], sort=True)
    group, uniques = grouped.ngroup().to_numpy(), grouped.size().index
    s = collectives["ts_ns"].to_numpy()
    e = s + collectives["dur_ns"].to_numpy()
    pg, ps, pe = group_union(group.astype(np.int64), s, e)
    covered = _covered_by_compute(events, collective_rows(events), uniques.get_level_values("device")[pg].to_numpy(),
                                  ps, pe)  # fmt: skip
    n = len(uniques)
    comm_ns = np.bincount(pg, weights=pe - ps, minlength=n).astype(np.int64)
    overlapped = np.bincount(pg, weights=covered, minlength=n).astype(np.int64)
    rows = pd.DataFrame(
        {
            "scope": "step",
            "step": uniques.get_level_values("step").to_numpy().astype(np.int64),
            "stage": uniques.get_level_values("stage").to_numpy(),
            "device": uniques.get_level_values("device").to_numpy().astype(np.int64),
            "comm_count": np.bincount(group, minlength=n).astype(np.int64),
            "comm_kernel_ns": np.bincount(group, weights=e - s, minlength=n).astype(np.int64),
            "comm_ns": comm_ns,
            "overlapped_ns": overlapped,
            "exposed_ns": comm_ns - overlapped,
        }
    )
    by_scope(rows)
    sums = ["comm_count", "comm_kernel_ns", "comm_ns", "overlapped_ns", "exposed_ns"]
    totals = rows.groupby(["stage", "device"], sort=True)[sums].sum().reset_index().assign(scope="total", step=NULL)
    out = pd.concat([rows, totals[rows.columns]], ignore_index=True)
    scope_order = scope_rank(out["scope"])
    out = out.iloc[np.lexsort((out["device"], out["stage"], out["step"], scope_order))].reset_index(drop=True)
    out["stage"] = stage_categorical(out["stage"].to_numpy())
    comm = out["comm_ns"].to_numpy(dtype=np.float64)
    out["overlap_pct"] = np.divide(100 * out["overlapped_ns"].to_numpy(dtype=np.float64), comm,
                                   out=np.full(len(out), np.nan), where=comm > 0)  # fmt: skip
    for column in ("step", "device", *sums):
        out[column] = out[column].to_numpy().astype(np.int64)
    return out[list(EXPOSURE_COLUMNS)]


def _empty_exposure() -> pd.DataFrame:
    frame = pd.DataFrame({c: np.array([], np.int64) for c in EXPOSURE_COLUMNS})
    frame["scope"] = frame["scope"].astype(object)
    frame["stage"] = stage_categorical(np.array([], np.int8))
    frame["overlap_pct"] = frame["overlap_pct"].astype(np.float64)
    return frame


def by_stage(table: pd.DataFrame) -> pd.DataFrame:
    """Per (stage, kind, process group): count, bytes (of the collectives whose size is known), time, algbw and
    busbw over the whole trace (sum of bytes / sum of time of those with a known size), exposed time."""
    if table.empty:
        return pd.DataFrame(columns=["stage", "kind", "pg", "count", "bytes", "unknown_bytes_count", "time_ns",
                                     "algbw_gbps", "busbw_gbps", "exposed_ns"])  # fmt: skip
    known = table["bytes"].to_numpy() != NULL
    dur = table["dur_ns"].to_numpy()
    frame = pd.DataFrame(
        {
            "stage": table["stage"],
            "kind": table["kind"],
            "pg": table["pg_desc"]
            .astype(object)
            .where(table["pg_desc"].notna(), table["pg_name"].astype(object))
            .fillna("-"),
            "bytes": np.where(known, table["bytes"].to_numpy(), 0),
            "known_ns": np.where(known, dur, 0),
            "bus_ns": np.where(known & np.isfinite(table["busbw_gbps"].to_numpy()), dur, 0),
            "bus_bytes": np.where(
                known & np.isfinite(table["busbw_gbps"].to_numpy()),
                np.nan_to_num(table["busbw_gbps"].to_numpy() * dur),
                0,
            ),  # fmt: skip
            "unknown": ~known,
            "time_ns": dur,
            "exposed_ns": table["exposed_ns"].to_numpy(),
        }
    )
    g = frame.groupby(["stage", "kind", "pg"], observed=True, sort=True).agg(
        count=("time_ns", "size"),
        bytes=("bytes", "sum"),
        unknown_bytes_count=("unknown", "sum"),
        time_ns=("time_ns", "sum"),
        known_ns=("known_ns", "sum"),
        bus_ns=("bus_ns", "sum"),
        bus_bytes=("bus_bytes", "sum"),
        exposed_ns=("exposed_ns", "sum"),
    )
    g = g.reset_index()
    known_ns = g["known_ns"].to_numpy(dtype=np.float64)
    bus_ns = g["bus_ns"].to_numpy(dtype=np.float64)
    g["algbw_gbps"] = np.divide(g["bytes"].to_numpy(dtype=np.float64), known_ns, out=np.full(len(g), np.nan),
                                where=known_ns > 0)  # fmt: skip
    g["busbw_gbps"] = np.divide(g["bus_bytes"].to_numpy(dtype=np.float64), bus_ns, out=np.full(len(g), np.nan),
                                where=bus_ns > 0)  # fmt: skip
    g.loc[g["count"] == g["unknown_bytes_count"], "bytes"] = NULL
    columns = ["stage", "kind", "pg", "count", "bytes", "unknown_bytes_count", "time_ns", "algbw_gbps", "busbw_gbps",
               "exposed_ns"]  # fmt: skip
    return g[columns]
