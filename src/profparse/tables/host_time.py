"""Host time: the wall time each stage takes on the host, split into levels (op, Python, runtime, sync, wait).

Pieces of self time of the host spans (:func:`host_segments`) are cut at step boundaries; their union over threads
is the host wall (:func:`host_levels`), per (scope, step, stage) in :func:`host_time`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.base.intervals import group_running_max, group_start_order, line_union, on_one_line
from profparse.base.marks import STAGES
from profparse.stages.attribute import STEP_NAME, Attribution, step_window
from profparse.tables.scopes import by_scope
from profparse.trace.ancestors import ancestors_of, depth_order, innermost_ancestor_of_kind
from profparse.trace.budget import release_memory
from profparse.trace.kinds import KIND_CODE, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask, name_mask

HOST_SPAN_KINDS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"})


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
    (:func:`working_threads`), except ``ProfilerStep#N`` ranges (they mark the step, and need not nest with the
    Python frames: a loop frame that starts just after the first step's range begins holds the step's work, and
    ends after it) and ranges that hold several stages (``<module>``), whose own time belongs to no stage. Nested
    events partition their parent; pieces of events that cross instead of nesting are ended where the next piece of
    their thread starts (:func:`_end_at_next_piece`), so on one thread the pieces do not overlap.
    """
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    stage = attribution.stage
    tree = kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    rows = np.flatnonzero(tree)
    # nearest ancestor in the tree (other kinds, zero-length rows: skipped)
    parent = innermost_ancestor_of_kind(links.parent, links.depth, tree)[rows]
    counted = tree & ~mixed_containers(links.parent, links.depth, stage) & ~name_mask(events, STEP_NAME)
    counted &= working_threads(events, links, stage)[links.thread]
    level = _levels(events, links)

    # a parent's own time: the gaps before, between and after its children (sorted by start; the running maximum
    # of the children's ends covers siblings that overlap). Ends are taken per subset (ts + dur), not as a column
    # for every event.
    child = np.flatnonzero(parent >= 0)
    child = child[group_start_order(parent[child], ts[rows[child]])]  # one packed-key sort, not lexsort's two
    par = parent[child]  # event rows of the parents, one per child
    del parent
    child = rows[child]  # event rows of the children
    c_start = ts[child]
    reach = group_running_max(par, c_start + dur[child])
    del child
    first = np.concatenate([[True], par[1:] != par[:-1]])[: len(par)]
    last = np.concatenate([par[1:] != par[:-1], [True]])[: len(par)]
    before = ts[par]
    before[~first] = np.maximum(reach[np.flatnonzero(~first) - 1], before[~first])
    has_child = np.zeros(len(events), dtype=bool)
    has_child[par] = True
    leaf = rows[~has_child[rows]]
    del rows, has_child, first
    end_par = ts[par] + dur[par]
    tail = par[last]
    seg_owner = np.concatenate([par, tail, leaf])
    seg_start = np.concatenate([before, np.maximum(reach[last], ts[tail]), ts[leaf]])
    del before, reach, last
    seg_end = np.concatenate([np.minimum(c_start, end_par), ts[tail] + dur[tail], ts[leaf] + dur[leaf]])
    del par, c_start, end_par, tail, leaf
    release_memory()  # the freed temporaries above stay resident in the heap otherwise, under the pieces below
    keep = np.flatnonzero(counted[seg_owner] & (seg_end > seg_start))
    seg_owner, seg_start, seg_end = seg_owner[keep], seg_start[keep], seg_end[keep]
    _end_at_next_piece(links.thread[seg_owner], seg_start, seg_end)
    keep = np.flatnonzero(seg_end > seg_start)
    seg_owner, seg_start, seg_end = seg_owner[keep], seg_start[keep], seg_end[keep]
    del keep
    return _cut_at_steps(seg_owner, seg_start, seg_end, stage, level, attribution.steps)


def _end_at_next_piece(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
    """End each piece no later than the next piece of its thread starts (``end`` in place).

    Where events nest, pieces of own time partition a thread's time and nothing changes. An event that starts
    inside another and ends after it (``record_function.__enter__``'s frame around the range it opens, a loop
    frame that starts just after the first ``ProfilerStep`` range) would give the time they share twice: it goes
    to the piece that started last."""
    if len(start) < 2:
        return
    order = group_start_order(thread, start)
    th = thread[order]
    ends = end[order]
    next_start = start[order][1:]
    same = th[1:] == th[:-1]
    ends[:-1][same] = np.minimum(ends[:-1][same], next_start[same])
    end[order] = ends


def _levels(events: pd.DataFrame, links: Links) -> np.ndarray:
    """The :data:`HOST_LEVELS` code of every event's own time (int8)."""
    kind = events["kind"].cat.codes.to_numpy()
    level = np.full(len(events), _LEVEL["python"], dtype=np.int8)
    level[kind == KIND_CODE["cpu_op"]] = _LEVEL["op"]
    in_op = links.enclosing_op >= 0
    level[in_op & (kind != KIND_CODE["cpu_op"])] = _LEVEL["op_python"]
    runtime = kind_mask(events, RUNTIME_KINDS)
    level[runtime] = _LEVEL["runtime"]
    level[runtime & name_mask(events, SYNC_NAME)] = _LEVEL["sync"]
    python = kind == KIND_CODE["python_function"]
    waiting = python & ~in_op & name_mask(events, WAIT_FRAME)
    if waiting.any():  # a waiting frame with an op below it on its thread is running that work itself
        op_below = ancestors_of(links.parent, (kind == KIND_CODE["cpu_op"]) & links.host)
        level[waiting & ~op_below] = _LEVEL["wait"]
    return level


def _cut_at_steps(
    owner: np.ndarray, start: np.ndarray, end: np.ndarray, stage: np.ndarray, level: np.ndarray, steps: pd.DataFrame
) -> HostSegments:
    """Pieces cut at every step window boundary, each with the window it lies in.

    Few pieces cross a boundary: each keeps its part before the first cut it crosses, and its other parts are
    appended after all pieces (the order of pieces changes no union), so no array of the size of all pieces is
    made more than once."""
    if steps.empty or not len(start):
        window = step_window(start, steps)
    else:
        cuts = np.unique(np.concatenate([steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()]))
        lo = np.searchsorted(cuts, start, side="right")  # the first cut after each piece's start
        # a piece crosses a cut iff the first cut after its start lies before its end
        crosses = np.flatnonzero(cuts[np.minimum(lo, len(cuts) - 1)] < end)
        crosses = crosses[lo[crosses] < len(cuts)]
        if len(crosses):
            pieces = np.searchsorted(cuts, end[crosses], side="left") - lo[crosses] + 1
            idx = np.repeat(crosses, pieces - 1)  # the second and later parts of the pieces that cross
            k = np.arange(1, len(idx) + 1) - np.repeat(np.cumsum(pieces - 1) - (pieces - 1), pieces - 1)
            cut_lo = lo[idx] + k - 1  # the cut each later part starts at
            last = k == np.repeat(pieces, pieces - 1) - 1
            extra_end = np.where(last, end[idx], cuts[np.minimum(cut_lo + 1, len(cuts) - 1)])
            end[crosses] = cuts[lo[crosses]]  # the first part ends at the first cut
            owner = np.concatenate([owner, owner[idx]])
            start = np.concatenate([start, cuts[cut_lo]])
            end = np.concatenate([end, extra_end])
            lo = np.concatenate([lo, cut_lo + 1])
        # Window starts and ends are cuts, so every moment between two neighbouring cuts lies in the same window (or
        # none): a piece's window is its interval's, looked up in the few cuts instead of a searchsorted of every
        # piece against the windows (step_window).
        window = step_window(np.concatenate([[cuts[0] - 1], cuts]), steps)[lo]
    return HostSegments(start=start, end=end, stage=stage[owner], level=level[owner], step_index=window)


def host_levels(segments: HostSegments, key: np.ndarray, groups: int) -> dict[str, np.ndarray]:
    """Per group id: host wall (the union over threads of the pieces) and its split into :data:`HOST_LEVELS`.

    A moment covered by pieces of several levels counts for the highest-priority one: level ``i`` gets the union
    of levels ``0..i`` minus the union of levels ``0..i-1``. The levels add up to the wall exactly.

    ``segments`` is used up: its arrays are replaced by sorted ones that the passes overwrite (one copy of the
    pieces at a time, not one per step of the computation).
    """
    out: dict[str, np.ndarray] = {}
    below = np.zeros(groups, dtype=np.int64)
    order = group_start_order(key, segments.start) if len(key) else np.zeros(0, dtype=np.int64)
    key = key[order]
    segments.stage = segments.step_index = None  # not read here: what the caller no longer holds goes now
    segments.start = segments.start[order]  # one array at a time: each unsorted one goes as its sorted copy comes
    segments.end = segments.end[order]
    segments.level = segments.level[order]
    del order
    start, end, level = segments.start, segments.end, segments.level
    present = np.bincount(level, minlength=len(HOST_LEVELS)) > 0
    start, end = on_one_line(key, start, end, out=True)  # once for all levels, not once per pass
    heads = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if len(key) else np.zeros(0, np.int64)
    ids = key[heads]
    del key
    work_start, work_end = np.empty_like(start), np.empty_like(end)  # each pass's copies, reused
    for i, name in enumerate(HOST_LEVELS):
        if not present[i]:  # no piece of this level: the union up to it is the one before; skipping the pass saves
            out[name] = np.zeros(groups, dtype=np.int64)  # 2-3 of the 6 on traces without Python stacks
            continue
        covered = np.zeros(groups, dtype=np.int64)
        if len(heads):
            # Pieces of later levels become empty intervals at their own start, which change no union in a sweep
            # sorted by start: one sort and one set of group heads serve every level, each pass runs on the full
            # arrays without taking a subset of them (the subsets cost more than they saved).
            np.copyto(work_start, start)
            np.copyto(work_end, start)
            np.copyto(work_end, end, where=level <= i)
            covered[ids] = line_union(work_start, work_end, heads)
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
    # per window, not per piece; the last label (NULL) is outside every window (step_index -1)
    label_of_window = np.append(np.searchsorted(labels[:-1], numbers), len(labels) - 1)
    key = label_of_window[seg.step_index]
    seg.step_index = key  # not needed any more: let it go before host_levels sorts the pieces
    key *= n_stages
    key += seg.stage
    # Pieces are cut at every window boundary, so the windows (and "outside") split time into disjoint parts: the
    # total per stage (a union over the whole trace) is the sum of the per-window unions, exactly. Summing instead
    # of a second host_levels pass over all pieces saves a quarter of host_time.
    by_step = host_levels(seg, key, len(labels) * n_stages)
    del seg, key
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
    return by_scope(out)
