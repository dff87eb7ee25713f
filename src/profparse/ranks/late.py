"""Why a rank is late: collectives matched across ranks, each rank's collective time split into waiting and transfer.

Per rank (in the rank worker, :func:`collective_rows`): one row per collective, from its NCCL/RCCL kernel(s) or, on
the CPU (gloo), from the ``gloo:<collective>`` range of gloo's worker thread, with the process group, sequence
number, collective name and sizes that Kineto writes on the kernel or on the host op (``record_param_comms``,
``c10d::*``) that launched or queued it. Across ranks (in the parent, on the gathered rows, :func:`match`):
collectives are matched by (process group, sequence number -- or the order within the group when a rank has no
``Seq`` -- , collective name). For each match, the last rank to arrive (latest kernel start) decides when the
transfer can begin:

    waiting_ns  = clip(last arrival - own start, 0, own duration)
    transfer_ns = own duration - waiting_ns
    delay_ns    = last arrival - median start of the other ranks

:func:`late_ranks` names per stage the rank that arrives last most often; :func:`differences` compares that rank's
stage (its kernels and ops) with the median over all ranks, with the ``diff`` machinery. docs/ranks.md has the
formulas and their limits (clock skew between hosts biases every number here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.arrays import as_text
from profparse.base.formats import plain
from profparse.base.marks import STAGES
from profparse.stages.rules import NAMED_COLLECTIVE_KERNEL
from profparse.trace.ancestors import flagged_on_chain, nearest_flagged
from profparse.trace.kinds import NULL
from profparse.trace.link import first_row_of, name_mask

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

TOP_N = 5
COMM_OP = "record_param_comms"
#: host collective ops: the c10d dispatcher ops and ``record_param_comms``; on a CPU (gloo) rank they launch no kernel
HOST_COLLECTIVE = re.compile(r"^(?:c10d::|record_param_comms$)")
#: gloo's own range of a collective, on its worker thread: ``gloo:all_reduce``, ``gloo:broadcast``, ...
GLOO_RANGE = re.compile(r"^gloo:[A-Za-z_]")
HOST_NAME = re.compile(r"^(?:c10d::|gloo:)")  # stripped before a host name becomes a collective name
MAX_OP_HOPS = 4  # kernel launch op -> record_param_comms: found within 1 or 2 parents in every trace seen

#: (column of the per-rank rows, column on ``parsed.raw.events``) for the collective args, when decoded
ARG_COLUMNS = (
    ("collective", "collective"),
    ("pg_name", "pg_name"),
    ("pg_desc", "pg_desc"),
    ("pg_ranks", "pg_ranks"),
    ("comm_dtype", "comm_dtype"),
    ("comm_seq", "comm_seq"),
    ("in_nelems", "comm_in_nelems"),
    ("out_nelems", "comm_out_nelems"),
    ("group_size", "comm_group_size"),
)
TEXT_ARGS = ("collective", "pg_name", "pg_desc", "pg_ranks", "comm_dtype")
ROW_COLUMNS = (
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "collective",
    "comm_seq",
    "order",
    "start_ns",
    "end_ns",
    "dur_ns",
    "kernels",
    "kernel_name",
    "stage",
    "step",
    "in_nelems",
    "out_nelems",
    "comm_dtype",
    "group_size",
)
MATCH_COLUMNS = (
    "match",
    "pg_name",
    "pg_desc",
    "collective",
    "seq",
    "seq_source",
    "rank",
    "stage",
    "step",
    "match_stage",
    "start_ns",
    "end_ns",
    "dur_ns",
    "waiting_ns",
    "transfer_ns",
    "last_rank",
    "delay_ns",
    "is_last",
    "in_nelems",
    "out_nelems",
    "comm_dtype",
    "group_size",
    "kernel_name",
)

TEXT_MATCH = ("pg_name", "pg_desc", "collective", "seq_source", "stage", "match_stage", "comm_dtype", "kernel_name")


def match_schema() -> dict[str, Any]:
    """The Arrow type of each ``collective_matches`` column (pyarrow imported only here, by the writer)."""
    import pyarrow as pa

    kinds = {c: pa.string() for c in TEXT_MATCH} | {"is_last": pa.bool_()}
    return {c: kinds.get(c, pa.int64()) for c in MATCH_COLUMNS}


def _normal_name(name: str) -> str:
    """``AllReduce`` / ``all_reduce`` / ``allreduce`` -> ``allreduce``: one spelling for kernels and args."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


# -- per rank: the collective rows (runs in the rank worker) -------------------------------------------------------


def _comm_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    return kernels[name_mask(kernels, NAMED_COLLECTIVE_KERNEL)]


def _op_rows(ops: pd.DataFrame, trace_index: np.ndarray) -> np.ndarray:
    """Per trace index: the row of ``ops`` with it (-1: not an op of this trace)."""
    return first_row_of(ops["trace_index"].to_numpy(dtype=np.int64), np.arange(len(ops)), trace_index)


def _op_parents(ops: pd.DataFrame) -> np.ndarray:
    """Per op: the row of its parent op (-1: none), the tree that :mod:`profparse.trace.ancestors` walks."""
    return _op_rows(ops, _ints(ops["parent_trace_index"]))


def _comm_op_of(ops: pd.DataFrame, launch_ops: np.ndarray) -> np.ndarray:
    """The ``record_param_comms`` op around each launch op (its trace index), else NULL."""
    if not len(ops):
        return np.full(len(launch_ops), NULL, dtype=np.int64)
    is_comm = (ops["name"] == COMM_OP).to_numpy(dtype=bool)
    found = nearest_flagged(_op_parents(ops), _op_rows(ops, launch_ops), is_comm, hops=MAX_OP_HOPS)
    return np.where(found >= 0, ops["trace_index"].to_numpy(dtype=np.int64)[np.maximum(found, 0)], NULL)


def _event_args(events: pd.DataFrame, trace_index: np.ndarray) -> dict[str, np.ndarray]:
    """The decoded collective args of the events at ``trace_index`` (None/NULL where absent or not decoded)."""
    n = len(trace_index)
    out: dict[str, np.ndarray] = {}
    index = events["trace_index"].to_numpy()
    pos = np.minimum(np.searchsorted(index, trace_index), max(len(index) - 1, 0))
    valid = (trace_index != NULL) & (len(index) > 0)
    if len(index):
        valid &= index[pos] == trace_index
    for column, source in ARG_COLUMNS:
        text = column in TEXT_ARGS
        values = np.full(n, None if text else NULL, dtype=object if text else np.int64)
        if source in events.columns and valid.any():
            got = events[source].iloc[pos[valid]].to_numpy()  # only these rows: the columns are long
            if text:
                values[valid] = [None if (v is None or (isinstance(v, float) and np.isnan(v))) else str(v) for v in got]
            else:
                values[valid] = np.asarray(got, dtype=np.int64)
        out[column] = values
    return out


def collective_rows(parsed: ParsedTrace) -> pd.DataFrame:
    """One row per collective of this rank, in start order: its group, ``Seq``, name, sizes, span, stage.

    GPU collectives are NCCL/RCCL kernels (:func:`_kernel_rows`); CPU collectives (gloo) are the host collective ops
    that launched no such kernel (:func:`_host_rows`). Both kinds are matched across ranks alike.
    """
    kernels = _comm_kernels(parsed.kernels)
    launch_ops = _ints(kernels["launch_op_trace_index"])
    parts = [f for f in (_kernel_rows(parsed, kernels), _host_rows(parsed, launch_ops)) if len(f)]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=_row_dtype(c)) for c in ROW_COLUMNS})
    rows = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    rows = rows.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    rows["dur_ns"] = rows["end_ns"] - rows["start_ns"]
    rows["order"] = rows.groupby("pg_name", sort=False).cumcount().astype(np.int64)
    return rows[list(ROW_COLUMNS)]


def _with_args(frame: pd.DataFrame, own: dict[str, np.ndarray], fallback: dict[str, np.ndarray]) -> pd.DataFrame:
    """The collective args columns: ``own`` where present, else ``fallback``; text args "" where neither has one."""
    for column, _ in ARG_COLUMNS:
        a, b = own[column], fallback[column]
        frame[column] = np.where(pd.isna(a), b, a) if column in TEXT_ARGS else np.where(a != NULL, a, b)
    for column in ("pg_name", "pg_desc", "pg_ranks", "comm_dtype"):
        frame[column] = frame[column].fillna("")
    return frame


def _kernel_rows(parsed: ParsedTrace, kernels: pd.DataFrame) -> pd.DataFrame:
    """GPU collectives: one row per NCCL/RCCL kernel, or per ``record_param_comms`` op for the kernels it launched.

    The args come from the kernel's own event when Kineto wrote them there, else from the ``record_param_comms``
    op that launched it; without any (older traces, or args not decoded) the name comes from the kernel name
    (``ncclKernel_AllReduce_...`` -> ``allreduce``) and the group is ``""``. Kernels launched by one
    ``record_param_comms`` op (a coalesced collective) are one row spanning them.
    """
    if not len(kernels):
        return pd.DataFrame()
    events = parsed.raw.events
    k_index = _ints(kernels["trace_index"])
    comm_ops = _comm_op_of(parsed.ops, _ints(kernels["launch_op_trace_index"]))
    frame = pd.DataFrame(
        {
            "instance": np.where(comm_ops != NULL, comm_ops, -k_index - 1),  # one op: one collective
            "start_ns": _ints(kernels["ts_ns"]),
            "end_ns": _ints(kernels["ts_ns"]) + _ints(kernels["dur_ns"]),
            "kernel_name": as_text(kernels["name"]).to_numpy(),
            "stage": kernels["stage"].astype(str).to_numpy(),
            "step": _ints(kernels["step"]),  # NULL outside a step
        }
    )
    frame = _with_args(frame, _event_args(events, k_index), _event_args(events, comm_ops))
    named = (NAMED_COLLECTIVE_KERNEL.match(n) for n in frame["kernel_name"])
    from_kernel = [_normal_name(m.group(1)) if m else "" for m in named]
    frame["collective"] = _collective_names(frame["collective"], from_kernel)
    frame = frame.sort_values(["start_ns", "end_ns"], kind="stable")
    first = {c: "first" for c in frame.columns if c not in ("instance", "start_ns", "end_ns")}
    rows = frame.groupby("instance", sort=False).agg({**first, "start_ns": "min", "end_ns": "max"})
    rows["kernels"] = frame.groupby("instance", sort=False).size()
    return rows.reset_index(drop=True)


def _host_collective_ops(ops: pd.DataFrame, launch_ops: np.ndarray) -> pd.DataFrame:
    """The outermost host collective ops (``c10d::*``, ``record_param_comms``) that launched no collective kernel,
    in start order, each with ``args_index``: the ``record_param_comms`` op (itself or one inside it) whose args
    describe it, else itself."""
    is_host = name_mask(ops, HOST_COLLECTIVE)
    if not is_host.any():
        return ops.iloc[:0].assign(args_index=np.zeros(0, dtype=np.int64))
    parent = _op_parents(ops)
    candidates = ops[is_host]
    index = candidates["trace_index"].to_numpy(dtype=np.int64)
    above = nearest_flagged(parent, parent[is_host], is_host, hops=MAX_OP_HOPS)  # the host collective op around it
    outermost = above < 0
    above = ops["trace_index"].to_numpy(dtype=np.int64)[np.maximum(above, 0)]
    launched = flagged_on_chain(parent, _op_rows(ops, launch_ops), is_host, hops=MAX_OP_HOPS)
    keep = outermost & ~launched[is_host]
    inner = ~outermost & (candidates["name"] == COMM_OP).to_numpy(dtype=bool)
    args_of = pd.Series(index[inner], index=above[inner])
    args_of = args_of[~args_of.index.duplicated()]
    host = candidates[keep].sort_values(["ts_ns", "trace_index"], kind="stable")
    nested = args_of.reindex(host["trace_index"].to_numpy()).to_numpy()
    own = host["trace_index"].to_numpy(dtype=np.int64)
    return host.assign(args_index=np.where(pd.isna(nested), own, np.nan_to_num(nested, nan=0)).astype(np.int64))


def _host_rows(parsed: ParsedTrace, launch_ops: np.ndarray) -> pd.DataFrame:
    """CPU collectives: the host collective ops that launched no NCCL/RCCL kernel (gloo, or any CPU backend).

    The span is the gloo worker thread's ``gloo:<collective>`` range (when this rank started the collective and
    when it ended: the wait for the other ranks is in it), paired in order with the host ops that queued them; the
    stage, step and args are the host op's. A ``gloo:`` range that started before the first host op was queued
    before the profiler window and is dropped; a host op whose range is not in the trace (it ran past the window's
    end) too. Without ``gloo:`` ranges the host op's own span is used, but only on a rank with no collective kernel:
    on a GPU rank a host op without kernel is a launch the trace lost, not a CPU collective.
    """
    host = _host_collective_ops(parsed.ops, launch_ops)
    if not len(host):
        return pd.DataFrame()
    events = parsed.raw.events
    gloo = events[name_mask(events, GLOO_RANGE)].sort_values(["ts_ns", "trace_index"], kind="stable")
    gloo = gloo[gloo["ts_ns"].to_numpy(dtype=np.int64) >= int(host["ts_ns"].min())]
    if len(gloo):
        n = min(len(gloo), len(host))
        host, span = host.iloc[:n], gloo.iloc[:n]
    elif len(launch_ops):
        return pd.DataFrame()
    else:
        span = host
    names = as_text(span["name"]).to_numpy()
    frame = pd.DataFrame(
        {
            "start_ns": _ints(span["ts_ns"]),
            "end_ns": _ints(span["ts_ns"]) + _ints(span["dur_ns"]),
            "kernel_name": names,  # the gloo range (or the host op) stands where a GPU collective has its kernel
            "stage": host["stage"].astype(str).to_numpy(),
            "step": _ints(host["step"]),
            "kernels": np.zeros(len(host), dtype=np.int64),  # 0: a CPU collective
        }
    )
    none = {c: np.full(len(host), None if c in TEXT_ARGS else NULL, dtype=object if c in TEXT_ARGS else np.int64)
            for c, _ in ARG_COLUMNS}  # fmt: skip
    frame = _with_args(frame, _event_args(events, host["args_index"].to_numpy(dtype=np.int64)), none)
    frame["collective"] = _collective_names(frame["collective"], [_normal_name(HOST_NAME.sub("", n)) for n in names])
    return frame


def _collective_names(from_args: pd.Series, fallback: list[str]) -> list[str]:
    """The args' ``Collective name`` (normalised) where recorded, else ``fallback`` (from the kernel or op name)."""
    return [fallback[i] if v is None or v == "" else _normal_name(v) for i, v in enumerate(from_args)]


def _ints(series: pd.Series) -> np.ndarray:
    """int64 values, NULL where missing (the tables use both NULL sentinels and pandas' nullable Int64)."""
    if isinstance(series.dtype, pd.api.extensions.ExtensionDtype):
        return series.astype("Int64").fillna(NULL).to_numpy(dtype=np.int64)
    return series.to_numpy(dtype=np.int64)


def _row_dtype(column: str) -> Any:
    return object if column in (*TEXT_ARGS, "kernel_name", "stage") else np.int64


def stage_name_totals(kernels: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Per (kind, stage, name): total time and count on this rank; kernels by duration, ops by self time."""
    frames = []
    for kind, frame, value in (("kernel", kernels, "dur_ns"), ("op", ops, "self_ns")):
        if not len(frame):
            continue
        # grouped by the columns themselves (categoricals: by their codes), the few groups' keys made text after:
        # ~5-10x faster than by their text, which was most of what a warm ``summarize DIR`` spent its time on
        g = frame.groupby(["stage", "name"], observed=True, sort=False)[value]
        out = g.agg(total_ns="sum", count="count").reset_index()
        out.columns = ["stage", "name", "total_ns", "count"]
        out["stage"], out["name"] = out["stage"].astype(str), as_text(out["name"])
        frames.append(out.assign(kind=kind))
    if not frames:
        return pd.DataFrame(columns=["kind", "stage", "name", "total_ns", "count"])
    return pd.concat(frames, ignore_index=True)[["kind", "stage", "name", "total_ns", "count"]]


# -- across ranks: matching (runs in the parent, on the gathered rows) ---------------------------------------------


def _gather(per_rank: Iterable[tuple[int, pd.DataFrame]]) -> pd.DataFrame:
    frames = [rows.assign(rank=int(rank)) for rank, rows in per_rank if rows is not None and len(rows)]
    if not frames:
        return pd.DataFrame(columns=["rank", *ROW_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def _empty_matches() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=object) for c in MATCH_COLUMNS})
    for c in ("match", "seq", "rank", "start_ns", "end_ns", "dur_ns", "waiting_ns", "transfer_ns", "delay_ns"):
        frame[c] = frame[c].astype(np.int64)
    for c in ("in_nelems", "out_nelems", "group_size", "last_rank", "step"):
        frame[c] = frame[c].astype("Int64")
    frame["is_last"] = frame["is_last"].astype(bool)
    return frame


def match(per_rank: Iterable[tuple[int, pd.DataFrame]]) -> tuple[pd.DataFrame, list[str]]:
    """Match the collectives of every rank; returns the ``collective_matches`` rows and warnings (one line each).

    A process group's members are the ranks that have collectives in it. Within a group the key is ``Seq`` when
    every row of the group has one, else the order within the group. A key that not every member has, or where
    the members disagree on the collective name, is left unmatched and counted in a warning; nothing raises.
    """
    rows = _gather(per_rank)
    warnings: list[str] = []
    if rows.empty:
        return _empty_matches(), warnings
    out = []
    next_match = 0
    for pg, part in rows.groupby("pg_name", sort=True):
        members = np.sort(part["rank"].unique())
        label = f"process group {pg!r}" if pg else "collectives without a process group"
        if len(members) < 2:
            continue
        use_seq = bool((part["comm_seq"].to_numpy(dtype=np.int64) != NULL).all())
        part = part.assign(seq=part["comm_seq"] if use_seq else part["order"])
        counts = part.groupby("rank").size()
        if counts.nunique() > 1:
            shown = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
            warnings.append(f"{label}: ranks recorded different numbers of collectives ({shown}); matched by "
                            f"{'Seq' if use_seq else 'order'}, the rest left unmatched")  # fmt: skip
        g = part.groupby("seq")
        complete = (g["rank"].transform("nunique") == len(members)) & (g["rank"].transform("size") == len(members))
        same_name = g["collective"].transform("nunique") == 1
        if counts.nunique() == 1 and not complete.all():  # same counts, yet keys missing or twice on a rank
            seqs = part.loc[~complete, "seq"]
            warnings.append(f"{label}: {seqs.nunique()} sequence numbers are not recorded exactly once on every rank "
                            f"(first: #{seqs.min()}); left unmatched")  # fmt: skip
        bad_names = part[complete & ~same_name]
        if len(bad_names):
            first = bad_names.sort_values(["seq", "rank"]).iloc[0]
            names = sorted(set(bad_names[bad_names["seq"] == first["seq"]]["collective"]))
            warnings.append(f"{label}: {bad_names['seq'].nunique()} collectives differ in name across ranks (first: "
                            f"#{first['seq']} is {' / '.join(names)}); left unmatched")  # fmt: skip
        ok = part[complete & same_name].sort_values(["seq", "rank"], kind="stable")
        if not len(ok):
            continue
        out.append(_split(ok, len(members), next_match, "Seq" if use_seq else "order"))
        next_match += len(ok) // len(members)
    if not out:
        return _empty_matches(), warnings
    return pd.concat(out, ignore_index=True)[list(MATCH_COLUMNS)], warnings


def _split(ok: pd.DataFrame, n: int, first_match: int, seq_source: str) -> pd.DataFrame:
    """Waiting and transfer of each rank in each match (rows sorted by seq then rank, ``n`` rows per match)."""
    starts = ok["start_ns"].to_numpy(dtype=np.int64).reshape(-1, n)
    durs = ok["dur_ns"].to_numpy(dtype=np.int64).reshape(-1, n)
    ranks = ok["rank"].to_numpy(dtype=np.int64).reshape(-1, n)
    stages = ok["stage"].to_numpy().reshape(-1, n)
    last_col = np.argmax(starts, axis=1)  # the first maximum: ties go to the lowest rank
    rows = np.arange(len(starts))
    last_arrival = starts[rows, last_col]
    others = np.sort(starts, axis=1)[:, :-1]  # drop one maximum: the last rank's own start
    delay = np.rint(last_arrival - np.median(others, axis=1)).astype(np.int64)
    waiting = np.clip(last_arrival[:, None] - starts, 0, durs)
    late = delay > 0
    frame = ok.copy()
    frame["match"] = np.repeat(first_match + rows, n)
    frame["seq_source"] = seq_source
    frame["waiting_ns"] = waiting.ravel()
    frame["transfer_ns"] = (durs - waiting).ravel()
    frame["last_rank"] = _nullable(np.repeat(np.where(late, ranks[rows, last_col], NULL), n))
    frame["delay_ns"] = np.repeat(delay, n)
    frame["is_last"] = (np.arange(n)[None, :] == last_col[:, None]).ravel() & np.repeat(late, n)
    frame["match_stage"] = np.repeat(stages[rows, last_col], n)  # the stage the late rank was in
    for column in ("in_nelems", "out_nelems", "group_size", "step"):
        frame[column] = _nullable(frame[column].to_numpy(dtype=np.int64))
    frame["seq"] = frame["seq"].astype(np.int64)
    return frame


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 with the NULL sentinel -> pandas Int64 with real missing values (Parquet nulls)."""
    missing = values == NULL
    return pd.arrays.IntegerArray(np.where(missing, 0, values).astype(np.int64), missing)


# -- per stage: who is late, by how much, and what it did differently ----------------------------------------------


def late_ranks(matches: pd.DataFrame) -> pd.DataFrame:
    """Per stage (the late rank's stage): matched collectives, the rank last most often and its delays, and the
    waiting and transfer time of all ranks in that stage's collectives."""
    columns = ["stage", "collectives", "late", "late_rank", "times_last", "mean_delay_ns", "max_delay_ns",
               "waiting_ns", "transfer_ns", "waiting_share"]  # fmt: skip
    rows = []
    for stage in STAGES:
        part = matches[matches["match_stage"] == stage]
        if not len(part):
            continue
        per_match = part.drop_duplicates("match")
        lasts = part[part["is_last"]]
        row: dict[str, Any] = {"stage": stage, "collectives": int(len(per_match)), "late": int(len(lasts))}
        if len(lasts):
            counts = lasts.groupby("rank").size()
            rank = int(counts[counts == counts.max()].index.min())  # most often last; ties: lowest rank
            delays = lasts[lasts["rank"] == rank]["delay_ns"]
            row |= {"late_rank": rank, "times_last": int(counts[rank]), "mean_delay_ns": int(round(delays.mean())),
                    "max_delay_ns": int(delays.max())}  # fmt: skip
        waiting, transfer = int(part["waiting_ns"].sum()), int(part["transfer_ns"].sum())
        row |= {"waiting_ns": waiting, "transfer_ns": transfer}
        row["waiting_share"] = waiting / (waiting + transfer) if waiting + transfer else None
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    for column in ("late_rank", "times_last", "mean_delay_ns", "max_delay_ns"):
        frame[column] = frame[column].astype("Int64")
    return frame


def per_rank_stage(matches: pd.DataFrame) -> pd.DataFrame:
    """Per (stage, rank): times this rank arrived last, and its waiting and transfer time in that stage."""
    if matches.empty:
        return pd.DataFrame(columns=["stage", "rank", "times_last", "waiting_ns", "transfer_ns"])
    g = matches.groupby([matches["match_stage"].astype(str), "rank"], sort=True)
    out = g.agg(times_last=("is_last", "sum"), waiting_ns=("waiting_ns", "sum"), transfer_ns=("transfer_ns", "sum"))
    out = out.reset_index().rename(columns={"match_stage": "stage"})
    return out.astype({"times_last": "int64", "waiting_ns": "int64", "transfer_ns": "int64"})


def differences(
    totals: Sequence[tuple[int, pd.DataFrame]], stage: str, rank: int, top: int = TOP_N
) -> dict[str, list[dict]]:
    """What ``rank`` did differently in ``stage``: its kernels and ops against the median rank (the per-name median
    over all ranks, 0 where a rank lacks the name), the names that moved most first (``profparse.diff``).

    The collectives themselves are left out (NCCL/RCCL kernels, host collective ops: a CPU collective's op can hold
    its wait): their extra time on the other ranks is the waiting (the effect of the late arrival, not its cause)."""
    from profparse.diff import moved_pairs

    out: dict[str, list[dict]] = {}
    for kind in ("kernel", "op"):
        parts = []
        for r, frame in totals:
            if frame is None or not len(frame):
                continue
            sel = frame[(frame["kind"] == kind) & (frame["stage"] == stage)]
            own = NAMED_COLLECTIVE_KERNEL if kind == "kernel" else HOST_COLLECTIVE
            sel = sel[~sel["name"].str.match(own.pattern)]
            parts.append(sel[["name", "total_ns"]].assign(rank=r))
        if not parts:
            out[kind + "s"] = []
            continue
        wide = pd.concat(parts).pivot_table(index="name", columns="rank", values="total_ns", aggfunc="sum")
        wide = wide.reindex(columns=sorted({r for r, f in totals if f is not None and len(f)})).fillna(0.0)
        if rank not in wide.columns:
            out[kind + "s"] = []
            continue
        median = pd.DataFrame({"stage": stage, "name": wide.index, "total": wide.median(axis=1).to_numpy()})
        mine = pd.DataFrame({"stage": stage, "name": wide.index, "total": wide[rank].to_numpy()})
        moved = moved_pairs(median, mine, "total", top, None)
        out[kind + "s"] = [
            {"name": m["name"], "median_ns": m["a_ns"], "rank_ns": m["b_ns"], "delta_ns": m["delta_ns"],
             "pct": m["pct"]}
            for m in moved
        ]  # fmt: skip
    return out


def late_data(
    matches: pd.DataFrame | None,
    warnings: Sequence[str],
    totals: Sequence[tuple[int, pd.DataFrame | None]],
    top: int = TOP_N,
) -> dict[str, Any]:
    """The "late ranks" part of the multi-rank summary, plain JSON-ready data (``available`` False without a
    ``collective_matches`` table: a dataset written by an older profparse)."""
    if matches is None:
        return {"available": False, "collectives": 0, "ranks": 0, "warnings": [], "stages": [], "per_rank": []}
    stages = []
    for row in late_ranks(matches).to_dict("records"):
        item = {k: plain(v) for k, v in row.items()}
        if item["late_rank"] is not None:
            item["differences"] = differences(totals, item["stage"], item["late_rank"], top)
        stages.append(item)
    per_rank = [{k: plain(v) for k, v in r.items()} for r in per_rank_stage(matches).to_dict("records")]
    return {
        "available": True,
        "collectives": int(matches["match"].nunique()),
        "ranks": int(matches["rank"].nunique()),
        "warnings": list(warnings),
        "stages": stages,
        "per_rank": per_rank,
    }
