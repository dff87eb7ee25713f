"""Link events: host nesting per thread, and GPU activity -> launching runtime call -> launching CPU op.

Nesting is by time containment on each (pid, tid): an event's parent is the innermost longer event on the
same thread that contains it. Zero-length events (memory, instants, flows) are leaves. GPU activity joins
the runtime call with the same ``correlation`` on any host thread, then takes that call's innermost
enclosing ``cpu_op`` as its launching op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.trace.events import GPU_ACTIVITY_KINDS, GPU_TRACK_KINDS, KIND_CODE, NULL, RUNTIME_KINDS


def kind_mask(events: pd.DataFrame, kinds: frozenset[str] | set[str] | tuple[str, ...]) -> np.ndarray:
    """Boolean mask of rows whose ``kind`` is one of ``kinds``."""
    codes = events["kind"].cat.codes.to_numpy()
    wanted = np.zeros(len(KIND_CODE), dtype=bool)
    wanted[[KIND_CODE[k] for k in kinds]] = True
    return wanted[codes]


@dataclass
class Links:
    """Row-index links computed for an event table (``-1`` = none)."""

    host: np.ndarray  # bool: event lives on a host thread
    thread: np.ndarray  # int: dense id of (pid, tid) for host events, -1 otherwise
    parent: np.ndarray
    depth: np.ndarray
    self_ns: np.ndarray
    launch: np.ndarray  # GPU activity -> its runtime call
    launch_op: np.ndarray  # GPU activity -> innermost cpu_op around the runtime call
    enclosing_op: np.ndarray  # any host event -> innermost cpu_op ancestor (itself excluded)
    threads: pd.DataFrame  # one row per host thread id: pid, tid


def gpu_tracks(events: pd.DataFrame) -> set[tuple[int, int]]:
    """(pid, tid) pairs that carry GPU activity or GPU annotations."""
    on_gpu = kind_mask(events, GPU_TRACK_KINDS)
    pairs = events.loc[on_gpu, ["pid", "tid"]].drop_duplicates()
    return set(zip(pairs["pid"].tolist(), pairs["tid"].tolist(), strict=True))


def host_mask(events: pd.DataFrame) -> np.ndarray:
    """Rows that live on host (CPU) threads: not GPU-track events, not metadata."""
    mask = ~kind_mask(events, GPU_TRACK_KINDS | {"metadata"})
    tracks = gpu_tracks(events)
    if tracks:
        key = pd.MultiIndex.from_arrays([events["pid"].to_numpy(), events["tid"].to_numpy()])
        on_track = key.isin(list(tracks))
        mask &= ~np.asarray(on_track)
    return mask


def nest(thread: np.ndarray, ts: np.ndarray, end: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent row and depth of each row in ``rows`` by containment on its thread.

    Rows are visited sorted by (thread, start, longest first); a stack holds the open containers.
    """
    n = len(ts)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int32)
    if len(rows) == 0:
        return parent, depth
    order = rows[np.lexsort((rows, -(end[rows] - ts[rows]), ts[rows], thread[rows]))]
    order_l = order.tolist()
    thread_l = thread[order].tolist()
    ts_l = ts[order].tolist()
    end_l = end[order].tolist()
    par = [-1] * len(order_l)
    dep = [0] * len(order_l)
    stack_rows: list[int] = []
    stack_end: list[int] = []
    current = None
    for k, row in enumerate(order_l):
        t = thread_l[k]
        if t != current:
            current = t
            stack_rows.clear()
            stack_end.clear()
        e = end_l[k]
        while stack_end and stack_end[-1] < e:
            stack_end.pop()
            stack_rows.pop()
        if stack_rows:
            par[k] = stack_rows[-1]
            dep[k] = len(stack_rows)
        if e > ts_l[k]:
            stack_rows.append(row)
            stack_end.append(e)
    parent[order] = par
    depth[order] = dep
    return parent, depth


def innermost_ancestor_of_kind(parent: np.ndarray, depth: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """For every row: the nearest proper ancestor with ``is_kind`` (``-1`` if none), level by level."""
    n = len(parent)
    found = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return found
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(depth.max() + 2))
    for d in range(1, depth.max() + 1):
        rows = by_depth[bounds[d] : bounds[d + 1]]
        p = parent[rows]
        ok = p >= 0
        rows, p = rows[ok], p[ok]
        found[rows] = np.where(is_kind[p], p, found[p])
    return found


def link(events: pd.DataFrame) -> Links:
    """Compute nesting, self time and GPU launch links for an event table."""
    n = len(events)
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    end = ts + dur
    host = host_mask(events)
    pid = events["pid"].to_numpy()
    tid = events["tid"].to_numpy()
    thread = np.full(n, -1, dtype=np.int64)
    pairs = pd.DataFrame({"pid": pid[host], "tid": tid[host]})
    codes, uniques = pd.MultiIndex.from_frame(pairs).factorize() if len(pairs) else (np.array([], int), None)
    thread[host] = codes
    threads = (
        pd.DataFrame({"pid": uniques.get_level_values(0), "tid": uniques.get_level_values(1)})
        if uniques is not None
        else pd.DataFrame({"pid": np.array([], np.int64), "tid": np.array([], np.int64)})
    )
    host_rows = np.flatnonzero(host)
    parent, depth = nest(thread, ts, end, host_rows)

    child_time = np.bincount(parent[parent >= 0], weights=dur[parent >= 0], minlength=n)
    self_ns = np.where(host, dur - child_time.astype(np.int64), 0)
    self_ns = np.maximum(self_ns, 0)

    is_op = kind_mask(events, {"cpu_op"})
    enclosing_op = innermost_ancestor_of_kind(parent, depth, is_op)

    launch = np.full(n, -1, dtype=np.int64)
    corr = events["correlation"].to_numpy()
    runtime = kind_mask(events, RUNTIME_KINDS) & host & (corr != NULL)
    activity = kind_mask(events, GPU_ACTIVITY_KINDS) & (corr != NULL)
    if runtime.any() and activity.any():
        rt_rows = np.flatnonzero(runtime)
        by_corr = pd.Series(rt_rows, index=corr[rt_rows])
        by_corr = by_corr[~by_corr.index.duplicated(keep="first")]
        act_rows = np.flatnonzero(activity)
        hit = by_corr.reindex(corr[act_rows]).to_numpy()
        ok = ~np.isnan(hit)
        launch[act_rows[ok]] = hit[ok].astype(np.int64)
    launch_op = np.full(n, -1, dtype=np.int64)
    has_launch = launch >= 0
    launch_op[has_launch] = enclosing_op[launch[has_launch]]
    return Links(
        host=host,
        thread=thread,
        parent=parent,
        depth=depth,
        self_ns=self_ns,
        launch=launch,
        launch_op=launch_op,
        enclosing_op=enclosing_op,
        threads=threads,
    )
