"""Row tables: events (with links and stages), kernels and ops; and the column helpers other tables share.

All times are int64 nanoseconds (``_ns``), sizes bytes (``_bytes``). Internally missing integers are the ``NULL``
sentinel; :func:`nullable` turns them into pandas' nullable ``Int64`` for users.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.stages.graph_launch import graph_rule_mask
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links, kind_mask


def nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """int64 array with ``NULL`` sentinels -> pandas nullable Int64 (no copy of the values)."""
    values = np.asarray(values, dtype=np.int64)
    return pd.arrays.IntegerArray(values, values == NULL)


def row_ref(rows: np.ndarray, trace_index: np.ndarray) -> np.ndarray:
    """Row numbers (``-1`` = none) -> trace_index values (``NULL`` = none)."""
    out = np.full(len(rows), NULL, dtype=np.int64)
    ok = rows >= 0
    out[ok] = trace_index[rows[ok]]
    return out


def take_categorical(column: pd.Series, rows: np.ndarray) -> pd.Categorical:
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
    out = events.iloc[start:stop].copy(deep=False) if start or stop is not None else events.copy(deep=False)
    for name, values in event_links(events, links, attribution, start, stop).items():
        out[name] = values
    return out


def event_links(
    events: pd.DataFrame, links: Links, attribution: Attribution, start: int = 0, stop: int | None = None
) -> dict[str, np.ndarray | pd.Categorical]:
    """The columns :func:`event_table` adds to the raw events' rows ``start:stop``."""
    rows = slice(start, stop)
    trace_index = events["trace_index"].to_numpy()
    return {
        "parent_trace_index": row_ref(links.parent[rows], trace_index),
        "depth": links.depth[rows],
        "self_ns": links.self_ns[rows],
        "launch_trace_index": row_ref(links.launch[rows], trace_index),
        "launch_op_trace_index": row_ref(links.launch_op[rows], trace_index),
        "stage": stage_categorical(attribution.stage[rows]),
        "stage_rule": pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names),
        "step": attribution.step[rows],
    }


def kernel_table(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """GPU activity (kernels, memcpy, memset) with stage, step and the runtime call and CPU op that launched it."""
    rows = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    ts = events["ts_ns"].to_numpy()
    launch = links.launch[rows]
    launch_op = links.launch_op[rows]
    trace_index = events["trace_index"].to_numpy()
    has_launch = launch >= 0
    has_launch &= ~graph_rule_mask(attribution.rule[rows], attribution.rule_names)  # a graph replay: no latency
    latency = np.full(len(rows), NULL, dtype=np.int64)
    latency[has_launch] = ts[rows][has_launch] - ts[launch[has_launch]]
    return pd.DataFrame(
        {
            "trace_index": trace_index[rows],
            "kind": take_categorical(events["kind"], rows),
            "name": take_categorical(events["name"], rows),
            "ts_ns": ts[rows],
            "dur_ns": events["dur_ns"].to_numpy()[rows],
            "device": events["device"].to_numpy()[rows],
            "stream": events["stream"].to_numpy()[rows],
            "correlation": events["correlation"].to_numpy()[rows],
            "bytes": events["bytes"].to_numpy()[rows],
            "stage": stage_categorical(attribution.stage[rows]),
            "stage_rule": pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names),
            "step": attribution.step[rows],
            "launch_trace_index": row_ref(launch, trace_index),
            "launch_name": take_categorical(events["name"], launch),
            "launch_op_trace_index": row_ref(launch_op, trace_index),
            "launch_op_name": take_categorical(events["name"], launch_op),
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
            "name": take_categorical(events["name"], rows),
            "ts_ns": events["ts_ns"].to_numpy()[rows],
            "dur_ns": dur[rows],
            "self_ns": links.self_ns[rows],
            "pid": events["pid"].to_numpy()[rows],
            "tid": events["tid"].to_numpy()[rows],
            "depth": links.depth[rows],
            "parent_trace_index": row_ref(links.parent[rows], trace_index),
            "sequence_number": events["sequence_number"].to_numpy()[rows],
            "stage": stage_categorical(attribution.stage[rows]),
            "stage_rule": pd.Categorical.from_codes(attribution.rule[rows], categories=attribution.rule_names),
            "step": attribution.step[rows],
            "gpu_launched_ns": gpu_ns,
            "gpu_launched_count": gpu_count,
        },
        copy=False,  # every column is a fresh array: no need to copy it again
    )
