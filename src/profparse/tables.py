"""Derived tables: events (with links and stages), kernels, ops and the per step x stage summary.

All times are int64 nanoseconds (``_ns``), sizes bytes (``_bytes``). Internally missing integers are the ``NULL``
sentinel; :func:`nullable` turns them into pandas' nullable ``Int64`` for users.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.trace.events import GPU_ACTIVITY_KINDS, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, depth_order, kind_mask

HOST_SPAN_KINDS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"})
SUMMARY_COLUMNS = (
    "step",
    "stage",
    "host_wall_ns",
    "host_op_ns",
    "gpu_time_ns",
    "gpu_busy_ns",
    "gpu_idle_ns",
    "kernel_count",
    "gpu_activity_count",
    "launch_count",
    "memcpy_bytes",
)


def nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 array with ``NULL`` sentinels -> pandas nullable Int64 (no copy of the values)."""
    values = np.asarray(values, dtype=np.int64)
    return pd.arrays.IntegerArray(values, values == NULL)


def _row_ref(rows: np.ndarray, trace_index: np.ndarray) -> np.ndarray:
    """Row numbers (``-1`` = none) -> trace_index values (``NULL`` = none)."""
    out = np.full(len(rows), NULL, dtype=np.int64)
    ok = rows >= 0
    out[ok] = trace_index[rows[ok]]
    return out


def _take_categorical(column: pd.Series, rows: np.ndarray) -> pd.Categorical:
    """Rows of a categorical column (``-1`` rows become missing), sharing its categories."""
    codes = column.cat.codes.to_numpy()
    taken = np.where(rows >= 0, codes[np.maximum(rows, 0)], -1)
    return pd.Categorical.from_codes(taken, dtype=column.dtype)


def stage_categorical(codes: np.ndarray) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int8), categories=list(STAGES))


def event_table(
    events: pd.DataFrame, links: Links, attribution: Attribution, start: int = 0, stop: int | None = None
) -> pd.DataFrame:
    """The raw event table plus nesting, launch links, stage, rule and step (internal NULL sentinels).

    ``start``/``stop``: only those rows (a writer can then hold one slice at a time); the default is all rows.
    """
    rows = slice(start, stop)
    out = events.iloc[rows].copy(deep=False) if start or stop is not None else events.copy(deep=False)
    trace_index = events["trace_index"].to_numpy()
    out["parent_trace_index"] = _row_ref(links.parent[rows], trace_index)
    out["depth"] = links.depth[rows]
    out["self_ns"] = links.self_ns[rows]
    out["launch_trace_index"] = _row_ref(links.launch[rows], trace_index)
    out["launch_op_trace_index"] = _row_ref(links.launch_op[rows], trace_index)
    out["stage"] = stage_categorical(attribution.stage[rows])
    out["stage_rule"] = pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names)
    out["step"] = attribution.step[rows]
    return out


def kernel_table(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """GPU activity (kernels, memcpy, memset) with stage, step and the runtime call and CPU op that launched it."""
    rows = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    ts = events["ts_ns"].to_numpy()
    launch = links.launch[rows]
    launch_op = links.launch_op[rows]
    trace_index = events["trace_index"].to_numpy()
    has_launch = launch >= 0
    latency = np.full(len(rows), NULL, dtype=np.int64)
    latency[has_launch] = ts[rows][has_launch] - ts[launch[has_launch]]
    return pd.DataFrame(
        {
            "trace_index": trace_index[rows],
            "kind": _take_categorical(events["kind"], rows),
            "name": _take_categorical(events["name"], rows),
            "ts_ns": ts[rows],
            "dur_ns": events["dur_ns"].to_numpy()[rows],
            "device": events["device"].to_numpy()[rows],
            "stream": events["stream"].to_numpy()[rows],
            "correlation": events["correlation"].to_numpy()[rows],
            "bytes": events["bytes"].to_numpy()[rows],
            "stage": stage_categorical(attribution.stage[rows]),
            "stage_rule": pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names),
            "step": attribution.step[rows],
            "launch_trace_index": _row_ref(launch, trace_index),
            "launch_name": _take_categorical(events["name"], launch),
            "launch_op_trace_index": _row_ref(launch_op, trace_index),
            "launch_op_name": _take_categorical(events["name"], launch_op),
            "launch_latency_ns": latency,
        },
        copy=False,  # every column is a fresh array: no need to copy it again
    )


def op_table(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """CPU ops with self time, stage, step and the GPU time they launched directly."""
    n = len(events)
    rows = np.flatnonzero(kind_mask(events, {"cpu_op"}) & links.host)
    activity = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS) & (links.launch_op >= 0))
    dur = events["dur_ns"].to_numpy()
    launcher = links.launch_op[activity]
    at = np.searchsorted(rows, launcher)  # a launching op is a host cpu_op: count per op row, not per event row
    if len(rows) and (at < len(rows)).all() and (rows[np.minimum(at, len(rows) - 1)] == launcher).all():
        gpu_ns = np.bincount(at, weights=dur[activity], minlength=len(rows)).astype(np.int64)
        gpu_count = np.bincount(at, minlength=len(rows)).astype(np.int64)
    else:
        gpu_ns = np.bincount(launcher, weights=dur[activity], minlength=n).astype(np.int64)[rows]
        gpu_count = np.bincount(launcher, minlength=n).astype(np.int64)[rows]
    del launcher, at
    trace_index = events["trace_index"].to_numpy()
    return pd.DataFrame(
        {
            "trace_index": trace_index[rows],
            "name": _take_categorical(events["name"], rows),
            "ts_ns": events["ts_ns"].to_numpy()[rows],
            "dur_ns": dur[rows],
            "self_ns": links.self_ns[rows],
            "pid": events["pid"].to_numpy()[rows],
            "tid": events["tid"].to_numpy()[rows],
            "depth": links.depth[rows],
            "parent_trace_index": _row_ref(links.parent[rows], trace_index),
            "sequence_number": events["sequence_number"].to_numpy()[rows],
            "stage": stage_categorical(attribution.stage[rows]),
            "stage_rule": pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names),
            "step": attribution.step[rows],
            "gpu_launched_ns": gpu_ns,
            "gpu_launched_count": gpu_count,
        },
        copy=False,  # every column is a fresh array: no need to copy it again
    )


def _group_start_order(group: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting by (group, start, index), like ``np.lexsort((start, group))`` but in one pass when
    (group, start) fits in one int64 key."""
    s0 = int(start.min())
    span = int(start.max()) - s0 + 1
    if int(group.min()) >= 0 and (int(group.max()) + 1) * span < 2**62:
        key = group.astype(np.int64)
        key *= span
        key += start
        key -= s0
        return np.argsort(key, kind="stable")
    return np.lexsort((start, group))


def _union_stats(
    group: np.ndarray,
    start: np.ndarray,
    end: np.ndarray | None,
    groups: int,
    rows: np.ndarray | None = None,
    dur: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group id in ``range(groups)``: length of the union of [start, end), min start, max end.

    ``rows``: use only these positions of the arrays (a mask or indices), without copying them first.
    ``dur``: give durations instead of ``end`` (ends are then computed for the rows used only).
    """
    out = np.zeros(groups, dtype=np.int64)
    first = np.full(groups, np.iinfo(np.int64).max)
    last = np.full(groups, np.iinfo(np.int64).min)
    rows = np.arange(len(start)) if rows is None else np.flatnonzero(rows) if rows.dtype == bool else rows
    if len(rows) == 0:
        return out, first, last
    order = _group_start_order(group[rows], start[rows])
    rows = rows[order]
    del order
    g = group[rows]
    s = start[rows].astype(np.int64, copy=False)
    e = end[rows].astype(np.int64, copy=False) if end is not None else s + dur[rows]
    del rows
    heads = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
    ids = g[heads]
    first[ids] = s[heads]  # sorted by start within a group: its first row starts earliest
    last[ids] = np.maximum.reduceat(e, heads)
    base = s.min()
    span = int(e.max() - base) + 1
    shift = g.astype(np.int64)  # groups far apart on one line: one sweep covers them all
    del g
    shift *= span
    s -= base
    s += shift
    e -= base
    e += shift
    del shift
    reach = np.maximum.accumulate(e)
    np.maximum(s[1:], reach[:-1], out=s[1:])  # where each interval's new coverage starts
    del reach
    np.subtract(e, s, out=e)
    np.maximum(e, 0, out=e)  # covered
    out[ids] = np.add.reduceat(e, heads)
    return out, first, last


def union_length(group: np.ndarray, start: np.ndarray, end: np.ndarray, groups: int) -> np.ndarray:
    """Total length covered by the union of [start, end) intervals, per group id in ``range(groups)``."""
    return _union_stats(group, start, end, groups)[0]


def mixed_containers(parent: np.ndarray, depth: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """True for events whose subtree holds events of another stage (e.g. ProfilerStep, ``<module>`` frames)."""
    n = len(parent)
    mixed = np.zeros(n, dtype=bool)
    if n == 0:
        return mixed
    by_depth, bounds = depth_order(depth)
    for d in range(int(depth.max()), 0, -1):
        rows = by_depth[bounds[d] : bounds[d + 1]]
        p = parent[rows]
        ok = p >= 0
        rows, p = rows[ok], p[ok]
        differs = (stage[rows] != stage[p]) | mixed[rows]
        mixed[p[differs]] = True
    return mixed


def _training_threads(links: Links, stage: np.ndarray) -> np.ndarray:
    """Per host thread id (plus a trailing False for 'no thread'): does it run any load/forward/backward/optimizer
    work? Background threads that only wait (a progress-bar monitor, say) do not count towards wall time."""
    n_threads = len(links.threads)
    working = links.host & (stage != STAGES.index("other"))
    flags = np.zeros(n_threads + 1, dtype=bool)
    flags[np.unique(links.thread[working])] = True
    flags[-1] = False
    return flags


def stage_summary(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """One row per (step, stage) plus one per stage over the whole trace (``scope`` = ``total``).

    GPU idle is measured inside each step: from the stage's first GPU activity to its last, minus busy time;
    the total row adds up the per-step idle times.
    """
    step = attribution.step
    n_stages = len(STAGES)
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    kernel = kind_mask(events, {"kernel"})
    memcpy = kind_mask(events, {"gpu_memcpy"})
    op = kind_mask(events, {"cpu_op"}) & links.host
    spans = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    spans &= ~mixed_containers(links.parent, links.depth, attribution.stage)
    spans &= _training_threads(links, attribution.stage)[links.thread]
    launcher = np.zeros(len(events), dtype=bool)
    launcher[links.launch[links.launch >= 0]] = True
    launcher &= kind_mask(events, RUNTIME_KINDS)
    memcpy_bytes = events["bytes"].to_numpy()[memcpy]
    memcpy_bytes = np.where(memcpy_bytes == NULL, 0, memcpy_bytes)

    step_values = np.sort(pd.unique(step))
    step_values = step_values[step_values != NULL]
    frames = []
    for scope in ("step", "total"):
        if scope == "step":
            key = np.searchsorted(step_values, step)  # becomes (step index) * n_stages + stage, in place
            key[step == NULL] = len(step_values)
            key *= n_stages
            key += attribution.stage
            labels = np.concatenate([step_values, [NULL]])
        else:
            labels = np.array([NULL])
            key = attribution.stage.astype(np.int64)
        groups = len(labels) * n_stages

        def total(mask: np.ndarray, weights: np.ndarray | None = None, key=key, groups=groups) -> np.ndarray:
            return np.bincount(key[mask], weights=weights, minlength=groups).astype(np.int64)

        busy, first, last = _union_stats(key, ts, None, groups, activity, dur)
        window = np.where(last > first, last - first, 0)
        frame = pd.DataFrame(
            {
                "scope": scope,
                "step": np.repeat(labels, n_stages),
                "stage": stage_categorical(np.tile(np.arange(n_stages), len(labels))),
                "host_wall_ns": _union_stats(key, ts, None, groups, spans, dur)[0],
                "host_op_ns": total(op, links.self_ns[op]),
                "gpu_time_ns": total(activity, dur[activity]),
                "gpu_busy_ns": busy,
                "gpu_idle_ns": window - busy,
                "kernel_count": total(kernel),
                "gpu_activity_count": total(activity),
                "launch_count": total(launcher),
                "memcpy_bytes": total(memcpy, memcpy_bytes),
            }
        )
        if scope == "step":
            present = np.bincount(key, minlength=groups) > 0
            frame = frame[present | (frame["step"] != NULL).to_numpy()]
        frames.append(frame)
        del key
    step_frame, total_frame = frames
    idle_by_stage = step_frame.groupby("stage", observed=False)["gpu_idle_ns"].sum()
    total_frame["gpu_idle_ns"] = idle_by_stage.reindex(total_frame["stage"]).to_numpy()
    summary = pd.concat(frames, ignore_index=True)
    summary.loc[(summary["scope"] == "step") & (summary["step"] == NULL), "scope"] = "outside_steps"
    return summary.reset_index(drop=True)
