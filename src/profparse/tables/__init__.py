"""Derived tables: events (with links and stages), kernels, ops and the per step x stage summary.

All times are int64 nanoseconds (``_ns``), sizes bytes (``_bytes``). Internally missing integers are the ``NULL``
sentinel; :func:`nullable` turns them into pandas' nullable ``Int64`` for users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution, step_window
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, KIND_CODE, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, depth_order, kind_mask

HOST_SPAN_KINDS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"})
SUMMARY_COLUMNS = (
    "step",
    "stage",
    "host_wall_ns",
    "host_op_ns",
    "gpu_time_ns",
    "gpu_busy_ns",
    "gpu_overlap_ns",
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
    if not len(start):
        return np.zeros(0, dtype=np.intp)
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
    out[ids] = _sorted_union(g, s, e, heads)
    return out, first, last


def _sorted_union(g: np.ndarray, s: np.ndarray, e: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Union length per run of equal ``g`` (rows sorted by group, then start; ``heads``: first row of each run).
    ``s`` and ``e`` may be overwritten."""
    s, e = _on_one_line(g, s, e, out=True)
    return _line_union(s, e, heads)


def _on_one_line(g: np.ndarray, s: np.ndarray, e: np.ndarray, out: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``s`` and ``e`` shifted so that groups lie far apart on one line (group ``g`` in ``[g * span, (g + 1) *
    span)``): one sweep then covers them all. ``out``: overwrite ``s`` and ``e`` instead of copying them."""
    if not len(s):
        return s, e
    base = s.min()
    span = int(e.max() - base) + 1
    shift = g.astype(np.int64)
    shift *= span
    shift -= base
    if not out:
        return s + shift, e + shift
    s += shift
    e += shift
    return s, e


def _line_union(s: np.ndarray, e: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Union length per run starting at ``heads`` of intervals sorted by start on one line (:func:`_on_one_line`).
    ``s`` and ``e`` are overwritten."""
    reach = np.maximum.accumulate(e)
    np.maximum(s[1:], reach[:-1], out=s[1:])  # where each interval's new coverage starts
    del reach
    np.subtract(e, s, out=e)
    np.maximum(e, 0, out=e)  # covered
    return np.add.reduceat(e, heads)


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


# -- host time: wall time per stage, split into levels ---------------------------------------------------------------

#: Host levels, highest priority first. Where several threads run the same stage at one moment, that moment counts
#: once, for the highest-priority level among them (work before waiting), so the levels add up to the host wall.
HOST_LEVELS: tuple[str, ...] = ("op", "op_python", "runtime", "python", "sync", "wait")
_LEVEL = {name: i for i, name in enumerate(HOST_LEVELS)}
SYNC_NAME = re.compile(r"(?i)synchroniz")
#: Python frames in which a thread is blocked: on a lock, an event, a condition, a queue, a sleep, or on the
#: autograd engine (``run_backward`` while the engine's threads do the work). A frame with a CPU op below it on
#: its own thread (the CPU engine running backward inline) is not waiting.
WAIT_FRAME = re.compile(
    r"(^|/)threading\.py\(\d+\): (wait|join|_wait_for_tstate_lock|acquire)$"
    r"|^<method 'acquire' of '_thread\.(lock|RLock)' objects>$"
    r"|^<built-in (method|function) (acquire|wait|sleep|poll|select|_cuda_synchronize)\b"
    r"|(^|/)(queue|selectors|multiprocessing/(connection|queues|synchronize)|concurrent/futures/_base)\.py\(\d+\): "
    r"(get|wait|poll|_poll|select|result|recv|_recv|_recv_bytes|acquire)$"
    r"|^<built-in method run_backward of torch\._C\._EngineBase object"
    r"|(^|/)torch/autograd/graph\.py\(\d+\): _engine_run_backward$"
)


def _names_matching(events: pd.DataFrame, pattern: re.Pattern) -> np.ndarray:
    """Per row: does its name match ``pattern``?"""
    names = events["name"].cat.categories
    hit = np.fromiter((pattern.search(str(x)) is not None for x in names), dtype=bool, count=len(names))
    return hit[events["name"].cat.codes.to_numpy()]


def working_threads(events: pd.DataFrame, links: Links, stage: np.ndarray) -> np.ndarray:
    """Per host thread id (plus a trailing False for 'no thread'): does it create stage time?

    A thread works when it runs a CPU op or a runtime call. Threads with Python frames only (a progress-bar
    monitor in ``threading.wait``, a watchdog) never do. In a trace without any op or runtime call, a thread works
    when it runs any load/forward/backward/optimizer event.
    """
    flags = np.zeros(len(links.threads) + 1, dtype=bool)
    torch_work = links.host & kind_mask(events, {"cpu_op"} | RUNTIME_KINDS)
    if not torch_work.any():
        torch_work = links.host & (stage != STAGES.index("other"))
    flags[links.thread[torch_work]] = True  # repeated indices are fine: no np.unique sort
    flags[-1] = False
    return flags


def _group_running_max(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` restarting at each new ``group`` (rows sorted by group)."""
    if len(values) == 0:
        return values.copy()
    rank = np.concatenate([[0], np.cumsum(group[1:] != group[:-1])]).astype(np.int64)
    low = int(values.min())
    span = int(values.max()) - low + 1
    if (int(rank[-1]) + 1) * span < 2**62:  # groups laid end to end on one line: one accumulate for all
        shifted = rank * span + (values - low)
        return np.maximum.accumulate(shifted) - rank * span + low
    return pd.Series(values).groupby(rank).cummax().to_numpy()


@dataclass
class HostSegments:
    """Self-time pieces of the host events that count as stage time: ``[start, end)``, stage code, level code
    (index into :data:`HOST_LEVELS`), and the step index (row of ``attribution.steps``, -1 outside) of the window
    the piece lies in. Pieces are cut at step boundaries."""

    start: np.ndarray
    end: np.ndarray
    stage: np.ndarray
    level: np.ndarray
    step_index: np.ndarray


def host_segments(events: pd.DataFrame, links: Links, attribution: Attribution) -> HostSegments:
    """The time each host thread spends in each counted event's own code (its duration minus its children's).

    Counted: ops, user ranges, Python frames and runtime calls longer than zero, on working threads
    (:func:`working_threads`), except ranges that hold several stages (``ProfilerStep#N``, ``<module>``), whose
    own time belongs to no stage. Nested events partition their parent, so on one thread the pieces do not overlap.
    """
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    end = ts + dur
    stage = attribution.stage
    tree = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    rows = np.flatnonzero(tree)
    parent = links.parent[rows].copy()  # nearest ancestor in the tree (other kinds, zero-length rows: skipped)
    while True:
        bad = np.flatnonzero((parent >= 0) & ~tree[np.maximum(parent, 0)])
        if not bad.size:
            break
        parent[bad] = links.parent[parent[bad]]
    counted = tree & ~mixed_containers(links.parent, links.depth, stage)
    counted &= working_threads(events, links, stage)[links.thread]

    kind = events["kind"].cat.codes.to_numpy()
    level = np.full(len(events), _LEVEL["python"], dtype=np.int8)
    level[kind == KIND_CODE["cpu_op"]] = _LEVEL["op"]
    in_op = links.enclosing_op >= 0
    level[in_op & (kind != KIND_CODE["cpu_op"])] = _LEVEL["op_python"]
    runtime = kind_mask(events, RUNTIME_KINDS)
    level[runtime] = _LEVEL["runtime"]
    level[runtime & _names_matching(events, SYNC_NAME)] = _LEVEL["sync"]
    python = kind == KIND_CODE["python_function"]
    waiting = python & ~in_op & _names_matching(events, WAIT_FRAME)
    if waiting.any():  # a waiting frame with an op below it on its thread is running that work itself
        op_below = np.zeros(len(events), dtype=bool)
        anc = links.parent[(kind == KIND_CODE["cpu_op"]) & links.host]
        while anc.size:
            anc = anc[anc >= 0]
            anc = anc[~op_below[anc]]
            op_below[anc] = True
            anc = links.parent[anc]
        level[waiting & ~op_below] = _LEVEL["wait"]

    # a parent's own time: the gaps before, between and after its children (sorted by start; the running maximum
    # of the children's ends covers siblings that overlap)
    child = np.flatnonzero(parent >= 0)
    child = child[_group_start_order(parent[child], ts[rows[child]])]  # one packed-key sort, not lexsort's two
    par = parent[child]  # event rows of the parents, one per child
    c_start, c_end = ts[rows[child]], end[rows[child]]
    reach = _group_running_max(par, c_end)
    first = np.concatenate([[True], par[1:] != par[:-1]])[: len(par)]
    last = np.concatenate([par[1:] != par[:-1], [True]])[: len(par)]
    before = ts[par].copy()
    before[~first] = np.maximum(reach[np.flatnonzero(~first) - 1], before[~first])
    has_child = np.zeros(len(events), dtype=bool)
    has_child[par] = True
    leaf = rows[~has_child[rows]]
    seg_owner = np.concatenate([par, par[last], leaf])
    seg_start = np.concatenate([before, np.maximum(reach[last], ts[par[last]]), ts[leaf]])
    seg_end = np.concatenate([np.minimum(c_start, end[par]), end[par[last]], end[leaf]])
    del child, c_start, c_end, reach, before, first, last, has_child, leaf
    keep = counted[seg_owner] & (seg_end > seg_start)
    seg_owner, seg_start, seg_end = seg_owner[keep], seg_start[keep], seg_end[keep]
    return _cut_at_steps(seg_owner, seg_start, seg_end, stage, level, attribution.steps)


def _cut_at_steps(
    owner: np.ndarray, start: np.ndarray, end: np.ndarray, stage: np.ndarray, level: np.ndarray, steps: pd.DataFrame
) -> HostSegments:
    """Pieces cut at every step window boundary, each with the window it lies in."""
    if steps.empty or not len(start):
        window = step_window(start, steps)
    else:
        cuts = np.unique(np.concatenate([steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()]))
        lo = np.searchsorted(cuts, start, side="right")
        # a piece crosses a cut iff the first cut after its start lies before its end: the second searchsorted (for
        # the ends) then runs on those few pieces only
        crosses = np.flatnonzero(cuts[np.minimum(lo, len(cuts) - 1)] < end)
        crosses = crosses[lo[crosses] < len(cuts)]
        pieces = np.ones(len(start), dtype=np.int64)
        pieces[crosses] = np.searchsorted(cuts, end[crosses], side="left") - lo[crosses] + 1
        cut_lo = lo - 1  # the cut a piece starts at or after (-1: before the first cut)
        if (pieces > 1).any():
            idx = np.repeat(np.arange(len(start)), pieces)
            k = np.arange(len(idx)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece number within its row
            cut_lo = lo[idx] + k - 1
            s = np.where(k == 0, start[idx], cuts[np.maximum(cut_lo, 0)])
            e = np.where(k == pieces[idx] - 1, end[idx], cuts[np.minimum(lo[idx] + k, len(cuts) - 1)])
            owner, start, end = owner[idx], s, e
        # Window starts and ends are cuts, so every moment between two neighbouring cuts lies in the same window (or
        # none): a piece's window is its interval's, looked up in the few cuts instead of a searchsorted of every
        # piece against the windows (step_window).
        window = step_window(np.concatenate([[cuts[0] - 1], cuts]), steps)[cut_lo + 1]
    return HostSegments(
        start=start,
        end=end,
        stage=stage[owner].astype(np.int64),
        level=level[owner],
        step_index=window,
    )


def host_levels(segments: HostSegments, key: np.ndarray, groups: int) -> dict[str, np.ndarray]:
    """Per group id: host wall (the union over threads of the pieces) and its split into :data:`HOST_LEVELS`.

    A moment covered by pieces of several levels counts for the highest-priority one: level ``i`` gets the union
    of levels ``0..i`` minus the union of levels ``0..i-1``. The levels add up to the wall exactly.
    """
    out: dict[str, np.ndarray] = {}
    below = np.zeros(groups, dtype=np.int64)
    order = _group_start_order(key, segments.start) if len(key) else np.zeros(0, dtype=np.int64)
    key, start, end, level = key[order], segments.start[order], segments.end[order], segments.level[order]
    present = np.bincount(level, minlength=len(HOST_LEVELS)) > 0
    start, end = _on_one_line(key, start, end)  # once for all levels, not once per pass
    heads = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if len(key) else order
    ids = key[heads]
    for i, name in enumerate(HOST_LEVELS):
        if not present[i]:  # no piece of this level: the union up to it is the one before; skipping the pass saves
            out[name] = np.zeros(groups, dtype=np.int64)  # 2-3 of the 6 on traces without Python stacks
            continue
        covered = np.zeros(groups, dtype=np.int64)
        if len(heads):
            # Pieces of later levels become empty intervals at their own start, which change no union in a sweep
            # sorted by start: one sort and one set of group heads serve every level, each pass runs on the full
            # arrays without taking a subset of them (the subsets cost more than they saved).
            upto_end = np.where(level <= i, end, start)
            covered[ids] = _line_union(start.copy(), upto_end, heads)
        out[name] = covered - below
        below = covered
    out["wall"] = below
    return out


def step_labels(attribution: Attribution) -> np.ndarray:
    """The step numbers summaries have rows for, in order: every step window, plus steps that only GPU work
    inferred for a window the trace does not hold (a step cut off before the first window)."""
    numbers = attribution.steps["step"].to_numpy().astype(np.int64)
    seen = pd.unique(attribution.step)  # a hash pass, then a sort of the few distinct steps: np.unique sorted every
    return np.unique(np.concatenate([numbers, seen[seen != NULL]]))  # event, twice a parse


def host_time(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """Per (scope, step, stage): host wall time and its levels (``<level>_ns`` for :data:`HOST_LEVELS`).

    ``scope = step`` rows cover the time inside each step window (capped at the window); ``outside_steps`` the
    time outside every window; ``total`` rows add those up (a union over the whole trace).
    """
    seg = host_segments(events, links, attribution)
    n_stages = len(STAGES)
    numbers = attribution.steps["step"].to_numpy().astype(np.int64)
    labels = np.concatenate([step_labels(attribution), [NULL]])  # as stage_summary's rows: step numbers in order
    index = np.full(len(seg.step_index), len(labels) - 1, dtype=np.int64)  # outside every window
    inside = seg.step_index >= 0
    label_of_window = np.searchsorted(labels[:-1], numbers)  # per window, not per piece
    index[inside] = label_of_window[seg.step_index[inside]]
    # Pieces are cut at every window boundary, so the windows (and "outside") split time into disjoint parts: the
    # total per stage (a union over the whole trace) is the sum of the per-window unions, exactly. Summing instead
    # of a second host_levels pass over all pieces saves a quarter of host_time.
    by_step = host_levels(seg, index * n_stages + seg.stage, len(labels) * n_stages)
    total = {name: values.reshape(len(labels), n_stages).sum(axis=0) for name, values in by_step.items()}
    frames = []
    for scope, levels, keys in (("step", by_step, labels), ("total", total, np.array([NULL]))):
        frame = pd.DataFrame(
            {
                "scope": scope,
                "step": np.repeat(keys, n_stages),
                "stage_code": np.tile(np.arange(n_stages), len(keys)),
                "host_wall_ns": levels["wall"],
                **{f"{name}_ns": levels[name] for name in HOST_LEVELS},
            }
        )
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    out.loc[(out["scope"] == "step") & (out["step"] == NULL), "scope"] = "outside_steps"
    return out


# -- GPU time: busy per stage, overlap between stages, idle gaps charged to the work that ends them -------------------


@dataclass
class GpuTime:
    """Per (step, device) group: ``span`` (first start to last end of the step's GPU activity on the device) and per
    (group, stage) ``busy``, ``overlap`` and ``idle`` (flat arrays of ``groups * len(STAGES)``); for every group,
    the stages' busy + overlap + idle add up to its span exactly."""

    step: np.ndarray  # per group: step number (NULL: activity outside every step)
    device: np.ndarray  # per group: device id (the GPU pid where the event has no device)
    span: np.ndarray
    busy: np.ndarray
    overlap: np.ndarray
    idle: np.ndarray


def gpu_time(events: pd.DataFrame, attribution: Attribution) -> GpuTime:
    """Split each step's GPU span on each device into busy time per stage, overlap and idle gaps.

    - busy: time when the device runs work of this stage only (any number of streams);
    - overlap: time when it runs work of two or more stages at once, charged to the stage that was running alone
      just before (the work the other stage joined); when they start together, to the first of them in the order
      load, forward, backward, optimizer, other;
    - idle: gaps inside the span with no activity, each charged to the stage of the work that ends the gap (what
      the GPU waited for; on a tie, the first stage in that order).

    A step's GPU activity is the activity launched inside it (``attribution.step``); activity outside every step is
    grouped by the gap between steps it runs in, so no span reaches over a step.
    """
    n_stages = len(STAGES)
    rows = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    ts = events["ts_ns"].to_numpy()[rows]
    dur = events["dur_ns"].to_numpy()[rows]
    stage = attribution.stage[rows].astype(np.int64)
    device = events["device"].to_numpy()[rows]
    device = np.where(device == NULL, events["pid"].to_numpy()[rows], device)
    step = attribution.step[rows]
    steps = attribution.steps
    gap = np.searchsorted(steps["start_ns"].to_numpy(), ts, side="right") if not steps.empty else np.zeros_like(ts)
    group, step_of_group, device_of_group = _factorize_sorted(step, np.where(step == NULL, gap, -1), device)
    groups = len(step_of_group)
    busy = np.zeros(groups * n_stages, dtype=np.int64)
    overlap = np.zeros_like(busy)
    idle = np.zeros_like(busy)
    span = np.zeros(groups, dtype=np.int64)
    if groups:
        span = _split_gpu_span(group.astype(np.int64), ts, ts + dur, stage, busy, overlap, idle)
    return GpuTime(step=step_of_group, device=device_of_group, span=span, busy=busy, overlap=overlap, idle=idle)


def _factorize_sorted(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group number of each row by its tuple of ``columns``, groups numbered in sorted tuple order; and the first
    and last column's value per group. Like ``pd.factorize(pd.MultiIndex.from_arrays(columns), sort=True)``, but
    each column is ranked by a hash factorize and the ranks packed into one int64 key (~5x faster)."""
    ranked = [pd.factorize(column, sort=True) for column in columns]
    if not len(columns[0]) or np.prod([float(len(u)) for _, u in ranked]) >= 2**62:
        group, uniques = pd.factorize(pd.MultiIndex.from_arrays(list(columns)), sort=True)
        first, last = (uniques.get_level_values(i).to_numpy().astype(np.int64) for i in (0, -1))
        return group, first, last
    key = np.zeros(len(columns[0]), dtype=np.int64)
    values = []
    for codes, uniques in ranked:
        key *= len(uniques)
        key += codes
        values.append(np.asarray(uniques, dtype=np.int64))
    group, keys = pd.factorize(key, sort=True)
    ranks = []
    for uniques in reversed(values):
        ranks.append(keys % len(uniques))
        keys = keys // len(uniques)
    return group, values[0][ranks[-1]], values[-1][ranks[0]]


def _split_gpu_span(
    group: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    stage: np.ndarray,
    busy: np.ndarray,
    overlap: np.ndarray,
    idle: np.ndarray,
) -> np.ndarray:
    """The sweep behind :func:`gpu_time`: adds each elementary segment between consecutive start/end points of a
    group to ``busy``/``overlap``/``idle`` at ``group * n_stages + charged stage`` (in place). Returns each group's
    span (first start to last end), read off the sorted points instead of ``np.minimum.at``/``np.maximum.at``
    over every event."""
    n_stages = len(STAGES)
    m = len(start)
    pg = np.concatenate([group, group])
    pt = np.concatenate([start, end])
    is_end = np.concatenate([np.zeros(m, dtype=np.int8), np.ones(m, dtype=np.int8)])
    ps = np.concatenate([stage, stage])
    order = np.lexsort((ps, is_end, pt, pg))  # at one instant, starts before ends, then pipeline order
    pg, pt, is_end, ps = pg[order], pt[order], is_end[order], ps[order]
    del order
    delta = np.where(is_end == 1, -1, 1).astype(np.int32)
    mask = np.zeros(len(pt), dtype=np.int16)  # bit s: stage s is running just after this point
    lowest = np.full(len(pt), -1, dtype=np.int64)
    for s in range(n_stages - 1, -1, -1):
        running = np.cumsum(np.where(ps == s, delta, 0)) > 0  # groups sum to zero, so counts restart per group
        mask |= running.astype(np.int16) << s
        lowest[running] = s
    n_running = np.zeros(len(pt), dtype=np.int8)
    for s in range(n_stages):
        n_running += (mask >> s) & 1
    same_group = np.concatenate([pg[1:] == pg[:-1], [False]])
    length = np.where(same_group, np.concatenate([pt[1:] - pt[:-1], [0]]), 0)
    alone = n_running == 1
    gap = n_running == 0
    # overlap: the stage last running alone in this group, if it is still running; else the lowest running stage
    group_start = np.concatenate([[True], pg[1:] != pg[:-1]])
    anchor = np.where(alone | gap | group_start, np.arange(len(pt)), 0)
    anchor = np.maximum.accumulate(anchor)
    before = np.where(alone[anchor], lowest[anchor], -1)
    still = (before >= 0) & (((mask >> np.maximum(before, 0)) & 1) == 1)
    charged_overlap = np.where(still, before, lowest)
    # an idle segment is followed by a start point in the same group (ends sort after starts at an instant)
    next_stage = np.concatenate([ps[1:], [0]])
    key = pg * n_stages
    sel = alone & (length > 0)
    busy += np.bincount(key[sel] + lowest[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    sel = (n_running >= 2) & (length > 0)
    overlap += np.bincount(key[sel] + charged_overlap[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    sel = gap & (length > 0)
    idle += np.bincount(key[sel] + next_stage[sel], weights=length[sel], minlength=len(busy)).astype(np.int64)
    span = np.zeros(len(busy) // n_stages, dtype=np.int64)
    heads = np.flatnonzero(group_start)  # sorted by time within a group: its first point starts earliest, its last
    tails = np.concatenate([heads[1:], [len(pt)]]) - 1  # ends latest (no activity ends before it starts)
    span[pg[heads]] = pt[tails] - pt[heads]
    return span


def stage_summary(
    events: pd.DataFrame, links: Links, attribution: Attribution, host: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (step, stage) plus one per stage over the whole trace (``scope`` = ``total``).

    Host wall: :func:`host_time` (per step capped at the step window). GPU busy / overlap / idle: :func:`gpu_time`,
    summed over devices; per step they add up to the step's GPU spans. Total rows add up the rows of the steps and
    of ``outside_steps``.
    """
    step = attribution.step
    n_stages = len(STAGES)
    dur = events["dur_ns"].to_numpy()
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    kernel = kind_mask(events, {"kernel"})
    memcpy = kind_mask(events, {"gpu_memcpy"})
    op = kind_mask(events, {"cpu_op"}) & links.host
    launcher = np.zeros(len(events), dtype=bool)
    launcher[links.launch[links.launch >= 0]] = True
    launcher &= kind_mask(events, RUNTIME_KINDS)
    memcpy_bytes = events["bytes"].to_numpy()[memcpy]
    memcpy_bytes = np.where(memcpy_bytes == NULL, 0, memcpy_bytes)
    host = host_time(events, links, attribution) if host is None else host  # ParsedTrace computes it once
    gpu = gpu_time(events, attribution)

    step_values = step_labels(attribution)
    labels = np.concatenate([step_values, [NULL]])

    def step_rows(values: np.ndarray) -> np.ndarray:
        """Step numbers -> position in ``labels`` (the last one for NULL)."""
        pos = np.minimum(np.searchsorted(step_values, values), max(len(step_values) - 1, 0))
        found = (values != NULL) & (len(step_values) > 0)
        found[found] = step_values[pos[found]] == values[found]
        return np.where(found, pos, len(step_values))

    codes, distinct = pd.factorize(step, sort=True)  # step_rows of the few distinct steps, not of every event
    key = step_rows(np.asarray(distinct, dtype=np.int64))[codes] * n_stages + attribution.stage
    groups = len(labels) * n_stages

    def total(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(key[mask], weights=weights, minlength=groups).astype(np.int64)

    gpu_key = np.repeat(step_rows(gpu.step), n_stages) * n_stages + np.tile(np.arange(n_stages), len(gpu.step))
    host_rows = host[host["scope"] != "total"]
    frame = pd.DataFrame(
        {
            "scope": "step",
            "step": np.repeat(labels, n_stages),
            "stage": stage_categorical(np.tile(np.arange(n_stages), len(labels))),
            "host_wall_ns": host_rows["host_wall_ns"].to_numpy(),
            "host_op_ns": total(op, links.self_ns[op]),
            "gpu_time_ns": total(activity, dur[activity]),
            "gpu_busy_ns": np.bincount(gpu_key, weights=gpu.busy, minlength=groups).astype(np.int64),
            "gpu_overlap_ns": np.bincount(gpu_key, weights=gpu.overlap, minlength=groups).astype(np.int64),
            "gpu_idle_ns": np.bincount(gpu_key, weights=gpu.idle, minlength=groups).astype(np.int64),
            "kernel_count": total(kernel),
            "gpu_activity_count": total(activity),
            "launch_count": total(launcher),
            "memcpy_bytes": total(memcpy, memcpy_bytes),
        }
    )
    values = [c for c in frame.columns if c not in ("scope", "step", "stage")]
    present = (np.bincount(key, minlength=groups) > 0) | (frame[values].to_numpy() != 0).any(axis=1)
    totals = frame.groupby("stage", observed=False, sort=True)[values].sum().reset_index()
    totals.insert(0, "step", NULL)
    totals.insert(0, "scope", "total")
    totals["host_wall_ns"] = host.loc[host["scope"] == "total", "host_wall_ns"].to_numpy()
    frame = frame[present | (frame["step"] != NULL).to_numpy()]
    summary = pd.concat([frame, totals[frame.columns]], ignore_index=True)
    for column in values:
        summary[column] = summary[column].astype(np.int64)
    summary.loc[(summary["scope"] == "step") & (summary["step"] == NULL), "scope"] = "outside_steps"
    return summary.reset_index(drop=True)
