"""The critical path of each step: the chain of work that bounds the step's length, and what bounds each part.

The dependency graph is built as a forest of *nodes*, each with at most one predecessor (the work whose end let it
start), so that the longest path to a point is the chain of predecessors back from it:

- **host nodes**: each host thread's time cut at every event start and end; a node is one piece, labelled by the
  innermost event active in it (none: the thread runs untraced code). Its predecessor is the piece before it on
  its thread.
- **GPU nodes**: each kernel, memcpy or memset, preceded by a *gap node* from the end of whatever let it start to
  its start: its launch's end when the stream was idle at launch (the gap is launch latency), else the previous
  activity on its stream (stream order), or an activity on another stream of its device that ended just before it
  while neither explained its start (an event wait between streams, ``cudaStreamWaitEvent``).
- **synchronisation**: a blocking call (``cuda``/``hip`` ``Device``/``Stream``/``Event`` ``Synchronize``, a
  runtime call inside ``aten::item`` / ``_local_scalar_dense``, a runtime call that outlasts its own memcpy, and,
  in a trace without ``cuda_sync`` events, a long runtime call that ends when GPU work ends) waits for the last GPU
  activity that ended inside it: the host piece from that end on has that activity as its predecessor.
- **threads joined**: the autograd engine's thread starts from the main thread at the first backward event of a
  step, and the main thread, waiting, resumes from the autograd thread's last one.

Each step's path is the predecessor chain from the main thread's piece at the step's end, cut where a node
crosses the step's start; pointer doubling walks every chain at once (``log2(nodes)`` numpy passes, no loop per
event). Each segment is clipped to the next one's start, so that the segments tile the step window exactly.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.base.arrays import grouped
from profparse.base.marks import STAGES
from profparse.stages.attribute import STEP_NAME, Attribution
from profparse.stages.rules import COLLECTIVE_KERNEL
from profparse.trace.budget import release_memory
from profparse.trace.kinds import KIND_CODE, NULL
from profparse.trace.link import Links, kind_mask, name_mask

BOUNDS: tuple[str, ...] = (
    "python",
    "cpu_op",
    "launch",
    "gpu_compute",
    "gpu_comm",
    "memcpy",
    "sync_wait",
    "data",
    "gpu_idle",
)
BOUND_CODE = {b: i for i, b in enumerate(BOUNDS)}
COLUMNS = ("step", "stage", "bound", "start_ns", "end_ns", "trace_index", "name")
#: runtime calls that block the host until GPU work is done (a free waits for the device), whatever else the
#: trace records
BLOCKING_CALL = re.compile(
    r"^(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchronize|^(cuda|hip)(Memcpy|Free|FreeHost)$|^cuMemcpyDtoH"
)
#: ops whose runtime calls wait for the GPU (a scalar read back to the host)
BLOCKING_OP = re.compile(r"^aten::(item|_local_scalar_dense)$")
#: inferred blocking call (no ``cuda_sync`` events): it waited this long at least and returned this soon after
INFER_MIN_WAIT_NS = 10_000
INFER_MAX_RETURN_NS = 20_000
#: an activity on another stream that ended this close before a kernel's unexplained start is what it waited for
STREAM_WAIT_NS = 20_000
_HOST_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "other")
_DATA_RULE = "other.data"
IDLE_HOST = "(untraced host time)"
IDLE_GPU = "(GPU idle)"


@dataclass
class Nodes:
    """The dependency forest: node ``i`` covers ``[start[i], end[i]]`` and waits for ``pred[i]`` (-1: none)."""

    start: np.ndarray
    end: np.ndarray
    pred: np.ndarray
    row: np.ndarray  # the event it belongs to (-1: none)
    bound: np.ndarray  # int8 code into BOUNDS
    gpu: np.ndarray  # bool: the node is on a GPU stream
    stage_row: np.ndarray  # the event whose stage it takes (-1: none)


@dataclass
class HostPieces:
    """Every host thread's time cut at event boundaries: piece ``i`` is ``[time[i], time[i + 1]]`` of its thread
    (the last boundary of each thread starts no piece); ``inner`` is the innermost event in it (-1: none)."""

    inner: np.ndarray
    key: np.ndarray  # (thread, time) packed on one line, sorted: searchsorted finds a thread's piece at a time
    base: int
    span: int

    @property
    def thread(self) -> np.ndarray:
        """Each piece's thread (unpacked from the key when asked: not held beside it)."""
        return self.key // self.span

    @property
    def time(self) -> np.ndarray:
        """Each piece's start."""
        return self.key % self.span + self.base

    def containing(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The piece of ``thread`` that holds the instant just before ``t`` (the piece that ends at ``t`` when
        ``t`` is a boundary); -1 where ``t`` is at or before the thread's first boundary (the piece just before
        would be the thread before's)."""
        first = thread.astype(np.int64) * self.span
        at = np.searchsorted(self.key, first + (t - self.base), side="left") - 1
        at[self.key[np.maximum(at, 0)] < first] = -1
        return at

    def starting(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The piece of ``thread`` that holds ``t`` (the piece that starts at ``t`` when ``t`` is a boundary)."""
        return np.searchsorted(self.key, thread.astype(np.int64) * self.span + (t - self.base), side="right") - 1


def _host_rows(events: pd.DataFrame, links: Links) -> np.ndarray:
    """Host events with a length: what cuts a thread's time into pieces."""
    return np.flatnonzero(links.host & kind_mask(events, _HOST_KINDS) & (events["dur_ns"].to_numpy() > 0))


def _extent(*times: np.ndarray) -> tuple[int, int]:
    """One before the earliest and one after the latest of ``times`` (0, 1 when there are none): the line on which
    (group, time) pairs are packed as ``group * span + (time - lo)``, which stays small enough for an int64."""
    present = [t for t in times if len(t)]
    if not present:
        return 0, 1
    return min(int(t.min()) for t in present) - 1, max(int(t.max()) for t in present) + 1


def _first_of_runs(sorted_group: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.concatenate([[True], sorted_group[1:] != sorted_group[:-1]]))


def host_pieces(
    events: pd.DataFrame, links: Links, rows: np.ndarray, cut_thread: np.ndarray, cut_time: np.ndarray
) -> HostPieces:
    """Cut each host thread at its events' starts and ends and at the extra ``cut`` points; label each piece with
    the innermost event in it: the deepest event starting at its start, else the parent of the shallowest event
    ending there, else (an extra cut) the previous piece's. The points are packed (thread, time) keys only; what
    each one is (a start, an end, a cut, a thread's first or last) follows from its position before sorting, so no
    column per point is built (the temporaries of a 300 MB trace stay ~60 MiB)."""
    start = events["ts_ns"].to_numpy()[rows]
    dur = events["dur_ns"].to_numpy()[rows]
    threads = np.arange(len(links.threads), dtype=np.int64)
    lo, hi = _extent(start, start + dur if len(rows) else start, cut_time)
    n, c, t = len(rows), len(cut_time), len(threads)
    span = hi - lo + 1
    key = np.empty(2 * n + c + 2 * t, dtype=np.int64)  # filled in place: no temporary per part
    starts, ends = key[:n], key[n : 2 * n]
    starts[:] = links.thread[rows]
    starts *= span
    starts += start
    starts -= lo
    del start
    np.add(starts, dur, out=ends)
    del dur
    key[2 * n : 2 * n + c] = cut_thread.astype(np.int64) * span + (cut_time - lo)
    key[2 * n + c : 2 * n + c + t] = threads * span
    key[2 * n + c + t :] = threads * span + (hi - lo)
    narrow = np.int32 if max(len(key), len(events)) < 2**31 else np.int64  # point and row numbers
    order = np.argsort(key, kind="stable").astype(narrow)
    key.sort(kind="stable")  # in place: no third array of points; timsort: the points come nearly in order
    first = _first_of_runs(key).astype(narrow)
    key = key[first]
    release_memory()
    is_start = order < n
    is_end = (order >= n) & (order < 2 * n)
    opens = np.logical_or.reduceat((order >= 2 * n + c) & (order < 2 * n + c + t), first)
    np.subtract(order, n, out=order, where=is_end)  # in place: a start's or an end's position in rows
    np.minimum(order, max(n - 1, 0), out=order)
    point_row = np.take(rows.astype(narrow), order, out=order, mode="clip") if n else np.zeros_like(order)
    del order
    depth = links.depth
    deepest_start = _extreme_row(first, point_row, is_start, depth, deepest=True)
    del is_start
    shallowest_end = _extreme_row(first, point_row, is_end, depth, deepest=False)
    del point_row, is_end
    del first
    known = (deepest_start >= 0) | (shallowest_end >= 0) | opens
    inner = deepest_start  # in place: else the parent of the shallowest event ending there, else none
    by_end = (inner < 0) & (shallowest_end >= 0)
    inner[by_end] = links.parent[shallowest_end[by_end]]
    del shallowest_end, by_end
    latest = np.arange(len(inner))
    latest[~known] = 0
    np.maximum.accumulate(latest, out=latest)  # an extra cut: the previous piece's label
    return HostPieces(inner[latest], key, lo, span)


def _extreme_row(first: np.ndarray, row: np.ndarray, has: np.ndarray, depth: np.ndarray, deepest: bool) -> np.ndarray:
    """Per boundary (its points start at ``first``), the row of greatest (``deepest``) or least depth among its
    points where ``has`` (-1: none): one reduction over (depth, row) packed in an int64, no sort."""
    packed = depth[row].astype(np.int64)
    packed <<= 32
    packed |= row
    none = -1 if deepest else np.iinfo(np.int64).max
    packed[~has] = none
    best = (np.maximum if deepest else np.minimum).reduceat(packed, first)
    del packed
    missing = best == none
    best &= 0xFFFFFFFF
    best[missing] = -1
    return best


@dataclass
class GpuWork:
    """GPU activity sorted by (device, stream, start), with what may have let each one start."""

    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    prev: np.ndarray  # position of the previous activity on its stream (-1: first)
    launch: np.ndarray  # row of its launching runtime call (-1: none)
    wait: np.ndarray  # position of the activity on another stream it waited for (-1: none)


def gpu_work(events: pd.DataFrame, links: Links) -> GpuWork:
    rows = np.flatnonzero(kind_mask(events, {"kernel", "gpu_memcpy", "gpu_memset"}))
    device = _device(events, rows)
    stream = events["stream"].to_numpy()[rows]
    ts = events["ts_ns"].to_numpy()
    order = np.lexsort((ts[rows], stream, device))
    rows, device, stream = rows[order], device[order], stream[order]
    start = ts[rows]
    end = start + events["dur_ns"].to_numpy()[rows]
    same = np.concatenate([[False], (device[1:] == device[:-1]) & (stream[1:] == stream[:-1])])
    prev = np.where(same, np.arange(len(rows)) - 1, -1)
    launch = links.launch[rows].astype(np.int64)
    work = GpuWork(rows, start, end, prev, launch, np.full(len(rows), -1, dtype=np.int64))
    if _has_recorded_waits(events, "Stream Wait Event"):
        work.wait = _recorded_stream_waits(work, device, stream, events)
    elif _has_stream_waits(events):
        work.wait = _stream_waits(work, device, stream, events)
    return work


def _device(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    device = events["device"].to_numpy()[rows]
    return np.where(device == NULL, events["pid"].to_numpy()[rows], device)


def _has_stream_waits(events: pd.DataFrame) -> bool:
    names = events["name"].cat.categories
    return any("StreamWaitEvent" in str(n) or str(n) == "Stream Wait Event" for n in names)


def _ends(work: GpuWork, events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """When each activity's launch (at the latest, its start) and its stream predecessor ended (int64 min:
    nothing)."""
    call_end = events["ts_ns"].to_numpy() + events["dur_ns"].to_numpy()
    # an activity may start before its call returns (a memcpy often does): the call let it start by then
    launch_end = np.where(work.launch >= 0, np.minimum(call_end[np.maximum(work.launch, 0)], work.start), NULL)
    prev_end = np.where(work.prev >= 0, work.end[np.maximum(work.prev, 0)], NULL)
    return launch_end, prev_end


def _stream_waits(work: GpuWork, device: np.ndarray, stream: np.ndarray, events: pd.DataFrame) -> np.ndarray:
    """For each activity whose start neither its launch nor its stream explains, the activity on another stream of
    its device that ended last before it, within :data:`STREAM_WAIT_NS` (what an event wait held it for)."""
    launch_end, prev_end = _ends(work, events)
    wait = np.full(len(work.rows), -1, dtype=np.int64)
    if not len(work.rows):
        return wait
    codes, _ = pd.factorize(device)
    lo = int(min(work.start.min(), work.end.min())) - 1
    span = int(max(work.start.max(), work.end.max())) - lo + 1
    key = codes.astype(np.int64) * span + (work.end - lo)
    by_end = np.argsort(key, kind="stable")
    j = np.searchsorted(key[by_end], codes.astype(np.int64) * span + (work.start - lo), side="right") - 1
    cand = by_end[np.maximum(j, 0)]
    ok = (j >= 0) & (codes[cand] == codes) & (stream[cand] != stream)
    ok &= (work.end[cand] > np.maximum(launch_end, prev_end)) & (work.start - work.end[cand] <= STREAM_WAIT_NS)
    wait[ok] = cand[ok]
    return wait


def _has_recorded_waits(events: pd.DataFrame, name: str) -> bool:
    """The trace's ``cuda_sync`` events called ``name`` say which stream they wait on (newer Kineto's
    ``wait_on_stream``)."""
    return bool(len(_recorded_waits(events, name)))


def _recorded_waits(events: pd.DataFrame, name: str) -> np.ndarray:
    """Rows of the ``cuda_sync`` events called ``name`` that name the stream they wait on."""
    if "wait_on_stream" not in events.columns:
        return np.zeros(0, dtype=np.int64)
    named = kind_mask(events, {"cuda_sync"}) & name_mask(events, re.compile(f"^{name}$"))
    on = events["wait_on_stream"].to_numpy()
    return np.flatnonzero(named & (on != NULL) & (on >= 0) & (events["correlation"].to_numpy() != NULL))


def _record_correlation(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The correlation of the ``cudaEventRecord`` each wait waits for (NULL: not recorded)."""
    if "wait_on_event_correlation" not in events.columns:
        return np.full(len(rows), NULL, dtype=np.int64)
    corr = events["wait_on_event_correlation"].to_numpy()[rows]
    return np.where(corr >= 0, corr, NULL)


@dataclass
class StreamOrder:
    """GPU activity sorted by (device, stream, correlation): which activity a stream ran before or after a call."""

    rows: np.ndarray
    key: np.ndarray
    codes: pd.Index
    base: int
    span: int

    @classmethod
    def of(cls, events: pd.DataFrame, rows: np.ndarray) -> StreamOrder:
        pairs = pd.MultiIndex.from_arrays([_device(events, rows), events["stream"].to_numpy()[rows]])
        codes, uniques = pd.factorize(pairs)
        corr = events["correlation"].to_numpy()[rows]
        lo, hi = _extent(corr)
        key = codes.astype(np.int64) * (hi - lo + 1) + (corr - lo)
        order = np.argsort(key, kind="stable")
        return cls(rows[order], key[order], pd.Index(uniques), lo, hi - lo + 1)

    def find(self, device: np.ndarray, stream: np.ndarray, corr: np.ndarray, after: bool) -> np.ndarray:
        """Per query, the position (in ``rows``) of the last activity on (device, stream) launched before ``corr``
        or (``after``) the first launched after it; -1: none."""
        wanted = self.codes.get_indexer(pd.MultiIndex.from_arrays([device, stream]))
        query = wanted.astype(np.int64) * self.span + (np.clip(corr, self.base, self.base + self.span - 1) - self.base)
        j = np.searchsorted(self.key, query, side="right") if after else np.searchsorted(self.key, query) - 1
        at = np.clip(j, 0, max(len(self.key) - 1, 0))
        ok = (wanted >= 0) & (j >= 0) & (j < len(self.key)) & (corr != NULL)
        if len(self.key):
            ok &= self.key[at] // self.span == wanted
        return np.where(ok, at, -1)


def _recorded_stream_waits(work: GpuWork, device: np.ndarray, stream: np.ndarray, events: pd.DataFrame) -> np.ndarray:
    """The activities that ``Stream Wait Event`` args join (not timing): the first activity launched on the
    waiting stream after the wait call waits for the last one launched on ``wait_on_stream`` before the
    ``cudaEventRecord`` it names (before the wait call when the record is not named), when that one ended after
    the activity's launch and its stream predecessor."""
    wait = np.full(len(work.rows), -1, dtype=np.int64)
    calls = _recorded_waits(events, "Stream Wait Event")
    if not len(work.rows) or not len(calls):
        return wait
    order = StreamOrder.of(events, work.rows)
    position = np.full(len(events), -1, dtype=np.int64)
    position[work.rows] = np.arange(len(work.rows))
    call_device = _device(events, calls)
    corr = events["correlation"].to_numpy()[calls]
    record = _record_correlation(events, calls)
    waiter = order.find(call_device, events["stream"].to_numpy()[calls], corr, after=True)
    waited = order.find(call_device, events["wait_on_stream"].to_numpy()[calls], np.where(record != NULL, record, corr),
                        after=False)  # fmt: skip
    ok = (waiter >= 0) & (waited >= 0)
    i, k = position[order.rows[waiter[ok]]], position[order.rows[waited[ok]]]
    launch_end, prev_end = _ends(work, events)
    explains = work.end[k] > np.maximum(launch_end[i], prev_end[i])
    wait[i[explains]] = k[explains]
    return wait


def blocking_calls(events: pd.DataFrame, links: Links) -> tuple[np.ndarray, np.ndarray]:
    """Runtime calls that block the host until GPU work is done, and which were inferred from timing alone.

    Known: a synchronize call, a runtime call of ``aten::item`` / ``_local_scalar_dense``, a call matched by a
    ``cuda_sync`` event (other than a stream's wait), a call that returned after its own memcpy ended. In a trace
    without ``cuda_sync`` events also any runtime call that waited :data:`INFER_MIN_WAIT_NS` for GPU work and
    returned within :data:`INFER_MAX_RETURN_NS` of its end. Returns (boolean per row: blocking, inferred).
    Worked out once per event table (kept in ``links.memo`` as row numbers)."""
    known = links.memo.get("blocking_calls")
    if known is None or known[0]() is not events:
        known = (weakref.ref(events), *(np.flatnonzero(mask) for mask in _blocking_calls(events, links)))
        links.memo["blocking_calls"] = known
    out = np.zeros((2, len(events)), dtype=bool)
    out[0, known[1]] = True
    out[1, known[2]] = True
    return out[0], out[1]


def _blocking_calls(events: pd.DataFrame, links: Links) -> tuple[np.ndarray, np.ndarray]:
    """:func:`blocking_calls` worked out."""
    # what a blocking call can be is worked out on the runtime calls alone: arrays of every event (times, ends,
    # int64 copies of the links) were at the peak of parse on a big trace
    runtime = np.flatnonzero(kind_mask(events, {"cuda_runtime", "cuda_driver"}) & links.host)
    named = name_mask(events, BLOCKING_CALL)[runtime]
    op = links.enclosing_op[runtime].astype(np.int64)
    named |= (op >= 0) & name_mask(events, BLOCKING_OP)[np.maximum(op, 0)]
    del op
    corr = events["correlation"].to_numpy()
    sync = kind_mask(events, {"cuda_sync"})
    if sync.any():
        waits = sync & name_mask(events, re.compile(r"Stream Wait Event"))
        named |= np.isin(corr[runtime], corr[sync & ~waits]) & (corr[runtime] != NULL)
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    activity = np.flatnonzero(kind_mask(events, {"gpu_memcpy"}) & (links.launch >= 0))
    launch = links.launch[activity].astype(np.int64)
    end = ts[activity] + dur[activity]
    returned_after = np.zeros(len(events), dtype=bool)  # a call that returned after its own memcpy ended
    returned_after[launch[(end <= ts[launch] + dur[launch]) & (end > ts[launch])]] = True
    named |= returned_after[runtime]
    del activity, launch, end, returned_after
    blocking = np.zeros(len(events), dtype=bool)
    blocking[runtime[named]] = True
    inferred = np.zeros(len(events), dtype=bool)
    if not sync.any():
        calls = runtime[~named]
        start, stop = ts[calls], ts[calls] + dur[calls]
        done = _last_gpu_end(events, start, stop)
        inferred[calls] = (done >= start + INFER_MIN_WAIT_NS) & (stop - done <= INFER_MAX_RETURN_NS)
    return blocking | inferred, inferred


def _gpu_ends(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """GPU activity rows sorted by end, and their ends."""
    rows = np.flatnonzero(kind_mask(events, {"kernel", "gpu_memcpy", "gpu_memset"}))
    end = events["ts_ns"].to_numpy()[rows] + events["dur_ns"].to_numpy()[rows]
    order = np.argsort(end, kind="stable")
    return rows[order], end[order]


def _last_gpu_end(events: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The last end of GPU activity inside each ``(start, end]`` (int64 min: none)."""
    _, ends = _gpu_ends(events)
    if not len(ends):  # runtime calls and no GPU activity (a trace cut short before its kernels)
        return np.full(len(end), NULL, dtype=np.int64)
    j = np.searchsorted(ends, end, side="right") - 1
    found = np.where(j >= 0, ends[np.maximum(j, 0)], NULL)
    return np.where(found > start, found, NULL)


def sync_waits(events: pd.DataFrame, links: Links, blocking: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each blocking call the GPU activity it waited for: the last one to end inside the call, on the stream a
    ``Stream Sync`` event names for it, else on any stream. Returns (call rows, activity rows)."""
    calls = np.flatnonzero(blocking)
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    rows, ends = _gpu_ends(events)
    if not len(rows):
        return calls[:0], rows
    call_end = ts[calls] + dur[calls]
    j = np.searchsorted(ends, call_end, side="right") - 1
    found = np.where(j >= 0, rows[np.maximum(j, 0)], -1)
    stream = _synced_stream(events, calls)
    named = stream != NULL
    if named.any():
        found[named] = _last_on_stream(events, rows, ends, stream[named], call_end[named])
    if _has_recorded_waits(events, "Event Sync"):
        found = _recorded_event_waits(events, calls, found)
    ok = found >= 0
    ok[ok] = ts[found[ok]] + dur[found[ok]] > ts[calls[ok]]
    return calls[ok], found[ok]


def _same_correlation(events: pd.DataFrame, syncs: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Per call, the row of ``syncs`` with its correlation (-1: none)."""
    corr = events["correlation"].to_numpy()
    if not len(syncs) or not len(calls):
        return np.full(len(calls), -1, dtype=np.int64)
    order = np.argsort(corr[syncs], kind="stable")
    keys = corr[syncs][order]
    at = np.minimum(np.searchsorted(keys, corr[calls]), len(keys) - 1)
    return np.where(keys[at] == corr[calls], syncs[order][at], -1)


def _recorded_event_waits(events: pd.DataFrame, calls: np.ndarray, found: np.ndarray) -> np.ndarray:
    """``found`` where an ``Event Sync`` names what its call waited for: the last activity launched on its
    ``wait_on_stream`` before the ``cudaEventRecord`` it names, when that one ended inside the call (a newer
    Kineto's args; the timing guess stays for the other calls)."""
    sync = _same_correlation(events, _recorded_waits(events, "Event Sync"), calls)
    record = np.where(sync >= 0, _record_correlation(events, np.maximum(sync, 0)), NULL)
    has = np.flatnonzero(record != NULL)
    if not len(has):
        return found
    rows = np.flatnonzero(kind_mask(events, {"kernel", "gpu_memcpy", "gpu_memset"}))
    order = StreamOrder.of(events, rows)
    waited_stream = events["wait_on_stream"].to_numpy()[sync[has]]
    at = order.find(_device(events, sync[has]), waited_stream, record[has], after=False)
    target = np.where(at >= 0, order.rows[np.maximum(at, 0)], -1)
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    call = calls[has]
    inside = (target >= 0) & (end[np.maximum(target, 0)] > ts[call]) & (end[np.maximum(target, 0)] <= end[call])
    out = found.copy()
    out[has[inside]] = target[inside]
    return out


def _synced_stream(events: pd.DataFrame, calls: np.ndarray) -> np.ndarray:
    """The stream each call synchronises, from its ``Stream Sync`` event (same correlation), else the
    ``wait_on_stream`` of its ``Event Sync`` (newer Kineto); NULL: unknown."""
    out = _synced_stream_of(events, calls)
    sync = _same_correlation(events, _recorded_waits(events, "Event Sync"), calls)
    use = (out == NULL) & (sync >= 0)
    out[use] = events["wait_on_stream"].to_numpy()[sync[use]] if use.any() else out[use]
    return out


def _synced_stream_of(events: pd.DataFrame, calls: np.ndarray) -> np.ndarray:
    """The stream each call synchronises, from its ``Stream Sync`` event (same correlation); NULL: unknown."""
    out = np.full(len(calls), NULL, dtype=np.int64)
    syncs = np.flatnonzero(kind_mask(events, {"cuda_sync"}) & name_mask(events, re.compile(r"^Stream Sync$")))
    corr = events["correlation"].to_numpy()
    syncs = syncs[(corr[syncs] != NULL) & (events["stream"].to_numpy()[syncs] != NULL)]
    if not len(syncs) or not len(calls):
        return out
    order = np.argsort(corr[syncs], kind="stable")
    keys, streams = corr[syncs][order], events["stream"].to_numpy()[syncs][order]
    at = np.minimum(np.searchsorted(keys, corr[calls]), len(keys) - 1)
    hit = keys[at] == corr[calls]
    out[hit] = streams[at[hit]]
    return out


def _last_on_stream(
    events: pd.DataFrame, rows: np.ndarray, ends: np.ndarray, stream: np.ndarray, until: np.ndarray
) -> np.ndarray:
    """Per query, the GPU activity (of ``rows``, sorted by ``ends``) on ``stream`` that ends last by ``until``
    (-1: none)."""
    codes, uniques = pd.factorize(events["stream"].to_numpy()[rows])
    lo, hi = _extent(ends, until)
    span = hi - lo + 1
    key = codes.astype(np.int64) * span + (ends - lo)
    order = np.argsort(key, kind="stable")
    wanted = pd.Index(uniques).get_indexer(stream)
    j = np.searchsorted(key[order], wanted.astype(np.int64) * span + (until - lo), side="right") - 1
    found = order[np.maximum(j, 0)]
    ok = (wanted >= 0) & (j >= 0) & (codes[found] == wanted)
    return np.where(ok, rows[found], -1)


def thread_joins(events: pd.DataFrame, links: Links, attribution: Attribution, rows: np.ndarray) -> pd.DataFrame:
    """Per (helper thread, step): when the thread's backward work starts and ends. The main thread hands the step
    to it at the start and waits for it to the end (the autograd engine's thread)."""
    stage = attribution.stage[rows]
    step = attribution.step[rows]
    thread = links.thread[rows].astype(np.int64)
    keep = (stage == STAGES.index("backward")) & (step != NULL) & (thread != attribution.main_thread)
    keep &= attribution.main_thread >= 0
    ts = events["ts_ns"].to_numpy()[rows][keep]
    end = ts + events["dur_ns"].to_numpy()[rows][keep]
    return grouped(
        {"thread": thread[keep], "step": step[keep]}, {"first": (ts, "min"), "last": (end, "max")}, sort=False
    )


def kernel_bound_codes(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    kind = events["kind"].cat.codes.to_numpy()[rows]
    comm = name_mask(events, COLLECTIVE_KERNEL)[rows]
    bound = np.full(len(rows), BOUND_CODE["gpu_compute"], dtype=np.int8)
    bound[kind == KIND_CODE["gpu_memcpy"]] = BOUND_CODE["memcpy"]
    bound[comm & (kind == KIND_CODE["kernel"])] = BOUND_CODE["gpu_comm"]
    return bound


def host_bound_codes(
    events: pd.DataFrame, attribution: Attribution, inner: np.ndarray, blocking: np.ndarray
) -> np.ndarray:
    row = np.maximum(inner, 0)
    kind = events["kind"].cat.codes.to_numpy()[row]
    bound = np.full(len(inner), BOUND_CODE["python"], dtype=np.int8)
    bound[kind == KIND_CODE["cpu_op"]] = BOUND_CODE["cpu_op"]
    bound[(kind == KIND_CODE["cuda_runtime"]) | (kind == KIND_CODE["cuda_driver"])] = BOUND_CODE["launch"]
    del kind
    data_rules = np.array([name.startswith(_DATA_RULE) for name in attribution.rule_names], dtype=bool)
    rule = attribution.rule[row]
    bound[(rule >= 0) & data_rules[np.maximum(rule, 0)]] = BOUND_CODE["data"]
    del rule
    bound[blocking[row]] = BOUND_CODE["sync_wait"]
    bound[inner < 0] = BOUND_CODE["python"]
    return bound


def _gpu_nodes(events: pd.DataFrame, links: Links, work: GpuWork, pieces: HostPieces, nh: int) -> Nodes:
    """Gap node ``nh + 2i`` then activity node ``nh + 2i + 1`` per activity ``i``: the gap runs from the end of
    what let the activity start (its launch, its stream predecessor, or the activity it waited for) to its start."""
    launch_end, prev_end = _ends(work, events)
    wait_end = np.where(work.wait >= 0, work.end[np.maximum(work.wait, 0)], NULL)
    cause = np.maximum(np.maximum(launch_end, prev_end), wait_end)
    by_launch = (launch_end == cause) & (launch_end > prev_end) & (launch_end > wait_end) & (work.launch >= 0)
    launch = np.maximum(work.launch, 0)
    launch_piece = pieces.containing(links.thread[launch].astype(np.int64), launch_end)
    gap_pred = np.full(len(work.rows), -1, dtype=np.int64)
    by_prev = (work.prev >= 0) & (prev_end == cause)
    gap_pred[by_prev] = nh + 2 * work.prev[by_prev] + 1
    by_wait = (work.wait >= 0) & (wait_end == cause) & ~by_prev
    gap_pred[by_wait] = nh + 2 * work.wait[by_wait] + 1
    gap_pred[by_launch] = launch_piece[by_launch]
    gap_start = np.where(cause == NULL, work.start, np.minimum(cause, work.start))
    k = len(work.rows)
    start = np.empty(2 * k, dtype=np.int64)
    end = np.empty(2 * k, dtype=np.int64)
    start[0::2], end[0::2], start[1::2], end[1::2] = gap_start, work.start, work.start, np.maximum(work.end, work.start)
    pred = np.empty(2 * k, dtype=np.int64)
    pred[0::2], pred[1::2] = gap_pred, nh + 2 * np.arange(k)
    row = np.empty(2 * k, dtype=np.int64)
    row[0::2], row[1::2] = np.where(by_launch, work.launch, -1), work.rows
    bound = np.empty(2 * k, dtype=np.int8)
    bound[0::2] = np.where(by_launch, BOUND_CODE["launch"], BOUND_CODE["gpu_idle"])
    bound[1::2] = kernel_bound_codes(events, work.rows)
    stage_row = np.repeat(work.rows, 2)
    return Nodes(start, end, pred, row, bound, np.ones(2 * k, dtype=bool), stage_row)


@dataclass
class Graph:
    """The nodes, the host pieces they start with, and how many blocking calls were inferred from timing."""

    nodes: Nodes
    pieces: HostPieces
    inferred: int


def dependency_graph(events: pd.DataFrame, links: Links, attribution: Attribution) -> Graph:
    """Host pieces, GPU activity and their gaps, with every edge: thread order, launches, stream order, stream
    waits, synchronisation and thread joins."""
    rows = _host_rows(events, links)
    blocking, inferred = blocking_calls(events, links)
    calls, targets = sync_waits(events, links, blocking)
    joins = thread_joins(events, links, attribution, rows)
    target_end = events["ts_ns"].to_numpy()[targets] + events["dur_ns"].to_numpy()[targets]
    main = np.full(len(joins), attribution.main_thread, dtype=np.int64)
    first, last = joins["first"].to_numpy(), joins["last"].to_numpy()
    cut_thread = np.concatenate([links.thread[calls].astype(np.int64), main, main])
    cut_time = np.concatenate([target_end, first, last])
    release_memory()  # the edges' temporaries: freed memory glibc keeps would add to the pieces' peak
    pieces = host_pieces(events, links, rows, cut_thread, cut_time)
    del rows, cut_thread, cut_time
    release_memory()
    host = _host_nodes(events, attribution, pieces, blocking)
    del blocking
    release_memory()
    nh = len(host.start)
    work = gpu_work(events, links)
    gpu = _gpu_nodes(events, links, work, pieces, nh)
    position = np.full(len(events), -1, dtype=np.int64)
    position[work.rows] = np.arange(len(work.rows))
    target_position = position[targets]
    del position, work
    release_memory()
    waiting = pieces.starting(links.thread[calls].astype(np.int64), target_end)
    host.pred[waiting] = nh + 2 * target_position + 1
    helper = joins["thread"].to_numpy()
    host.pred[pieces.starting(helper, first)] = pieces.containing(main, first)
    resume = pieces.starting(main, last)
    kind = events["kind"].cat.codes.to_numpy()
    waits = pieces.inner[pieces.containing(main, last)]
    busy = (waits >= 0) & np.isin(kind[np.maximum(waits, 0)], [KIND_CODE[k] for k in ("cpu_op", "cuda_runtime")])
    host.pred[resume[~busy]] = pieces.containing(helper, last)[~busy]
    nodes = _joined(host, gpu)
    _drop_bad_edges(nodes, attribution.steps["start_ns"].to_numpy())
    return Graph(nodes, pieces, int(inferred.sum()))


#: fields of :class:`Nodes` that hold node or event numbers (int32 once joined, while both stay under 2**31)
_INDEX_FIELDS = ("pred", "row", "stage_row")


def _fits_int32(parts: list[np.ndarray]) -> bool:
    limit = np.iinfo(np.int32).max
    return all(not len(p) or int(p.max()) <= limit for p in parts)


def _joined(host: Nodes, gpu: Nodes) -> Nodes:
    """Host nodes then GPU nodes, one field at a time, each part let go once copied (only one field is held
    twice at once)."""
    fields = {}
    for name in Nodes.__dataclass_fields__:
        parts = [getattr(host, name), getattr(gpu, name)]
        narrow = np.int32 if name in _INDEX_FIELDS and _fits_int32(parts) else None  # int32 halves them
        fields[name] = np.concatenate(parts, dtype=narrow)
        del parts
        setattr(host, name, None)
        setattr(gpu, name, None)
        release_memory()  # the parts just let go, before the next field is made
    return Nodes(**fields)


def _host_nodes(events: pd.DataFrame, attribution: Attribution, pieces: HostPieces, blocking: np.ndarray) -> Nodes:
    n = len(pieces.key)
    bound = host_bound_codes(events, attribution, pieces.inner, blocking)  # first: its temporaries come before the rest
    thread = pieces.thread
    same_next = np.concatenate([thread[1:] == thread[:-1], [False]])
    del thread
    start = pieces.time
    end = start.copy()
    end[:-1][same_next[:-1]] = start[1:][same_next[:-1]]
    pred = np.arange(-1, n - 1, dtype=np.int64)
    pred[1:][~same_next[:-1]] = -1
    if n:
        pred[0] = -1
    return Nodes(start, end, pred, pieces.inner, bound, np.zeros(n, dtype=bool), pieces.inner)


#: nodes checked at once for bad edges: the checks' temporaries stay a few MiB whatever the trace's size
EDGE_BLOCK = 1 << 18


def _drop_bad_edges(nodes: Nodes, step_starts: np.ndarray) -> None:
    """No edge unless its predecessor comes first in (start, end, node number), which keeps the forest acyclic
    whatever the clocks say; no edge into a node that holds a step's start (a step's path ends there). A node's
    verdict reads only its own edge, so the nodes are checked in blocks of :data:`EDGE_BLOCK`."""
    starts = np.sort(step_starts)
    for lo in range(0, len(nodes.pred), EDGE_BLOCK):
        _drop_bad_edges_in(nodes, starts, lo, min(lo + EDGE_BLOCK, len(nodes.pred)))


def _drop_bad_edges_in(nodes: Nodes, starts: np.ndarray, lo: int, hi: int) -> None:
    pred = nodes.pred[lo:hi]  # a view: edges are dropped in place
    index = np.arange(lo, hi)
    i = np.flatnonzero((pred >= 0) & ((pred != index - 1) | nodes.gpu[lo:hi]))  # a thread's pieces come in order
    p = pred[i]
    s, e, ps, pe = nodes.start[lo + i], nodes.end[lo + i], nodes.start[p], nodes.end[p]
    before = (ps < s) | ((ps == s) & ((pe < e) | ((pe == e) & (p < lo + i))))
    pred[i[~before]] = -1
    start, end = nodes.start[lo:hi], nodes.end[lo:hi]
    j = np.searchsorted(starts, start, side="left")
    crosses = (j < len(starts)) & (starts[np.minimum(j, len(starts) - 1)] < end)
    pred[crosses] = -1


def chains(pred: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The predecessor chain of each head, every chain at once. Most edges go to the node just before (a thread's
    previous piece, a stream's previous activity): a *run* is a stretch of such edges, and a chain is a list of
    runs, each entered at some node and left at the run's first node. Pointer doubling over the runs (``log2``
    numpy passes over runs, not nodes) lists each chain's runs; the nodes follow by ranges. Returns (members,
    head position of each member), each chain from its head back to its root; a head of -1 has no chain."""
    if (heads < 0).any():
        held = np.flatnonzero(heads >= 0)
        members, owner = chains(pred, heads[held])
        return members, held[owner]
    n = len(pred)
    opens = pred < 0  # node 0 without a predecessor opens a run too
    opens[1:] |= pred[1:] != np.arange(n - 1)
    run_of = np.cumsum(opens) - 1  # the run each node lies in
    firsts = np.flatnonzero(opens)  # each run's first node
    exit_to = pred[firsts]  # where a chain goes on after a run (-1: it ends)
    next_run = np.where(exit_to >= 0, run_of[np.maximum(exit_to, 0)], -1)
    runs, owner, rank = _run_chains(next_run, run_of[heads])
    entry = np.where(rank == 0, heads[owner], exit_to[np.roll(runs, 1)])  # the node each run is entered at
    length = entry - firsts[runs] + 1
    member_owner = np.repeat(owner, length)
    step_back = np.arange(len(member_owner)) - np.repeat(np.cumsum(length) - length, length)
    return np.repeat(entry, length) - step_back, member_owner


def _run_chains(jump_to: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chain of each head in a forest given by ``jump_to`` (-1: root), by pointer doubling: (members, head
    position of each, position of each in its chain)."""
    r = len(jump_to)
    jump = np.where(jump_to >= 0, jump_to, np.arange(r))
    distance = (jump_to >= 0).astype(np.int64)
    while True:
        further = jump[jump]
        if np.array_equal(further, jump):
            break
        distance += distance[jump]
        jump = further
    length = distance[heads] + 1
    owner = np.repeat(np.arange(len(heads)), length)
    rank = np.arange(len(owner)) - np.repeat(np.cumsum(length) - length, length)
    members = heads[owner]
    jump = np.where(jump_to >= 0, jump_to, np.arange(r))
    bit = 0
    while (rank >> bit).any():
        move = ((rank >> bit) & 1).astype(bool)
        members[move] = jump[members[move]]
        jump = jump[jump]
        bit += 1
    return members, owner, rank


def path_table(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """One row per segment of each step's critical path: step, stage, bound, start_ns, end_ns, trace_index (of
    the event; NULL for idle time), name. The graph is let go as soon as the chains are walked: only what the
    table needs of the nodes on the path is kept (the peak of a 300 MB trace's ``parse`` stays under 1.5x its
    JSON)."""
    steps = attribution.steps
    main = attribution.main_thread
    if steps.empty or main < 0:
        return _frame(events, {c: np.zeros(0, dtype=np.int64) for c in COLUMNS})
    graph = dependency_graph(events, links, attribution)
    nodes = graph.nodes
    w0, w1 = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    # (-1: a step that ends where the main thread's time begins, a zero-length ProfilerStep#0 at the trace's start)
    heads = graph.pieces.containing(np.full(len(steps), main, dtype=np.int64), w1)
    del graph  # the host pieces
    release_memory()  # what the graph's building freed: glibc would keep it resident under what comes next
    chain = [*chains(nodes.pred, heads)]
    nodes.pred = nodes.end = None  # type: ignore[assignment]
    release_memory()
    k, node, s, e = _segments(nodes.start, chain, w0, w1)  # takes the chains: lets them go as it can
    nodes.start = None  # type: ignore[assignment]
    release_memory()
    on_path = _on_path(nodes, node)
    del nodes, node
    columns = _columns(events, attribution, on_path, steps, k, s, e)
    del on_path, k, s, e
    release_memory()
    return _frame(events, columns)


def _segments(
    start: np.ndarray, chain: list[np.ndarray], w0: np.ndarray, w1: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each step's chain (head first) tiled over its window, earliest first: each segment ends where the later one
    starts and the earliest is cut at the window's start; where a chain ran out of predecessors inside its window,
    a filler of idle time (node -1) from the window's start. Empty segments are dropped. Every chain at once: a
    running minimum over all of them, each shifted below the ones before so that the minimum starts afresh.
    ``chain``: [members, owner] from :func:`chains`, emptied here. Returns (step position, node, start, end)."""
    members, owner = chain
    chain.clear()
    bounds = np.searchsorted(owner, np.arange(len(w0) + 1))
    owner = owner.astype(np.int64, copy=False)
    seg_start = start[members]
    np.minimum(seg_start, w1[owner], out=seg_start)
    base = int(min(seg_start.min(), w0.min())) if len(seg_start) else 0
    shift = int(seg_start.max()) - base + 1 if len(seg_start) else 1
    seg_start -= base
    seg_start -= shift * owner
    np.minimum.accumulate(seg_start, out=seg_start)
    seg_start += shift * owner
    seg_start += base
    seg_end = np.empty_like(seg_start)
    seg_end[1:] = seg_start[:-1]
    present = np.flatnonzero(bounds[1:] > bounds[:-1])
    seg_end[bounds[present]] = w1[present]
    inside = seg_end > w0[owner]  # a prefix of each chain: the ends only fall along it
    np.maximum(seg_start, w0[owner], out=seg_start)
    count = np.bincount(owner[inside], minlength=len(w0))
    last = np.maximum(bounds[:-1] + count - 1, 0)
    filler = count > 0  # (a step with no segment reads no start: every chain may be empty)
    filler[filler] = seg_start[last[filler]] > w0[filler]
    inside &= seg_end > seg_start  # empty segments are dropped
    narrow = np.int32 if len(members) < 2**31 else np.int64  # segment positions
    at = np.flatnonzero(inside).astype(narrow)
    del inside
    kept = np.bincount(owner[at], minlength=len(w0))
    length = kept + filler
    out_first = np.cumsum(length) - length
    k_at = owner[at].astype(narrow)
    del owner
    # out_first + filler + kept - 1 - rank, in place: reversed, earliest first
    position = np.arange(len(at), dtype=np.int64)  # the rank of each in its chain, negated below
    position -= (np.cumsum(kept) - kept)[k_at]
    np.negative(position, out=position)
    position += out_first[k_at]
    position += filler[k_at]
    position += kept[k_at]
    position -= 1
    position = position.astype(narrow)
    del k_at
    release_memory()
    # each output made from one input, which is let go then: members, ends and starts are not all held at once
    node = np.full(int(length.sum()), -1, dtype=np.int64)
    node[position] = members[at]
    del members
    e = np.empty(len(node), dtype=np.int64)
    e[position] = seg_end[at]
    del seg_end
    e[out_first[filler]] = seg_start[last[filler]]
    s = np.empty(len(node), dtype=np.int64)
    s[position] = seg_start[at]
    del seg_start, at, position
    s[out_first[filler]] = w0[filler]
    return np.repeat(np.arange(len(w0), dtype=narrow), length), node, s, e


def _on_path(nodes: Nodes, node: np.ndarray) -> Nodes:
    """What the table needs of each segment's node (``node`` -1: idle time with no node: row and stage row -1,
    not on a GPU, bound unused); ``pred`` holds whether a node is there. Each field of ``nodes`` is let go once
    gathered."""
    has = node >= 0
    at = np.maximum(node, 0)
    none = np.zeros(0, dtype=np.int64)
    picked = {}
    for name, missing in (("row", -1), ("bound", 0), ("gpu", False), ("stage_row", -1)):
        values = getattr(nodes, name)[at]
        setattr(nodes, name, None)
        values[~has] = missing
        picked[name] = values
    return Nodes(start=none, end=none, pred=has, **picked)


def _columns(
    events: pd.DataFrame,
    attribution: Attribution,
    on_path: Nodes,
    steps: pd.DataFrame,
    k: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
) -> dict[str, np.ndarray]:
    """The table's columns for segments (step position ``k``, the nodes' fields ``on_path``, start, end; earliest
    first in each step). Idle time on a stream takes the stage of the activity after it; untraced host time outside
    every event (or inside the step range only) the stage of the segments on both sides when they agree, else
    ``other``."""
    # codes in their table's own widths (int8 stages and bounds, int32 names): int64 copies of every segment were
    # at the peak of parse on a trace with a long path
    has, row, stage_row, gpu = on_path.pred, on_path.row, on_path.stage_row, on_path.gpu
    stage = np.where(stage_row >= 0, attribution.stage[np.maximum(stage_row, 0)], -1).astype(np.int8)
    del stage_row
    # the step range's own time is code the profiler did not trace (Python between ops without stacks): like
    # time outside every event it takes the stage around it, not the range's ``other``
    stage[(row >= 0) & name_mask(events, STEP_NAME)[np.maximum(row, 0)]] = -1
    same_step = np.concatenate([k[1:] == k[:-1], [False]])
    next_gpu = np.where(same_step, np.roll(gpu, -1), False)
    filler_gpu = ~has & next_gpu  # a stream's chain ran out in the step: idle time of the activity after it
    del next_gpu
    stage[filler_gpu] = np.roll(stage, -1)[filler_gpu]
    prev_stage = np.where(np.roll(same_step, 1), np.roll(stage, 1), -1)
    between = (stage < 0) & (prev_stage == np.roll(stage, -1)) & same_step
    stage[between] = prev_stage[between]  # untraced host time between two segments of one stage: that stage
    del prev_stage, between, same_step
    stage[stage < 0] = STAGES.index("other")  # else other
    idle = np.where(filler_gpu, np.int8(BOUND_CODE["gpu_idle"]), np.int8(BOUND_CODE["python"]))
    bound = np.where(has, on_path.bound.astype(np.int8, copy=False), idle)
    del idle
    gpu |= filler_gpu
    known = len(events["name"].cat.categories)  # idle time is named by two codes after the trace's names
    name = np.where(gpu, np.int32(known + 1), np.int32(known))
    named = row >= 0
    name[named] = events["name"].cat.codes.to_numpy()[row[named]]
    del named
    trace_index = events["trace_index"].to_numpy()
    return {
        "step": steps["step"].to_numpy()[k],
        "stage": stage,
        "bound": bound,
        "start_ns": start,
        "end_ns": end,
        "trace_index": np.where(row >= 0, trace_index[np.maximum(row, 0)], NULL),
        "name": name,
    }


def _frame(events: pd.DataFrame, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """The table from its columns, which it takes (``columns`` is emptied: each is let go once it is in)."""
    names = pd.Index([*events["name"].cat.categories, IDLE_HOST, IDLE_GPU]).astype(object)
    name = columns.pop("name")
    used = np.bincount(name, minlength=len(names)) > 0  # only the names on the path
    code = (np.cumsum(used) - 1).astype(np.int32)
    coded = {
        "stage": pd.Categorical.from_codes(columns.pop("stage").astype(np.int8), categories=list(STAGES)),
        "bound": pd.Categorical.from_codes(columns.pop("bound").astype(np.int8), categories=list(BOUNDS)),
        "name": pd.Categorical.from_codes(code[name], categories=names[used]),
    }
    del name
    frame = pd.DataFrame({c: columns.pop(c).astype(np.int64, copy=False) for c in ("step", "start_ns", "end_ns")})
    frame.insert(1, "stage", coded.pop("stage"))
    frame.insert(2, "bound", coded.pop("bound"))
    frame["trace_index"] = columns.pop("trace_index").astype(np.int64, copy=False)
    frame["name"] = coded.pop("name")
    return frame
