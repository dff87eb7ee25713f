"""What every detector reads: the trace's rows, the steady steps, and the critical path by event.

The steps up to the first optimizer step are left out as warm-up (loading, the optimizer making its state, lazy
initialisation, allocator growth, the profiler starting), as long as a step is left; without optimizer steps,
the first of three or more: the ``steady`` column of the ``steps`` table
(:func:`profparse.stages.attribute.find_steps`), which a rank folder's ``late_rank`` counts by too.
A finding is about the steady steps a training run repeats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.stages.attribute import STEP_NAME
from profparse.trace.ancestors import (
    has_ancestor_in,
    innermost_ancestor_of_kind,
    nearest_flagged,
    outermost_ancestor_of_kind,
    through_launch,
)
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask, name_mask

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

_UNTRACED_IN_STEP = "(untraced code in the step)"  # path time of the step range itself: Python without ops
TOP_EVENTS = 5


def steady_rows(path: pd.DataFrame, steady: pd.Series) -> pd.DataFrame:
    """The path's segments of the ``steady`` steps. The warm-up steps come first, so those segments are usually
    one run of rows: then a view of them, not a copy (the path of a big trace has millions of segments)."""
    rows = np.flatnonzero(path["step"].isin(steady).to_numpy())
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return path.iloc[rows[0] : rows[-1] + 1].reset_index(drop=True)
    return path.iloc[rows].reset_index(drop=True)


#: path segments whose temporaries :meth:`AdviceContext.step_stage_sums` holds at once
_BLOCK = 1 << 18


@dataclass
class AdviceContext:
    """The parsed trace plus its steady steps and their critical path, read once for all detectors."""

    parsed: ParsedTrace
    steps: pd.DataFrame  # the steady steps: step, start_ns, end_ns
    path: pd.DataFrame  # critical-path segments of those steps, with ``ns``
    warm_up: list[int]  # steps left out
    _segment_rows: np.ndarray | None = None
    _step_stage: np.ndarray | None = None
    _in_steps: np.ndarray | None = None
    _step_ns: float | None = None

    @classmethod
    def of(cls, parsed: ParsedTrace) -> AdviceContext | None:
        steps = parsed.attribution.steps
        if steps.empty:
            return None
        warm_up = [int(s) for s in steps.loc[~steps["steady"], "step"]]  # see stages.attribute.find_steps
        steady = steps[steps["steady"]].reset_index(drop=True)
        path = steady_rows(parsed.table("critical_path"), steady["step"])
        path = path.assign(ns=path["end_ns"] - path["start_ns"])
        return cls(parsed, steady, path, warm_up)

    def release(self) -> None:
        """Drop the path and what was derived from it, and give the tables and values the detectors read back if a
        writer only lent them for the findings (:meth:`ParsedTrace.lend`): the what-ifs that follow read the trace
        and the replay model only."""
        from profparse.tables.registry import inputs_of

        self.path = self.path.iloc[:0].copy()  # a slice alone is a view: it would hold the whole path
        self._segment_rows = self._step_stage = self._in_steps = None
        for name in inputs_of("findings") - inputs_of("replay_model") - {"replay_model"}:
            self.parsed.done_with(name)

    # -- the trace ------------------------------------------------------------------------------------------------

    @property
    def events(self) -> pd.DataFrame:
        return self.parsed.raw.events

    @property
    def step_ns(self) -> float:
        """The mean duration of a steady step (read by every finding: worked out once)."""
        if self._step_ns is None:
            self._step_ns = float((self.steps["end_ns"] - self.steps["start_ns"]).mean())
        return self._step_ns

    @property
    def step_numbers(self) -> list[int]:
        return [int(s) for s in self.steps["step"]]

    def names(self, pattern: re.Pattern[str]) -> np.ndarray:
        """Boolean per row: does its name match ``pattern`` (``search``)? Tested once per distinct name."""
        return name_mask(self.events, pattern)

    def in_steps(self) -> np.ndarray:
        """Boolean per row: the event starts inside a steady step (read-only: made once, read by most detectors)."""
        if self._in_steps is None:
            self._in_steps = np.isin(self.parsed.attribution.step, self.steps["step"].to_numpy())
            self._in_steps.flags.writeable = False
        return self._in_steps

    def name_of(self, rows: np.ndarray) -> np.ndarray:
        """Names of rows (as objects), read through the name categories: no per-event string column."""
        names = self.events["name"]
        categories = np.asarray(names.cat.categories, dtype=object)
        return categories[names.cat.codes.to_numpy()[rows]]

    def stage_of(self, rows: np.ndarray) -> np.ndarray:
        """Stage names of rows."""
        from profparse.base.marks import STAGES

        return np.asarray(STAGES, dtype=object)[self.parsed.attribution.stage[rows]]

    # -- the tree -------------------------------------------------------------------------------------------------

    def under(self, flag: np.ndarray) -> np.ndarray:
        """Boolean per row: the row or one of its ancestors is flagged; GPU activity follows its launching call."""
        links = self.parsed.links
        return self._launched(flag | has_ancestor_in(links.parent, links.depth, flag))

    def owner(self, flag: np.ndarray) -> np.ndarray:
        """Per row: the outermost flagged row at or above it (-1 if none); GPU activity follows its launching call."""
        links = self.parsed.links
        outer = outermost_ancestor_of_kind(links.parent, links.depth, flag).astype(np.int64)
        return self._launched(np.where(outer >= 0, outer, np.where(flag, np.arange(len(flag)), -1)))

    def below(self, rows: np.ndarray, flag: np.ndarray) -> np.ndarray:
        """Per row of ``rows``: its ancestor (or itself) whose parent is flagged, -1 if none (or if the row is
        flagged itself). Walks up from those rows only."""
        parent = self.parsed.links.parent
        child_of_flagged = (parent >= 0) & flag[np.maximum(parent, 0)]
        out = nearest_flagged(parent, rows, child_of_flagged)
        out[(rows >= 0) & flag[np.maximum(rows, 0)]] = -1
        return out

    def innermost(self, flag: np.ndarray) -> np.ndarray:
        """Per row: the nearest flagged row at or above it (-1 if none); GPU activity follows its launching call."""
        links = self.parsed.links
        inner = innermost_ancestor_of_kind(links.parent, links.depth, flag).astype(np.int64)
        return self._launched(np.where(flag, np.arange(len(flag)), inner))

    def _launched(self, values: np.ndarray) -> np.ndarray:
        return through_launch(values, self.parsed.links.launch, kind_mask(self.events, GPU_ACTIVITY_KINDS))

    # -- the path -------------------------------------------------------------------------------------------------

    def segments_of(self, rows_flag: np.ndarray) -> np.ndarray:
        """Boolean per path segment: its event is flagged."""
        rows = self.segment_rows
        ok = rows >= 0
        out = np.zeros(len(rows), dtype=bool)
        out[ok] = rows_flag[rows[ok]]
        return out

    @property
    def segment_rows(self) -> np.ndarray:
        """Per path segment: the row of its event (-1 for idle time). Rows are in trace_index order."""
        if self._segment_rows is None:
            raw_index = self.events["trace_index"].to_numpy()
            index = self.path["trace_index"].to_numpy()
            narrow = np.int32 if len(raw_index) < 2**31 else np.int64  # held by all detectors: 4 bytes a segment
            n = len(raw_index)
            if n and raw_index[0] == 0 and raw_index[-1] == n - 1:  # no event dropped: each row is its position
                # (trace_index rises strictly, so its ends fix it); no search per segment (millions on a big trace)
                self._segment_rows = np.where((index >= 0) & (index < n), index, -1).astype(narrow)
                return self._segment_rows
            pos = np.clip(np.searchsorted(raw_index, index), 0, max(n - 1, 0))
            found = (index >= 0) & (n > 0)
            found &= raw_index[pos] == index if n else found
            self._segment_rows = np.where(found, pos, -1).astype(narrow)
        return self._segment_rows

    def per_step(self, segment_mask: np.ndarray, weight: np.ndarray | None = None) -> pd.Series:
        """Path ns per steady step of the segments in ``segment_mask``, each at its ``weight`` (a share of it)
        when given (0 where none)."""
        ns = self.path["ns"].to_numpy()[segment_mask].astype(np.float64)  # masked first: a copy of those only
        if weight is not None:
            ns *= weight[segment_mask]
        sums = pd.Series(ns, index=self.path["step"].to_numpy()[segment_mask]).groupby(level=0).sum()
        return sums.reindex(self.steps["step"], fill_value=0.0)

    def step_stage_sums(self, segment_mask: np.ndarray) -> np.ndarray:
        """Path ns of the segments in ``segment_mask`` per steady step (rows, in ``steps`` order) and stage
        (columns, :data:`~profparse.base.marks.STAGES` order) (numpy bincount: the path of a big trace has millions
        of segments)."""
        from profparse.base.marks import STAGES

        steps = self.steps["step"].to_numpy()
        if self._step_stage is None:  # the same for every mask: made once, 4 bytes a segment
            # steps in time order need not be in number order (a renumbered step): look each one up
            index, step = pd.Index(steps), self.path["step"].to_numpy()
            codes = self.path["stage"].cat.codes.to_numpy()
            self._step_stage = np.empty(len(step), dtype=np.int32)
            for at in range(0, len(step), _BLOCK):
                position = index.get_indexer(step[at : at + _BLOCK])
                key = position * len(STAGES) + codes[at : at + _BLOCK]
                self._step_stage[at : at + _BLOCK] = np.where(position >= 0, key, -1)
        key, ns = self._step_stage, self.path["ns"].to_numpy()
        sums = np.zeros(len(steps) * len(STAGES))
        for at in range(0, len(key), _BLOCK):  # bincount's int64 and float64 copies of a block at a time
            block = slice(at, at + _BLOCK)
            keep = segment_mask[block] & (key[block] >= 0)
            # whole nanoseconds: every partial sum is an integer below 2**53, so the blocks add up exactly
            sums += np.bincount(key[block][keep], weights=ns[block][keep], minlength=len(sums))
        return sums.reshape(len(steps), len(STAGES))

    def top(self, segment_mask: np.ndarray, key: np.ndarray | None = None, n: int = TOP_EVENTS) -> list[dict[str, Any]]:
        """The events with the most path time among the segments in ``segment_mask``, in ms per steady step.

        ``key`` (per segment, a row) groups pieces under an outer event (e.g. the op a kernel belongs to)."""
        seg = self.path.loc[segment_mask]
        if seg.empty:
            return []
        # summed per name code, named once per distinct code: a string per segment made the peak of summarize on
        # traces with many path segments
        own = seg["name"]
        labels = np.asarray(own.cat.categories, dtype=object)
        codes = own.cat.codes.to_numpy().astype(np.int64)
        if key is not None:
            rows = key[segment_mask]
            events = self.events["name"]
            event_codes = events.cat.codes.to_numpy()[np.maximum(rows, 0)].astype(np.int64)
            codes = np.where(rows >= 0, np.where(event_codes >= 0, event_codes + len(labels), -1), codes)
            labels = np.concatenate([labels, np.asarray(events.cat.categories, dtype=object)])
        labels = np.append(labels, "nan")  # a missing name, as astype(str) wrote it
        codes[codes < 0] = len(labels) - 1
        used, inverse = np.unique(codes, return_inverse=True)
        ns = np.bincount(inverse, weights=seg["ns"].to_numpy(dtype=np.float64), minlength=len(used))
        names = [_UNTRACED_IN_STEP if STEP_NAME.match(str(name)) else str(name) for name in labels[used]]
        totals = pd.Series(ns, index=names).groupby(level=0).sum().nlargest(n)
        count = len(self.steps)
        return [{"name": name, "ms_per_step": round(ns / count / 1e6, 3)} for name, ns in totals.items()]


def user_frame(ctx: AdviceContext, rows: np.ndarray) -> list[str]:
    """The innermost Python frame of the user's code above each row, where the trace has stacks (else empty).

    A frame is the user's when its file is not torch's, transformers' or the interpreter's own."""
    events = ctx.events
    python = kind_mask(events, {"python_function"})
    if not python.any() or not len(rows):
        return []
    own = python & ~ctx.names(_LIBRARY_FRAME)
    parent = ctx.parsed.links.parent
    found = nearest_flagged(parent, parent[rows], own)  # the nearest above each row
    found = found[found >= 0]
    return [str(name) for name in ctx.name_of(found)]


_LIBRARY_FRAME = re.compile(
    r"^(torch|transformers|accelerate|threading|multiprocessing|contextlib|functools|<built-in|<frozen|nn\.Module"
    r"|runpy|profparse|importlib|typing|abc|site-packages|.*/site-packages/|.*/lib/python3)"
)
