"""Link events: host nesting per thread, and GPU activity -> launching runtime call -> launching CPU op.

Nesting is by time containment on each (pid, tid): an event's parent is the innermost longer event on the
same thread that contains it. Zero-length events (memory, instants, flows) are leaves. GPU activity joins
the runtime call with the same ``correlation`` on any host thread, then takes that call's innermost
enclosing ``cpu_op`` as its launching op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profparse.base.arrays import pack_codes, unpack_codes
from profparse.base.intervals import group_start_order
from profparse.trace.ancestors import innermost_ancestor_of_kind
from profparse.trace.budget import release_memory
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, GPU_TRACK_KINDS, KIND_CODE, NULL, RUNTIME_KINDS, STEP_NAME


def index_dtype(rows: int) -> type:
    """The integer type of row numbers into a table of ``rows`` rows (``-1``: none): int32 where they fit, which
    halves the memory of the links that every later stage keeps."""
    return np.int32 if rows < 2**31 else np.int64


def names_matching(categories: pd.Index, pattern: re.Pattern[str] | str) -> np.ndarray:
    """Boolean per name category: does ``pattern`` match (``re.search``)? One more ``False`` at the end, so the
    array can be indexed by the name codes directly (a row without a name, code ``-1``, matches nothing)."""
    search = (re.compile(pattern) if isinstance(pattern, str) else pattern).search
    hit = np.zeros(len(categories) + 1, dtype=bool)
    names = categories.tolist()  # Python strings at once: iterating an Arrow-backed index boxes each name, 2x slower
    hit[:-1] = np.fromiter((search(str(name)) is not None for name in names), dtype=bool, count=len(names))
    return hit


def name_mask(events: pd.DataFrame, pattern: re.Pattern[str] | str) -> np.ndarray:
    """Boolean per row: does ``pattern`` match its name (``re.search``)? Tested once per distinct name."""
    names = events["name"]
    return names_matching(names.cat.categories, pattern)[names.cat.codes.to_numpy()]


def kind_mask(events: pd.DataFrame, kinds: frozenset[str] | set[str] | tuple[str, ...]) -> np.ndarray:
    """Boolean mask of rows whose ``kind`` is one of ``kinds``.

    Up to four kinds by comparisons, more through a lookup table with ``np.take``: called dozens of times per parse,
    and a comparison is ~10x cheaper than ``np.take``, which is twice as fast as indexing the table by the int8
    codes."""
    codes = events["kind"].cat.codes.to_numpy()
    wanted = sorted({KIND_CODE[k] for k in kinds})
    if len(wanted) <= 4:
        mask = codes == wanted[0] if wanted else np.zeros(len(codes), dtype=bool)
        for code in wanted[1:]:
            mask |= codes == code
        return mask
    table = np.zeros(len(KIND_CODE), dtype=bool)
    table[wanted] = True
    return np.take(table, codes)


@dataclass
class Links:
    """Row-index links computed for an event table (``-1`` = none; row numbers as :func:`index_dtype`)."""

    host: np.ndarray  # bool: event lives on a host thread
    thread: np.ndarray  # int: dense id of (pid, tid) for host events, -1 otherwise
    parent: np.ndarray
    depth: np.ndarray
    self_ns: np.ndarray
    launch: np.ndarray  # GPU activity -> its runtime call
    launch_op: np.ndarray  # GPU activity -> innermost cpu_op around the runtime call
    enclosing_op: np.ndarray  # any host event -> innermost cpu_op ancestor (itself excluded)
    threads: pd.DataFrame  # one row per host thread id: pid, tid
    #: values derived from the links and their event table, made once (e.g. the blocking calls, read by the
    #: critical path, the replay, two findings and a quality check)
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def gpu_tracks(events: pd.DataFrame) -> set[tuple[int, int]]:
    """(pid, tid) pairs that carry GPU activity or GPU annotations."""
    on_gpu = kind_mask(events, GPU_TRACK_KINDS)
    pairs = events.loc[on_gpu, ["pid", "tid"]].drop_duplicates()
    return set(zip(pairs["pid"].tolist(), pairs["tid"].tolist(), strict=True))


def track_keys(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One int64 key per row that is equal exactly for rows on the same (pid, tid); and the distinct pids, tids.

    ``key = pid_code * len(tids) + tid_code``, so ``pids[key // len(tids)]`` and ``tids[key % len(tids)]``
    give the pair back.
    """
    key, (pids, tids) = pack_codes(events["pid"].to_numpy(), events["tid"].to_numpy())  # n * n < 2**62: fits
    return key, pids, tids


def host_mask(events: pd.DataFrame, keys: np.ndarray | None = None) -> np.ndarray:
    """Rows that live on host (CPU) threads: not GPU-track events, not metadata."""
    mask = ~kind_mask(events, GPU_TRACK_KINDS | {"metadata"})
    on_gpu = kind_mask(events, GPU_TRACK_KINDS)
    if on_gpu.any():
        if keys is None:
            keys = track_keys(events)[0]
        mask &= ~np.isin(keys, np.unique(keys[on_gpu]))
    return mask


def _order_ties(order: np.ndarray, same: np.ndarray, neg_dur: np.ndarray) -> None:
    """Within each run of equal keys in ``order`` (``same[i]``: positions i and i+1 are equal), sort by
    ``neg_dur`` of the rows, keeping the present order among equals (in place)."""
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    pos = np.flatnonzero(tied)
    sub = order[pos]
    group = np.cumsum(np.concatenate([[True], ~same]))[pos]  # one number per run of equal keys, increasing
    order[pos] = sub[group_start_order(group, neg_dur[sub])]  # runs are in order already, so this is quick


def _thread_order(thread: np.ndarray, ts: np.ndarray, neg_dur: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` sorted by (thread, ts, longest first, row)."""
    th, t = thread[rows].astype(np.int64), ts[rows]
    if len(rows) == 0:
        return rows
    t0 = int(t.min())
    shift = max(int(t.max()) - t0, 0).bit_length()
    if int(th.max()) >= 0 and shift + max(int(th.max()), 0).bit_length() <= 62:
        # (thread, ts) packed in one int64: a stable sort of file order (nearly sorted) is quick;
        # then rows with equal (thread, ts) are put in order by duration, longest first
        key = (th << shift) | (t - t0)
        order = np.argsort(key, kind="stable")
        k = key[order]
        same = k[1:] == k[:-1]
        if same.any():
            _order_ties(order, same, neg_dur[rows])
        return rows[order]
    return rows[np.lexsort((rows, neg_dur[rows], t, th))]


def nest(
    thread: np.ndarray, ts: np.ndarray, end: np.ndarray, rows: np.ndarray, rank: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Parent row and depth of each row in ``rows`` by containment on its thread.

    The rule (a stack over rows sorted by thread, start, longest first, then by ``rank`` where given: of rows
    with one span, the lower rank holds the other; then the file's order): a row's parent is the nearest earlier
    row of its thread that is longer than zero and ends no earlier than it. Zero-length rows never pop a possible
    parent, since they start no later than the row and end where they start. That nearest row is found for all
    rows at once by pointer doubling: each row keeps a candidate such that no row between it and the candidate
    qualifies, and a failing candidate is replaced by the candidate's own candidate. Depth is the number of
    ancestors, counted by doubling along parent links.
    """
    n = len(ts)
    parent = np.full(n, -1, dtype=index_dtype(n))
    depth = np.zeros(n, dtype=np.int32)
    m = len(rows)
    if m == 0:
        return parent, depth
    # rank in the low bits of the (negated) length: durations stay far below 2**59 ns (over 11 days is dropped)
    order = _thread_order(thread, ts, ts - end if rank is None else (ts - end) * 8 + rank, rows)
    th = thread[order]
    e = end[order]
    can_contain = e > ts[order]
    cand = np.arange(-1, m - 1, dtype=np.int64)
    cand[0] = -1
    cand[1:][th[1:] != th[:-1]] = -1
    del th
    found = np.full(m, -1, dtype=np.int64)
    active = np.flatnonzero(cand >= 0)
    while active.size:
        c = cand[active]
        ok = can_contain[c] & (e[c] >= e[active])
        found[active[ok]] = c[ok]
        active = active[~ok]
        nxt = cand[c[~ok]]
        cand[active] = nxt
        active = active[nxt >= 0]
    del cand, e, can_contain
    dep = (found >= 0).astype(np.int32)
    up = found.copy()
    active = np.flatnonzero(up >= 0)
    while active.size:
        a = up[active]
        dep[active] += dep[a]
        up[active] = up[a]
        active = active[up[active] >= 0]
    del up
    has = found >= 0
    parent[order[has]] = order[found[has]]
    depth[order] = dep
    return parent, depth


def first_row_of(keys: np.ndarray, rows: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted``: the first of ``rows`` (in their order) whose key (``keys``, one per row) equals it,
    -1 where none. A stable sort and a binary search: a third of the time of pandas' ``duplicated`` +
    ``reindex``."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    first = np.ones(len(sorted_keys), dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    unique_keys, unique_rows = sorted_keys[first], rows[order[first]]
    if not len(unique_keys):
        return np.full(len(wanted), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(unique_keys, wanted), len(unique_keys) - 1)
    return np.where(unique_keys[pos] == wanted, unique_rows[pos], -1).astype(np.int64)


#: which of two host events with the same start and end on a thread holds the other (lower first; the file's
#: order within a rank): the step's range, user ranges, Python frames, ops, runtime calls, the rest. Real traces
#: have no such pairs (nanosecond clocks); written ones would otherwise nest in whatever order the file lists them
_SPAN_RANK = {"user_annotation": 1, "python_function": 2, "cpu_op": 3, **dict.fromkeys(RUNTIME_KINDS, 4)}


def span_rank(events: pd.DataFrame) -> np.ndarray:
    """Each row's :data:`_SPAN_RANK` (int64; 0 for a ``ProfilerStep#N`` range, 5 for a kind not listed)."""
    table = np.full(len(KIND_CODE), 5, dtype=np.int64)
    for kind, rank in _SPAN_RANK.items():
        table[KIND_CODE[kind]] = rank
    rank = table[events["kind"].cat.codes.to_numpy()]
    rank[name_mask(events, STEP_NAME)] = 0
    return rank


def link(events: pd.DataFrame) -> Links:
    """Compute nesting, self time and GPU launch links for an event table."""
    n = len(events)
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    end = ts + dur
    keys, pids, tids = track_keys(events)
    host = host_mask(events, keys)
    index = index_dtype(n)
    thread = np.full(n, -1, dtype=index)
    codes, uniques = pd.factorize(keys[host])
    del keys
    thread[host] = codes
    uniques = np.asarray(uniques, dtype=np.int64)
    thread_pid, thread_tid = unpack_codes(uniques, [pids, tids])
    threads = pd.DataFrame({"pid": thread_pid, "tid": thread_tid})
    host_rows = np.flatnonzero(host)
    parent, depth = nest(thread, ts, end, host_rows, span_rank(events))

    child_time = np.bincount(parent[parent >= 0], weights=dur[parent >= 0], minlength=n)
    self_ns = np.where(host, dur - child_time.astype(np.int64), 0)
    self_ns = np.maximum(self_ns, 0)

    is_op = kind_mask(events, {"cpu_op"})
    enclosing_op = innermost_ancestor_of_kind(parent, depth, is_op)

    launch = np.full(n, -1, dtype=index)
    corr = events["correlation"].to_numpy()
    runtime = kind_mask(events, RUNTIME_KINDS) & host & (corr != NULL)
    activity = kind_mask(events, GPU_ACTIVITY_KINDS) & (corr != NULL)
    if runtime.any() and activity.any():
        rt_rows = np.flatnonzero(runtime)
        act_rows = np.flatnonzero(activity)
        launch[act_rows] = first_row_of(corr[rt_rows], rt_rows, corr[act_rows])
    launch_op = np.full(n, -1, dtype=index)
    has_launch = launch >= 0
    launch_op[has_launch] = enclosing_op[launch[has_launch]]
    release_memory()
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
