"""Replay of the steady steps: a discrete-event simulation over the critical path's dependency graph.

The graph is the critical path's (:mod:`profparse.analysis.critical_path`: GPU activity with its launch, stream
predecessor and cross-stream wait; blocking calls with the activity they wait for; the autograd thread's join),
here with every edge kept instead of only the one that bound each node:

- **host**: the main thread and the autograd engine's thread run as one timeline (the main thread waits while the
  autograd thread runs backward), cut at every event start and end; each piece keeps its length less the
  profiler's cost removed from it (:class:`Overhead`), so host time maps to a replayed host clock ``h(t)``;
- **GPU**: each activity starts at the latest of its launch's return + its launch latency, its stream being free
  (FIFO) + its scheduling gap, and the end of the activity on another stream it waited for; the delay that bound
  it in the trace is kept, the others are taken as at most a default (so that an unchanged replay is exact);
- **blocking calls** (synchronisations, blocking copies, scalar reads): the host resumes at the latest of its own
  time in the call and the replayed end of the activity it waited for, plus what the call took after that end.

Host time moves by an offset that changes only at blocking calls; all of it is numpy but one Python pass over
the GPU activities and blocking calls of the steady steps (tens of ms for 10^4 kernels): the ``replay`` table is
computed only when asked for (``summarize``, ``advise``), never by ``parse``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import islice

import numpy as np
import pandas as pd

from profparse.analysis.critical_path import blocking_calls, gpu_work, sync_waits, thread_joins
from profparse.base.intervals import union_pieces
from profparse.stages.attribute import Attribution
from profparse.trace.kinds import KIND_CODE
from profparse.trace.link import Links, kind_mask, name_mask

#: the event kinds the profiler's cost is counted by (docs/without_profiler.md)
OVERHEAD_KINDS: tuple[str, ...] = ("op_shapes", "op", "python", "runtime", "memory")
#: a launch-latency or stream gap that did not bind an activity in the trace is taken as at most this
LAUNCH_LATENCY_NS = 4_000
STREAM_GAP_NS = 1_000
#: pieces of the host timeline (or host events) that a replay's, a what-if's or the replayed path's temporaries hold
#: at once: arrays of every piece were at the peak of parse on a big trace
BLOCK = 1 << 16
_HOST_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
#: each host kind's overhead kind (a CPU op recorded with shapes is ``op_shapes``, see :func:`overhead_kind`)
_KIND_OVERHEAD = {
    "cpu_op": "op",
    "user_annotation": "op",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "memory": "memory",
}
#: the same by kind code (index into OVERHEAD_KINDS; -1: none), read by the kind's category code per row
_OVERHEAD_OF_CODE = np.full(len(KIND_CODE), -1, dtype=np.int64)
for _kind, _overhead in _KIND_OVERHEAD.items():
    _OVERHEAD_OF_CODE[KIND_CODE[_kind]] = OVERHEAD_KINDS.index(_overhead)
#: the runtime call whose traced duration tells how fast the host ran under the profiler (profiler_cost)
LAUNCH_CALL = "cudaLaunchKernel"


@dataclass
class Host:
    """The host timeline of the steady steps: ``knots`` (sorted times) cut it into pieces; ``cells`` (one row per
    charged event, grouped by overhead kind: ``cells[bounds[k]:bounds[k + 1]]`` are kind ``k``'s) names the four
    pieces each event charges a quarter of its cost to: those on both sides of its start and of its end, where
    the profiler's enter and exit work lies.

    Four piece numbers per event instead of a count per piece and kind: the dense counts were five float64 values
    for each of millions of pieces, the largest array at the peak of ``parse`` on a trace of many short events."""

    knots: np.ndarray  # float64 once the model is made relative to its base (:func:`_shifted`)
    cells: np.ndarray  # (events, 4) piece numbers
    bounds: np.ndarray  # len(OVERHEAD_KINDS) + 1 row offsets into ``cells``
    _cut: tuple[bytes, np.ndarray] | None = field(default=None, repr=False)

    def cut(self, per_event_ns: np.ndarray) -> np.ndarray:
        """The profiler's cost in each piece (ns): a quarter of ``per_event_ns`` of its kind for each event that
        charges it; kept for the last ``per_event_ns`` (a model is replayed many times at one cost)."""
        key = per_event_ns.tobytes()
        if self._cut is None or self._cut[0] != key:
            pieces = max(len(self.knots) - 1, 1)
            cut = np.zeros(pieces)
            for k, quarter in enumerate(per_event_ns * 0.25):
                rows = self.cells[self.bounds[k] : self.bounds[k + 1]]
                if len(rows) and quarter:
                    count = np.bincount(rows.ravel(), minlength=pieces).astype(np.int64, copy=False)
                    charged = count.view(np.float64)  # each count times the quarter, in the counts' own memory
                    for at in range(0, pieces, BLOCK):  # (a block at a time: numpy copies an input it overwrites)
                        np.multiply(count[at : at + BLOCK], quarter, out=charged[at : at + BLOCK])
                    cut += charged
                    del count, charged
            self._cut = (key, cut)
        return self._cut[1]

    def clock(self, per_event_ns: np.ndarray, removed: tuple[Removed, ...] | None = None) -> np.ndarray:
        """``h`` at each knot: the time elapsed from the first knot with each piece shortened by its events'
        cost (``per_event_ns`` per kind) and by the host time ``removed`` (their sum), never below zero."""
        # in the output's memory, a block at a time: a big trace has millions of pieces, and each temporary of the
        # plain expression was one more array of them at the peak of a replay
        cut = self.cut(per_event_ns)
        out = np.empty(len(self.knots))
        out[0] = 0.0
        length = out[1:]
        np.subtract(self.knots[1:], self.knots[:-1], out=length)
        for at in range(0, len(length), BLOCK):
            piece = slice(at, at + BLOCK)
            charged = cut[piece]
            if removed:
                extra = removed[0].per_piece(self.knots[at : at + BLOCK + 1])
                for more in removed[1:]:
                    extra += more.per_piece(self.knots[at : at + BLOCK + 1])
                charged = charged + extra
            np.subtract(length[piece], charged, out=length[piece])
        np.maximum(length, 0.0, out=length)
        np.cumsum(length, out=length)
        out += float(self.knots[0])
        return out


@dataclass
class Gpu:
    """GPU activity launched in the steady steps, in order of start: what may delay each one."""

    rows: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    ref: np.ndarray  # host time its launch let it start (its start when no launch is recorded)
    prev: np.ndarray  # position of its stream predecessor here (-1: none here)
    fixed_prev: np.ndarray  # the predecessor's end when it is not here (float; -inf: none)
    wait: np.ndarray  # position of the activity on another stream it waited for (-1: none here)
    fixed_wait: np.ndarray
    after_launch: np.ndarray  # delays after each cause (ns)
    after_prev: np.ndarray
    after_wait: np.ndarray


@dataclass
class Calls:
    """Blocking calls on the step's threads: start, end, the activity each waited for (position in Gpu; -1: one
    outside the steps, ended at ``fixed``), its own time (``own``), and the time it took after that end."""

    start: np.ndarray
    end: np.ndarray
    target: np.ndarray
    fixed: np.ndarray
    own: np.ndarray
    post: np.ndarray
    rows: np.ndarray  # the calls' event rows


@dataclass
class Model:
    """What a replay reads: the steady steps, their host timeline, GPU activity, blocking calls."""

    steps: pd.DataFrame
    host: Host
    gpu: Gpu
    calls: Calls
    step_of_gpu: np.ndarray  # the steady step (position) each activity was launched in
    kind_count: np.ndarray = field(default_factory=lambda: np.zeros(len(OVERHEAD_KINDS)))  # events per kind
    base: int = 0  # the trace time that time 0 of the model's arrays stands for
    host_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # the events charged
    launches: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the steps' kernel launches that did not block
    walks: list[int] | None = field(default=None, repr=False)  # activities walked before each call (_walks)
    #: per GPU activity, how many blocking calls ended by its launch (_calls_before)
    calls_before: array | None = field(default=None, repr=False)
    offset_at_call: list[int] | None = field(default=None, repr=False)  # per call, the offset it starts from
    #: the frame of a replay without a change, per cost vector: the replay table's critical path, its steps
    #: without the profiler and the findings' step before any fix are the same replay (a row per step each)
    unchanged: dict[bytes, pd.DataFrame] = field(default_factory=dict, repr=False)


def overhead_kind(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Each row's overhead kind (index into :data:`OVERHEAD_KINDS`; -1: none)."""
    codes = events["kind"].cat.codes.to_numpy()[rows]  # the kinds as text would be a string per row
    out = _OVERHEAD_OF_CODE[codes]
    if "input_dims" in events.columns:
        shapes = (codes == KIND_CODE["cpu_op"]) & events["input_dims"].notna().to_numpy()[rows]
        out[shapes] = OVERHEAD_KINDS.index("op_shapes")
    return out


def build(events: pd.DataFrame, links: Links, attribution: Attribution) -> Model | None:
    """The replay model of the steady steps (None: no steady step or no main thread)."""
    steps = attribution.steps
    steps = steps[steps["steady"]].reset_index(drop=True) if "steady" in steps else steps
    if steps.empty or attribution.main_thread < 0:
        return None
    w0, w1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    host_rows = np.flatnonzero(links.host & kind_mask(events, _HOST_KINDS))
    joins = thread_joins(events, links, attribution, host_rows)
    threads = np.unique(np.concatenate([[attribution.main_thread], joins["thread"].to_numpy()]))
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    # the host events first, then their threads and times: arrays of every event were at the peak of parse
    charged = np.flatnonzero(links.host & kind_mask(events, (*_HOST_KINDS, "memory")))
    at = ts[charged]
    charged = charged[np.isin(links.thread[charged].astype(np.int64), threads) & (at >= w0) & (at < w1)]
    del at
    kinds = overhead_kind(events, charged)
    start = ts[charged]
    host = _host(start, np.minimum(start + dur[charged], w1), kinds, w0, w1)
    del start
    gpu, step_of = _gpu(events, links, steps, w0, w1)
    calls = _calls(events, links, threads, gpu, w0, w1)
    count = np.bincount(kinds[kinds >= 0], minlength=len(OVERHEAD_KINDS)).astype(np.float64)
    launch_rows = charged[name_mask(events, f"^{LAUNCH_CALL}$")[charged]]
    launch_rows = launch_rows[~np.isin(launch_rows, calls.rows)]  # one that waited for the full queue is no probe
    launches = events["dur_ns"].to_numpy()[launch_rows]
    model = Model(steps, host, gpu, calls, step_of, count, host_rows=charged, launches=launches.astype(np.float64))
    return _shifted(model, w0)


def _shifted(model: Model, base: int) -> Model:
    """Every time less ``base`` (the first step's start), so that float64 keeps nanoseconds (trace clocks near
    2**60 ns would round to 256 ns)."""
    model.base = base
    # GPU activity and calls are made relative as they are built; as float64 once, since every replay
    # interpolates on the knots (np.interp would convert int64 knots on each call)
    model.host.knots = (model.host.knots - base).astype(np.float64)
    return model


def _host(start: np.ndarray, end: np.ndarray, kind: np.ndarray, w0: int, w1: int) -> Host:
    keep = kind >= 0
    start, end, kind = start[keep], end[keep], kind[keep]
    # sorted (timsort: starts and ends come nearly in order), then deduplicated: np.unique hashes, slower
    knots = np.sort(np.concatenate([[w0, w1], start, end]), kind="stable")
    knots = knots[np.concatenate([[True], knots[1:] != knots[:-1]])]
    pieces = max(len(knots) - 1, 1)
    by_kind = np.argsort(kind, kind="stable")
    start, end, kind = start[by_kind], end[by_kind], kind[by_kind]
    del by_kind
    bounds = np.searchsorted(kind, np.arange(len(OVERHEAD_KINDS) + 1))
    cells = np.empty((len(start), 4), dtype=np.int32 if pieces < 2**31 else np.int64)
    for i, point in enumerate((start, end)):
        right = np.searchsorted(knots, point, side="right") - 1  # the piece that starts at the point
        cells[:, 2 * i] = np.clip(right - 1, 0, pieces - 1)
        cells[:, 2 * i + 1] = np.clip(right, 0, pieces - 1)
        del right
    return Host(knots, cells, bounds)


def _gpu(events: pd.DataFrame, links: Links, steps: pd.DataFrame, w0: int, w1: int) -> tuple[Gpu, np.ndarray]:
    work = gpu_work(events, links)
    launch = np.maximum(work.launch, 0)
    call_end = events["ts_ns"].to_numpy()[launch] + events["dur_ns"].to_numpy()[launch]  # each launch's end
    # no launch recorded (a collective's kernel): it starts when the host, replayed, reaches its start
    when = np.where(work.launch >= 0, np.minimum(call_end, work.start), work.start)
    del launch, call_end
    inside = np.flatnonzero((when >= w0) & (when < w1))
    inside = inside[np.argsort(work.start[inside], kind="stable")]
    position = np.full(len(work.rows), -1, dtype=np.int64)
    position[inside] = np.arange(len(inside))
    prev, wait = work.prev[inside], work.wait[inside]
    # relative to the first step's start until :func:`_shifted` adds it back: float64 keeps ns near 0
    start, end = (work.start[inside] - w0).astype(np.float64), (work.end[inside] - w0).astype(np.float64)
    prev_end = np.where(prev >= 0, work.end[np.maximum(prev, 0)] - w0, -np.inf)
    wait_end = np.where(wait >= 0, work.end[np.maximum(wait, 0)] - w0, -np.inf)
    r = (when[inside] - w0).astype(np.float64)
    cause = np.maximum(np.maximum(r, prev_end), wait_end)
    gpu = Gpu(
        rows=work.rows[inside],
        start=start,
        dur=end - start,
        ref=(when[inside] - w0).astype(np.float64),
        prev=np.where(prev >= 0, position[np.maximum(prev, 0)], -1),
        fixed_prev=prev_end,
        wait=np.where(wait >= 0, position[np.maximum(wait, 0)], -1),
        fixed_wait=wait_end,
        after_launch=_delay(start, r, cause, LAUNCH_LATENCY_NS),
        after_prev=_delay(start, prev_end, cause, STREAM_GAP_NS),
        after_wait=_delay(start, wait_end, cause, STREAM_GAP_NS),
    )
    step_of = np.searchsorted(steps["start_ns"].to_numpy(), when[inside], side="right") - 1
    return gpu, np.clip(step_of, 0, len(steps) - 1)


def _delay(start: np.ndarray, cause: np.ndarray, binding: np.ndarray, default: int) -> np.ndarray:
    """The delay after a cause: as in the trace where it bound the start, else at most ``default`` (never more
    than the trace's, so that the unchanged replay starts every activity where it started)."""
    gap = np.where(np.isfinite(cause), start - cause, 0.0)
    return np.where(cause >= binding, gap, np.minimum(gap, default))


def _calls(events: pd.DataFrame, links: Links, threads: np.ndarray, gpu: Gpu, w0: int, w1: int) -> Calls:
    blocking, _ = blocking_calls(events, links)
    calls, targets = sync_waits(events, links, blocking)
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    keep = np.isin(links.thread[calls].astype(np.int64), threads) & (ts[calls] >= w0) & (ts[calls] < w1)
    calls, targets = calls[keep], targets[keep]
    order = np.argsort(ts[calls] + dur[calls], kind="stable")
    calls, targets = calls[order], targets[order]
    position = pd.Series(np.arange(len(gpu.rows)), index=gpu.rows)
    target = position.reindex(targets).fillna(-1).to_numpy().astype(np.int64)
    done = ts[targets] + dur[targets] - w0
    c0 = ts[calls] - w0  # relative to the first step's start: float64 keeps ns
    c1 = c0 + dur[calls]
    own = c1 - np.maximum(c0, np.minimum(done, c1))  # the call's time not waiting
    f = np.float64
    return Calls(c0.astype(f), c1.astype(f), target, done.astype(f), own.astype(f), (c1 - done).astype(f), calls)


@dataclass
class Removed:
    """Host time a what-if removes: ``share`` of the time its intervals (model time) cover, in each piece of the
    host timeline. Kept as the intervals' union, worked out per piece as a replay needs it: a what-if is a few
    hundred intervals, the pieces are millions, and every what-if is held while the findings replay them."""

    start: np.ndarray  # the union's sorted disjoint pieces
    end: np.ndarray
    share: float

    @classmethod
    def of(cls, intervals: np.ndarray, share: float) -> Removed:
        """``share`` of the union of ``intervals`` (n x 2: start, end)."""
        return cls(*union_pieces(intervals[:, 0], intervals[:, 1]), share)

    def per_piece(self, knots: np.ndarray) -> np.ndarray:
        """ns removed in each piece between ``knots`` (one fewer than them)."""
        # the union's length before a time is piecewise linear in it (slope 1 inside a piece, 0 between): one
        # np.interp over its corners, a quarter of the time of a search per knot (:func:`coverage`)
        if not len(self.start):
            return np.zeros(max(len(knots) - 1, 0))
        corners = np.empty(2 * len(self.start))
        corners[0::2], corners[1::2] = self.start, self.end
        before = np.concatenate([[0.0], np.cumsum(self.end - self.start)])
        covered = np.interp(knots, corners, np.repeat(before, 2)[1:-1], left=0.0, right=float(before[-1]))
        out = covered[1:] - covered[:-1]
        out *= self.share
        return out


@dataclass
class Change:
    """A what-if applied to the model before replaying: GPU durations scaled, host time removed (several fixes'
    added in their order), blocking calls that no longer wait, extra host cost per event kind removed."""

    gpu_scale: np.ndarray | None = None
    host_removed: tuple[Removed, ...] | None = None
    calls_dropped: np.ndarray | None = None


def mean_step(model: Model, per_event_ns: np.ndarray, change: Change | None = None) -> float:
    """The mean ``step_ns`` of :func:`replay` (with a change, from the step times alone: no frame per what-if)."""
    if change is None:
        return float(replay(model, per_event_ns)["step_ns"].mean())
    h_knots, ends, off_t, off_v, _ = _walked(model, per_event_ns, change, detail=False)
    return float(pd.Series(_step_columns(model, h_knots, ends, off_t, off_v)["step_ns"]).mean())


@dataclass
class Run:
    """One replay in detail (:func:`run`): the replayed host clock at the knots, each activity's replayed start,
    end and the cause that bound its start (0: its launch, 1: its stream, 2: the activity it waited for), whether
    each blocking call waited for its activity, the host offsets after the calls, and the per-step frame."""

    h_knots: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    cause: np.ndarray
    call_waited: np.ndarray
    off_t: np.ndarray  # as arrays once: the replayed path maps single times thousands of times per replay
    off_v: np.ndarray
    frame: pd.DataFrame

    def host_time(self, model: Model, t: np.ndarray) -> np.ndarray:
        """Replayed times of trace times ``t`` (relative to ``model.base``) on the host."""
        return _mapped(model, self.h_knots, self.off_t, self.off_v, np.asarray(t, dtype=np.float64))


def replay(model: Model, per_event_ns: np.ndarray, change: Change | None = None) -> pd.DataFrame:
    """Per steady step: replayed host start and end, the end of its GPU work, and its duration in a loop of
    steps (from the end of the step before, or from its start for the first: the later of its host end and its
    GPU work's end). ``per_event_ns``: the profiler's cost removed per event, by :data:`OVERHEAD_KINDS`."""
    known = model.unchanged.get(_cost_key(per_event_ns)) if change is None else None
    return known.copy() if known is not None else run(model, per_event_ns, change, detail=False).frame


def run(model: Model, per_event_ns: np.ndarray, change: Change | None = None, detail: bool = True) -> Run:
    """:func:`replay` with what the replayed critical path reads (``detail``; else only the frame)."""
    unchanged = change is None  # its frame is kept for :func:`replay`, which looks it up by the same test
    h_knots, ends, off_t, off_v, why = _walked(model, per_event_ns, change or Change(), detail)
    frame = pd.DataFrame(_step_columns(model, h_knots, ends, off_t, off_v))
    if unchanged:
        model.unchanged.setdefault(_cost_key(per_event_ns), frame.copy())
    return Run(h_knots, why[0], ends, why[1], why[2], off_t, off_v, frame)


def _cost_key(per_event_ns: np.ndarray) -> bytes:
    return np.asarray(per_event_ns, dtype=np.float64).tobytes()


def _walked(
    model: Model, per_event_ns: np.ndarray, change: Change, detail: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The replayed host clock at the knots, then :func:`_simulate`'s walk with ``change`` applied."""
    h_knots = model.host.clock(np.asarray(per_event_ns, dtype=np.float64), change.host_removed)
    gpu = model.gpu if change.gpu_scale is None else replace(model.gpu, dur=model.gpu.dur * change.gpu_scale)
    return (h_knots, *_simulate(model, h_knots, gpu, change.calls_dropped, detail))


def _step_columns(
    model: Model, h_knots: np.ndarray, ends: np.ndarray, off_t: np.ndarray, off_v: np.ndarray
) -> dict[str, np.ndarray]:
    """The columns of :func:`replay`'s frame, one value per steady step."""
    steps = model.steps
    s0, s1 = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    hs = _mapped(model, h_knots, off_t, off_v, (s0 - model.base).astype(np.float64))
    he = _mapped(model, h_knots, off_t, off_v, (s1 - model.base).astype(np.float64))
    gpu_end = np.full(len(steps), -np.inf)
    if len(ends):
        np.maximum.at(gpu_end, model.step_of_gpu, ends)
    done = np.maximum(he, gpu_end)
    backlog = model.gpu.fixed_prev[model.gpu.prev < 0]  # GPU work of the steps before, still running
    first = max(float(hs[0]), float(backlog.max()) if len(backlog) else -np.inf)
    previous = np.concatenate([[first], done[:-1]])
    return {
        "step": steps["step"].to_numpy(),
        "measured_ns": s1 - s0,
        "host_ns": he - hs,
        "step_ns": done - np.maximum(previous, hs),
        "gpu_end_after_host_ns": np.maximum(gpu_end - he, 0.0),
        "from_ns": np.maximum(previous, hs),  # replayed (model time): where the step's time in the loop starts
        "done_ns": done,
        "gpu_bound": gpu_end > he,
    }


def _mapped(model: Model, h_knots: np.ndarray, off_t: np.ndarray, off_v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Replayed host time of trace times ``t``: ``h(t)`` plus the offset of the last blocking call ended by then."""
    offset = off_v[np.searchsorted(off_t, t, side="right") - 1]
    offset += np.interp(t, model.host.knots, h_knots)  # in place: called on every knot of a big trace
    return offset


def _simulate(
    model: Model, h_knots: np.ndarray, gpu: Gpu, dropped: np.ndarray | None, detail: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One pass in trace order over GPU activities (by start) and blocking calls (by end): each activity's
    replayed end; the host offset after each call (times, values; the first entry: none yet); with ``detail``
    each activity's replayed start and binding cause, and whether each call waited for its activity."""
    calls = model.calls
    knots = model.host.knots
    ref_h = np.interp(gpu.ref.astype(np.float64), knots, h_knots)
    call_h0 = np.interp(calls.start, knots, h_knots)
    call_h1 = np.interp(calls.end, knots, h_knots)
    # the call's own time (after what it waited for) as the host clock replays it: the profiler's cost and the
    # host time a fix removes inside it are taken out of it as out of any host time (a free that unmaps memory
    # for 700 ms is host work, not a wait)
    own_h = call_h1 - np.interp(calls.end - calls.own, knots, h_knots)
    n = len(gpu.start)
    # each activity's numbers come in one tuple from a zip over standard-library arrays (indexing one gives a
    # Python number as a list does, but it holds 8 bytes per value, not a 32-byte object: ten lists of every
    # activity were at the peak of parse): a tenth of the indexing the loop did, 40% less time per replay.
    # An activity whose predecessor (or awaited activity) is not here reads its fixed end from a slot after the
    # activities (one per such activity): the loop indexes ``ends`` without a test per activity
    v = _values
    ends = array("d", bytes(8 * n))
    prev, fixed_prev = _slotted(gpu.prev, gpu.fixed_prev, len(ends))
    ends.extend(array("d", fixed_prev.tobytes()))
    columns = [range(n), v(ref_h), _calls_before(model), v(gpu.after_launch), v(prev), v(gpu.after_prev)]
    waits = bool((gpu.wait >= 0).any() or np.isfinite(gpu.fixed_wait).any())
    if waits:  # (most traces have no cross-stream wait: their walk leaves it out)
        wait, fixed_wait = _slotted(gpu.wait, gpu.fixed_wait, len(ends))
        ends.extend(array("d", fixed_wait.tobytes()))
        columns += [v(wait), v(gpu.after_wait)]
    activities = zip(*columns, v(gpu.dur), strict=True)
    off_v = [0.0]  # the host offset after each call (the first: none yet)
    drop = dropped.tolist() if dropped is not None else [False] * len(calls.start)
    own, target, fixed = own_h.tolist(), calls.target.tolist(), calls.fixed.tolist()
    post = (calls.post - (calls.own - own_h)).tolist()  # its tail after the wait: the same time, replayed
    h0, h1 = call_h0.tolist(), call_h1.tolist()
    starts, cause = np.empty(n if detail else 0), np.zeros(n if detail else 0, dtype=np.int8)
    waited = np.zeros(len(h0) if detail else 0, dtype=bool)
    walk = _walk_waits if waits else _walk_streams
    for c, (count, b) in enumerate(zip(_walks(model), _offset_at_call(model), strict=True)):
        if count:
            walk(islice(activities, count), ends, off_v, starts if detail else None, cause)
        if c == len(h0):  # the activities after the last call
            break
        own_end = h0[c] + off_v[b] + own[c]
        t = target[c]
        done = own_end if drop[c] else max(own_end, (ends[t] if t >= 0 else fixed[c]) + post[c])
        if detail:
            waited[c] = done > own_end
        off_v.append(done - h1[c])
    ends = np.frombuffer(ends, dtype=np.float64, count=n).copy()
    off_t = np.concatenate([[-np.inf], calls.end])  # offset i holds from the end of call i - 1
    return ends, off_t, np.asarray(off_v), (starts, cause, waited)


def _walk_waits(activities: Iterable, ends: array, off_v: list, starts: np.ndarray | None, cause: np.ndarray) -> None:
    """Replay activities in order (each starts at the latest of its launch, its stream predecessor's end and
    the end of the activity it waited for); with ``starts``, each one's start and the cause that bound it."""
    for item, r, b, a, p, ap, w, aw, d in activities:
        s = r + off_v[b] + a
        sp = ends[p] + ap
        sw = ends[w] + aw
        # max(s, sp, sw) without the call, compared as max compares
        top = sp if sp > s else s
        if sw > top:
            top = sw
        if starts is not None:
            starts[item] = top
            cause[item] = 0 if s >= (sw if sw > sp else sp) else (1 if sp >= sw else 2)
        ends[item] = top + d


def _walk_streams(activities: Iterable, ends: array, off_v: list, starts: np.ndarray | None, cause: np.ndarray) -> None:
    """:func:`_walk_waits` where no activity waits for another stream (most traces): a quarter less per activity."""
    for item, r, b, a, p, ap, d in activities:
        s = r + off_v[b] + a
        sp = ends[p] + ap
        top = sp if sp > s else s
        if starts is not None:
            starts[item] = top
            cause[item] = 0 if s >= sp else 1
        ends[item] = top + d


def _slotted(position: np.ndarray, fixed: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """``position`` with each -1 (not here) pointing at a slot from ``first`` on, and the slots' values (their
    ``fixed`` ends)."""
    outside = np.flatnonzero(position < 0)
    slotted = position.astype(np.int64, copy=True)
    slotted[outside] = first + np.arange(len(outside))
    return slotted, fixed[outside].astype(np.float64)


def _values(values: np.ndarray) -> array:
    """``values`` as a standard-library array of the same numbers (float64 or int64)."""
    if values.dtype.kind == "f":
        return array("d", values.astype(np.float64, copy=False).tobytes())
    return array("q", values.astype(np.int64, copy=False).tobytes())


def _calls_before(model: Model) -> array:
    """Per GPU activity, the blocking calls that ended by its launch's return: the host offset it starts from
    is the one after the last of them (``off_v`` in :func:`_simulate`). Every such call is walked before the
    activity (a call ends before ``ref`` <= the activity's start), and the calls are walked by end: so this is
    the count of all calls ending by then, made once per model."""
    if model.calls_before is None:
        model.calls_before = _values(np.searchsorted(model.calls.end, model.gpu.ref, side="right"))
    return model.calls_before


def _offset_at_call(model: Model) -> list[int]:
    """Per blocking call, the host offset it starts from: the one after the last call ended by its start (calls
    are walked by end, so the count of calls ending by then, never the call itself), made once per model; one
    more entry for the walk after the last call."""
    if model.offset_at_call is None:
        calls = model.calls
        at = np.searchsorted(calls.end, calls.start, side="right")
        model.offset_at_call = np.append(np.minimum(at, np.arange(len(at))), 0).tolist()
    return model.offset_at_call


def _walks(model: Model) -> list[int]:
    """How many GPU activities each replay of ``model`` walks before each blocking call, and after the last: the
    activities are walked by start and the calls by end (a call after what starts by then), made once per model;
    no change moves a start or an end."""
    if model.walks is None:
        gpu, calls = model.gpu, model.calls
        before = np.searchsorted(gpu.start, calls.end - 0.5, side="right")  # both sorted: by start, by end
        model.walks = np.diff(np.concatenate([[0], before, [len(gpu.start)]])).tolist()
    return model.walks
