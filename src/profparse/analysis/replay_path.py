"""The critical path of the replayed steps: what bounds each steady step once the profiler's cost is taken out.

The replay (:mod:`profparse.analysis.replay`) keeps, for each GPU activity, the cause that bound its start (its
launch, its stream, or the activity it waited for) and, for each blocking call, whether the host resumed when its
activity ended. Each step's path is walked back from the step's end in replayed time: from the later of the host's
end and the step's last GPU activity; an activity is preceded by its binding cause (the gap after its launch's
return counts as ``launch``, after another activity as ``gpu_idle``); the host runs back to the last call that
waited for the GPU (its time after that activity's end is ``sync_wait``), and that activity precedes it. Host time
is labelled as the critical path labels it (:func:`~profparse.analysis.critical_path.host_bound_codes` of the
innermost event), with its replayed length. The segments tile each step's time in the loop
(``replay.step_ns``), so the bounds add up to the step without the profiler.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis import replay as rp
from profparse.analysis.critical_path import BOUND_CODE, BOUNDS, blocking_calls, host_bound_codes, kernel_bound_codes
from profparse.stages.attribute import Attribution
from profparse.trace.kinds import KIND_CODE
from profparse.trace.link import Links

#: host pieces between two kept running sums of the replayed path (:class:`_Walk`): a lookup sums on at most this
#: many from the one before it, and the walk looks up twice per blocking call on the path (tens of thousands on a
#: trace of many small allocations); the sums kept take len(BOUNDS) * 8 / _EVERY bytes per piece
_EVERY = 1 << 8
#: pieces summed at once while the kept sums are made
_SPAN = 1 << 16
_LAUNCH, _IDLE, _SYNC, _PYTHON = (BOUND_CODE[b] for b in ("launch", "gpu_idle", "sync_wait", "python"))


def host_labels(events: pd.DataFrame, links: Links, attribution: Attribution, model: rp.Model) -> np.ndarray:
    """Each host piece's bound code: its innermost event's (the covering event that started last, on the main or
    the autograd thread), as the critical path labels a host piece."""
    knots = model.host.knots
    rows = model.host_rows[events["kind"].cat.codes.to_numpy()[model.host_rows] != KIND_CODE["memory"]]
    ts = events["ts_ns"].to_numpy()[rows] - model.base
    end = ts + events["dur_ns"].to_numpy()[rows]
    # by start, an outer event before the inner one it holds: by the whole span, then the tree's depth (events of
    # one span nest as the tree says; cut at the last knot first, an event that holds the step's end tied with the
    # step and the file's order chose)
    order = np.lexsort((links.depth[rows], -end, ts))
    first = np.searchsorted(knots, ts[order], side="left")
    del ts  # each temporary given back as soon as it is read: this is the replayed path's peak on a big trace
    last = np.searchsorted(knots, np.minimum(end[order], knots[-1]), side="left")
    del end
    rows = rows[order]
    del order
    inner = np.full(max(len(knots) - 1, 0), -1, dtype=np.int64)
    for at in range(0, len(rows), rp.BLOCK):  # as Python numbers a block at a time (all at once, at the peak)
        block = slice(at, at + rp.BLOCK)
        for row, a, b in zip(rows[block].tolist(), first[block].tolist(), last[block].tolist(), strict=True):
            inner[a:b] = row  # a later start overwrites: the innermost event wins
    del rows, first, last  # not held under the labels' own temporaries
    blocking, _ = blocking_calls(events, links)
    return host_bound_codes(events, attribution, inner, blocking)


class _Walk:
    """The replayed path's bookkeeping for one replay: ns per bound code, and what the walk looks up."""

    def __init__(self, model: rp.Model, run: rp.Run, labels: np.ndarray, gpu_bound: np.ndarray) -> None:
        self.model, self.run, self.gpu_bound = model, run, gpu_bound
        self.ns = np.zeros(len(BOUNDS))
        knots = model.host.knots
        self.knots = knots
        length = np.diff(run.h_knots)
        self.labels, self.length = labels, length
        # the running sum of replayed host time per bound code is kept only every _EVERY pieces (a full array of
        # them per code was the peak of summarize on a big trace) and summed on from there when asked for
        self.codes = np.arange(len(BOUNDS))[:, None]
        self.every = self._kept_sums()
        self.at_knots = np.empty(len(knots))  # replayed host time at each knot, a span at a time (its temporaries)
        for at in range(0, len(knots), _SPAN):
            self.at_knots[at : at + _SPAN] = run.host_time(model, knots[at : at + _SPAN])
        calls = model.calls
        waited = np.flatnonzero(run.call_waited) if len(run.call_waited) else np.zeros(0, dtype=np.int64)
        self.waited, self.waited_end = waited.tolist(), calls.end[waited].tolist()

    def add(self, code: int, a: float, b: float) -> None:
        if b > a:
            self.ns[code] += b - a

    def _kept_sums(self) -> np.ndarray:
        """The running sum per bound code before piece ``k * _EVERY``, for each ``k``: one running sum over every
        piece, made :data:`_SPAN` pieces at a time (the same additions in the same order as :meth:`_summed_on`)."""
        n = len(self.length)
        every = np.zeros((len(BOUNDS), n // _EVERY + 1))
        running = np.zeros((len(BOUNDS), 1))
        for at in range(0, n, _SPAN):  # _SPAN is a multiple of _EVERY: ``at`` is a kept piece
            piece = slice(at, min(at + _SPAN, n))
            masked = np.where(self.labels[piece] == self.codes, self.length[piece], 0.0)
            sums = np.cumsum(np.concatenate([running, masked], axis=1), axis=1)  # column j: before piece at + j
            kept = np.arange(at // _EVERY, piece.stop // _EVERY + 1)
            every[:, kept] = sums[:, kept * _EVERY - at]
            running = sums[:, -1:]
        return every

    def _summed_on(self, k: int, i: int) -> np.ndarray:
        """Replayed host length per bound code before piece ``i``, summed on from checkpoint ``k`` (piece
        ``k * _EVERY``) one piece after the other, as one running sum over every piece adds them."""
        piece = slice(k * _EVERY, i)
        masked = np.where(self.labels[piece] == self.codes, self.length[piece], 0.0)
        return np.cumsum(np.concatenate([self.every[:, k : k + 1], masked], axis=1), axis=1)[:, -1]

    def _cum(self, i: int) -> np.ndarray:
        """Replayed host length per bound code before piece ``i``."""
        return self._summed_on(i // _EVERY, i)

    def _upto(self, t: float) -> np.ndarray:
        """Replayed host length per bound code from the first knot to trace time ``t``."""
        i = int(np.clip(np.searchsorted(self.knots, t, side="right") - 1, 0, len(self.length) - 1))
        out = self._cum(max(i, 0))  # (i is -1 only without a piece: every sum is 0)
        width = self.knots[i + 1] - self.knots[i]
        if width > 0:
            out[self.labels[i]] += self.length[i] * min(max((t - self.knots[i]) / width, 0.0), 1.0)
        return out

    def host(self, t: float, cur: float, lo: float) -> tuple[int, float] | None:
        """The host from trace time ``t`` (replayed ``cur``) back to the last call that waited for the GPU, or to
        ``lo``: its time by label; then (the activity that call waited for, its end), or None (the step's start)."""
        k = bisect_right(self.waited_end, t) - 1
        x = self.waited_end[k] if k >= 0 else -np.inf
        rx = float(self.run.host_time(self.model, np.array([x]))[0]) if k >= 0 else -np.inf
        floor = max(rx, lo)
        u = max(x, float(np.interp(floor, self.at_knots, self.knots)))  # trace time of the floor
        split = np.maximum(self._upto(t) - self._upto(u), 0.0)
        whole = float(split.sum())
        if whole > 0:
            self.ns += split * max(cur - floor, 0.0) / whole
        else:
            self.add(_PYTHON, floor, cur)
        if rx <= lo:
            return None
        c = self.waited[k]
        target = int(self.model.calls.target[c])
        end = float(self.run.ends[target]) if target >= 0 else float(self.model.calls.fixed[c])
        self.add(_SYNC, max(end, lo), rx)  # the call's time after the activity it waited for ended
        return (target, end) if target >= 0 and end > lo else None

    def gpu(self, g: int, cur: float, lo: float, kind: np.ndarray) -> tuple[str, int, float] | None:
        """Activity ``g`` and the gap before it; then where the path goes: ("host", trace time, replayed time)
        or ("gpu", activity, its end); None at the step's start."""
        gpu, run = self.model.gpu, self.run
        start = float(run.starts[g])
        self.add(int(kind[g]), max(start, lo), cur)
        if start <= lo:
            return None
        cause = int(run.cause[g])
        if cause == 0:
            ret = float(run.host_time(self.model, np.array([gpu.ref[g]]))[0])
            self.add(_LAUNCH, max(ret, lo), start)
            return ("host", float(gpu.ref[g]), ret) if ret > lo else None
        before = int(gpu.prev[g] if cause == 1 else gpu.wait[g])
        end = float(run.ends[before]) if before >= 0 else lo
        self.add(_IDLE, max(end, lo), start)
        return ("gpu", before, end) if before >= 0 and end > lo else None


def bound_ns(
    events: pd.DataFrame, links: Links, attribution: Attribution, model: rp.Model, per_event_ns: np.ndarray
) -> pd.DataFrame:
    """Per steady step, ns on the replayed critical path by bound (columns :data:`BOUNDS`), replayed with
    ``per_event_ns`` taken out; each row adds up to the step's ``step_ns`` in :func:`~replay.replay`."""
    run = rp.run(model, per_event_ns)
    frame = run.frame
    walk = _Walk(model, run, host_labels(events, links, attribution, model), frame["gpu_bound"].to_numpy())
    kind = kernel_bound_codes(events, model.gpu.rows)
    out = np.zeros((len(frame), len(BOUNDS)))
    s1 = model.steps["end_ns"].to_numpy() - model.base
    for i in range(len(frame)):
        walk.ns[:] = 0.0
        lo, cur = float(frame["from_ns"].iloc[i]), float(frame["done_ns"].iloc[i])
        mine = np.flatnonzero(model.step_of_gpu == i)
        at: tuple[str, Any, float] | None
        if walk.gpu_bound[i] and len(mine):
            last = int(mine[np.argmax(run.ends[mine])])
            at = ("gpu", last, float(run.ends[last]))
        else:
            at = ("host", float(s1[i]), cur)
        while at is not None:
            where, what, cur = at
            if where == "gpu":
                at = walk.gpu(int(what), cur, lo, kind)
            else:
                found = walk.host(float(what), cur, lo)
                at = None if found is None else ("gpu", found[0], found[1])
        out[i] = walk.ns
    return pd.DataFrame(out, columns=list(BOUNDS)).assign(step=frame["step"].to_numpy())
