"""The library's one data path: read -> link -> attribute -> tables.

``profparse.load(path)`` runs it and returns a :class:`ParsedTrace` whose tables are pandas DataFrames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse import tables
from profparse.analysis import Analyses
from profparse.base import phase_clock
from profparse.base.errors import TraceFormatError
from profparse.stages.attribute import Attribution, attribute
from profparse.trace.events import GPU_ACTIVITY_KINDS, NULL, RawTrace, read_trace
from profparse.trace.link import Links, link


def _cached_table(compute: Callable[[Any], pd.DataFrame], name: str | None = None) -> cached_property:
    """A lazily computed table that is read from the trace's cache entry when stored there, and stored there
    once computed (so the next verb on the same trace reads it instead of computing it: profparse.cache)."""
    key = name or compute.__name__

    def get(self: Any) -> pd.DataFrame:
        entry = getattr(self, "cache", None) or getattr(getattr(self, "parsed", None), "cache", None)
        frame = entry.table(key) if entry is not None else None
        if frame is None:
            frame = compute(self)
            if entry is not None:
                entry.put_table(key, frame)
        return frame

    get.__name__, get.__doc__ = compute.__name__, compute.__doc__
    return cached_property(get)


class _CachedAnalyses(Analyses):
    """The analysis tables, read from and stored in the trace's cache entry."""

    load_breakdown = _cached_table(Analyses.load_breakdown.func, "analysis.load_breakdown")
    stage_levels = _cached_table(Analyses.stage_levels.func, "analysis.stage_levels")
    modules = _cached_table(Analyses.modules.func, "analysis.modules")
    memory = _cached_table(Analyses.memory.func, "analysis.memory")
    memory_by_stage = _cached_table(Analyses.memory_by_stage.func, "analysis.memory_by_stage")
    runtime_calls = _cached_table(Analyses.runtime_calls.func, "analysis.runtime_calls")
    collectives = _cached_table(Analyses.collectives.func, "analysis.collectives")
    comm_exposure = _cached_table(Analyses.comm_exposure.func, "analysis.comm_exposure")
    flops = _cached_table(Analyses.flops.func, "analysis.flops")
    efficiency = _cached_table(Analyses.efficiency.func, "analysis.efficiency")  # the key holds peak_tflops
    gemms = _cached_table(Analyses.gemms.func, "analysis.gemms")


@dataclass(repr=False)
class ParsedTrace:
    """A trace after linking and stage attribution; tables are computed on first access."""

    raw: RawTrace
    links: Links
    attribution: Attribution
    options: dict[str, Any] = field(default_factory=dict)
    cache: Any = None  # the profparse.cache.Entry this trace was read from or stored in, if any

    @property
    def path(self) -> str:
        return self.raw.path

    @property
    def header(self) -> dict[str, Any]:
        return self.raw.header

    @property
    def rank(self) -> int | None:
        """``distributedInfo.rank`` when it is a rank number: an int from 0 to 2^31-1 (``true`` is not rank 1)."""
        info = self.raw.header.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 31:
            return rank
        return None

    @cached_property
    def _events(self) -> pd.DataFrame:
        return tables.event_table(self.raw.events, self.links, self.attribution)

    @cached_property
    def events(self) -> pd.DataFrame:
        """One row per trace event, with nesting, launch links, ``stage``, ``stage_rule``, ``step``, ``substage``."""
        return _public(self._analysis.add_substage(self._events))

    @_cached_table
    def kernels(self) -> pd.DataFrame:
        """GPU activity (kernels, memcpy, memset) with stage and launching runtime call / CPU op."""
        return _public(tables.kernel_table(self.raw.events, self.links, self.attribution))

    @_cached_table
    def ops(self) -> pd.DataFrame:
        """CPU ops with self time, stage, step and the GPU time they launched."""
        return _public(tables.op_table(self.raw.events, self.links, self.attribution))

    @_cached_table
    def _host_time(self) -> pd.DataFrame:
        """Host wall and levels per (scope, step, stage): computed once for the stage summary and the levels
        (it was half of the tables' time when each computed it)."""
        return tables.host_time(self.raw.events, self.links, self.attribution)

    @_cached_table
    def _stage_summary(self) -> pd.DataFrame:
        return tables.stage_summary(self.raw.events, self.links, self.attribution, self._host_time)

    @cached_property
    def stage_summary(self) -> pd.DataFrame:
        """Per (step, stage) and total per stage: host wall, op time, GPU time/busy/idle, counts, bytes."""
        return _public(self._stage_summary)

    @cached_property
    def _analysis(self) -> Any:
        return _CachedAnalyses(self)

    @cached_property
    def load_breakdown(self) -> pd.DataFrame:
        """Loading sub-steps (config, class resolution, instantiation, weights, device transfer, unattributed)."""
        return _public(self._analysis.load_breakdown)

    @cached_property
    def stage_levels(self) -> pd.DataFrame:
        """Per (step, stage) and stage: Python, op, runtime and device time, device idle, launch latency."""
        return _public(self._analysis.stage_levels)

    @cached_property
    def modules(self) -> pd.DataFrame:
        """Forward and backward host/GPU time per nn.Module instance (recompute labelled)."""
        return _public(self._analysis.modules)

    @cached_property
    def memory(self) -> pd.DataFrame:
        """The allocator timeline: one row per ``[memory]`` event with totals, device, stage and step."""
        return _public(self._analysis.memory)

    @cached_property
    def memory_by_stage(self) -> pd.DataFrame:
        """Per (step, stage, device): allocated at start/end, peak, bytes allocated and freed."""
        return _public(self._analysis.memory_by_stage)

    @cached_property
    def runtime_calls(self) -> pd.DataFrame:
        """Per (step, stage, call name): count, time and share of host wall of CUDA/HIP runtime and driver calls."""
        return _public(self._analysis.runtime_calls)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """One row per collective kernel: kind, stage, bytes, algorithm/bus bandwidth, process group, exposed time."""
        return _public(self._analysis.collectives)

    @cached_property
    def comm_exposure(self) -> pd.DataFrame:
        """Per (step, stage, device): collective time, the part not overlapped by other GPU activity, overlap %."""
        return _public(self._analysis.comm_exposure)

    @cached_property
    def flops(self) -> pd.DataFrame:
        """FLOPs, bytes, GPU time and achieved TFLOP/s per counted op; uncounted ops with their time ("status")."""
        return _public(self._analysis.flops)

    @cached_property
    def efficiency(self) -> pd.DataFrame:
        """FLOPs, achieved TFLOP/s, MFU and HFU per (step, stage), step, stage and module (``scope``)."""
        return _public(self._analysis.efficiency)

    @cached_property
    def gemms(self) -> pd.DataFrame:
        """Matmul shapes (batch, M, N, K, dtype): count, FLOPs, GPU time, TFLOP/s and % of the device's peak."""
        return _public(self._analysis.gemms)

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` with internal NULL sentinels (int64 -1 for missing), as the writers and analyses use it;
        the attribute of the same name is the public version with nullable columns."""
        if name in {"stage_summary", "host_time"}:
            return self._stage_summary if name == "stage_summary" else self._host_time
        if name in {"kernels", "ops", "warnings"}:
            return getattr(self, name)
        return getattr(self._analysis, name)

    def with_substage(self, events: pd.DataFrame) -> pd.DataFrame:
        """``events`` (rows of the event table) with the loading ``substage`` and ``substage_rule`` columns."""
        return self._analysis.add_substage(events)

    def value(self, name: str) -> Any:
        """An intermediate result the tables share: ``substeps``, ``flop_counts`` or ``peak``."""
        return getattr(self._analysis, name)

    @property
    def peak(self) -> Any:
        """The peak that MFU is measured against: ``tflops`` (NaN if unknown), ``dtype``, ``device``, ``note``."""
        return self._analysis.peak

    @_cached_table
    def warnings(self) -> pd.DataFrame:
        """Quality checks that found something: check, severity, count, value, message."""
        from profparse.analysis.quality import quality_checks

        return quality_checks(self)

    @property
    def steps(self) -> pd.DataFrame:
        """The step windows found (``ProfilerStep#N``, else between optimizer steps)."""
        return self.attribution.steps

    @property
    def rules(self) -> pd.DataFrame:
        """The stage rules that were applied, highest priority first."""
        return pd.DataFrame([vars(r) for r in self.attribution.rules])

    def __repr__(self) -> str:
        """A few lines (path, events, steps, stages, devices, warnings, the main tables), not the dataclass's field
        dump; :data:`profparse.analysis.TABLES` lists every analysis table."""
        events = self.raw.events
        kinds = events["kind"].value_counts()
        gpu_kinds = [kind for kind in GPU_ACTIVITY_KINDS if kind in kinds.index]
        gpu = events["kind"].isin(gpu_kinds).to_numpy()
        devices = ["CPU"] + [f"GPU {d}" for d in sorted(set(events["device"].to_numpy()[gpu].tolist()) - {NULL})]
        steps = self.steps
        step_text = "none found"
        if len(steps):
            sources = ", ".join(sorted(set(steps["source"].astype(str))))
            step_text = f"{len(steps)} ({steps['step'].min()}-{steps['step'].max()}, from {sources})"
        totals = self._stage_summary[self._stage_summary["scope"] == "total"]
        present = [f"{r.stage} {r.host_wall_ns / 1e6:,.2f} ms" for r in totals.itertuples() if r.host_wall_ns > 0]
        lines = [
            f"ParsedTrace({self.path!r})",
            f"  events:   {len(events):,} ({int(kinds.get('cpu_op', 0)):,} CPU ops, {int(gpu.sum()):,} GPU activities)",
            f"  steps:    {step_text}",
            f"  stages:   {', '.join(present) or 'none with host time'} (host wall)",
            f"  devices:  {', '.join(devices)}" + (f"; rank {self.rank}" if self.rank is not None else ""),
            f"  warnings: {len(self.warnings)} (see .warnings)",
            "  tables:   .events .kernels .ops .stage_summary .stage_levels .modules .memory .load_breakdown",
            "            .flops .efficiency .gemms",
        ]
        return "\n".join(lines)


def _public(frame: pd.DataFrame) -> pd.DataFrame:
    """Turn internal NULL-sentinel int64 columns into nullable Int64 columns."""
    out = frame.copy(deep=False)
    for column in out.columns:
        values = out[column].to_numpy() if out[column].dtype == np.int64 else None
        if values is not None and (values == NULL).any():
            out[column] = tables.nullable(values)
    return out


def parse(
    path: str | Path,
    *,
    include_marks: bool = True,
    strict: bool = False,
    progress: Any = None,
    peak_tflops: float | None = None,
) -> ParsedTrace:
    """Read, link and attribute one trace file. ``peak_tflops``: the peak MFU is measured against (default: the
    device's dense peak for the dominant dtype, from :mod:`profparse.analysis.peaks`)."""
    phase_clock.startup()
    try:
        with phase_clock.phase("read"):
            raw = read_trace(path, strict=strict, progress=progress)
    except RecursionError:
        raise TraceFormatError(f"{path}: JSON nested too deeply (corrupt or hostile input)") from None
    phase = getattr(progress, "phase", None)  # a progress bar may also show the phases after reading
    if phase is not None:
        phase("linking")
    with phase_clock.phase("link"):
        links = link(raw.events)
    if phase is not None:
        phase("attributing stages")
    with phase_clock.phase("attribute"):
        attribution = attribute(raw.events, links, raw.thread_names, include_marks=include_marks)
    options = {"include_marks": include_marks, "peak_tflops": peak_tflops}
    return ParsedTrace(raw=raw, links=links, attribution=attribution, options=options)


def load(
    path: str | Path,
    *,
    cache: bool = True,
    include_marks: bool = True,
    strict: bool = False,
    progress: Any = None,
    notify: Callable[[str], None] | None = None,
    outputs: tuple[str | Path, ...] = (),
    peak_tflops: float | None = None,
) -> ParsedTrace:
    """Load a trace (``.json``/``.json.gz``) for analysis with pandas. Same options as :func:`parse`.

    With ``cache`` (default) the parsed trace comes from, or goes into, the user's cache folder
    (``docs/cache.md``): a second load of the same file content reads Arrow files instead of the JSON.
    ``notify`` receives the cache's notes and warnings (default: stderr); ``outputs``: folders the cache must
    not lie in."""
    if not cache:
        return parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    from profparse.cache.keys import load_options
    from profparse.cache.store import Cache

    store = Cache.open(**({"notify": notify} if notify else {}), inputs=[path], outputs=outputs)
    options = load_options(include_marks, strict, peak_tflops)
    with phase_clock.phase("cache.key"):
        key = store.key(path, options) if store is not None else None
    if store is None or key is None:
        return parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    name, stat_id = key
    with phase_clock.phase("cache.read"):
        hit = store.get(name, path)
    if hit is not None:
        phase_clock.startup()  # (includes cache.key and cache.read: on a miss parse() says it)
        (raw, links, attribution), entry = hit
        return ParsedTrace(
            raw=raw,
            links=links,
            attribution=attribution,
            options={"include_marks": include_marks, "peak_tflops": peak_tflops},
            cache=entry,
        )
    parsed = parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    if store.unchanged(path, stat_id):  # not a file rewritten while it was parsed
        with phase_clock.phase("cache.store"):
            parsed.cache = store.put(name, parsed)
    return parsed
