"""Every table profparse gives, declared once.

Each :class:`TableSpec` says how the table is computed (a function, named as ``module:function`` so that this low
layer never imports the analyses above it), what that function is given (``needs``: the names of its parameters,
passed by keyword), where its columns are documented, and where the table goes: an attribute of
:class:`~profparse.tables.parsed.ParsedTrace` (``public``), a Parquet file of ``profparse parse`` (``written``), the
trace's cache entry (``stored``). The API,
the cache, the Parquet writer, the summary, the report and the ranks all read :data:`TABLES`; a new table is one
more entry here (and its function where its idea lives).

A name in ``needs`` is one of :data:`INPUTS` (what the trace was parsed into), another table (its internal form,
with NULL sentinels), or one of :data:`VALUES` (intermediate results that several tables share).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

INPUTS = {
    # the table named ``events`` is these columns with links and stages added, for output: never a need
    "events": "the event columns of the trace (ParsedTrace.raw.events)",
    "links": "nesting and launch links (ParsedTrace.links)",
    "attribution": "stages, rules and steps of every event (ParsedTrace.attribution)",
    "header": "the trace's top-level fields other than traceEvents",
    "peak_tflops": "the --peak-tflops option (None: the device's peak)",
    "parsed": "the whole ParsedTrace (for a table that reads several of the above and other tables)",
}


@dataclass(frozen=True)
class TableSpec:
    """One table: its name, how it is computed, and where it goes."""

    name: str
    compute: str  # "module:function"; called with ``needs`` as keyword arguments; returns internal NULL sentinels
    needs: tuple[str, ...]
    doc: str  # the page that documents its columns, under a heading that names the table
    summary: str  # one line: what a row is
    public: bool = True  # an attribute of ParsedTrace, with nullable columns
    written: bool = True  # a Parquet file of `profparse parse` (and of each rank in a rank dataset)
    stored: bool = True  # kept in the trace's cache entry once computed
    # a long table, computed and written a slice of rows at a time (compute takes start, stop): "module:function"
    # (parsed, start, stop) -> the same rows as columns, which the Parquet writer converts to Arrow without making
    # a DataFrame of them
    slice_columns: str | None = None
    # tables and values read through ``parsed`` (when it is a need): a writer keeps them until this table is made
    reads: tuple[str, ...] = ()

    @property
    def sliced(self) -> bool:
        """Computed and written a slice of rows at a time (:attr:`slice_columns`)."""
        return self.slice_columns is not None

    def function(self) -> Callable[..., Any]:
        return resolve(self.compute)


@dataclass(frozen=True)
class ValueSpec:
    """An intermediate result (not a table) that several tables read."""

    name: str
    compute: str
    needs: tuple[str, ...]
    summary: str

    def function(self) -> Callable[..., Any]:
        return resolve(self.compute)


def resolve(path: str) -> Callable[..., Any]:
    """The function named by ``module:function``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_ROWS = ("events", "links", "attribution")

VALUES: dict[str, ValueSpec] = {
    spec.name: spec
    for spec in (
        ValueSpec("substeps", "profparse.analysis.load:load_substeps", _ROWS, "the loading sub-step of every event"),
        ValueSpec(
            "flop_counts", "profparse.analysis.flop_counts:count_flops", _ROWS, "FLOPs and bytes of every counted op"
        ),
        ValueSpec(
            "replay_model",
            "profparse.analysis.replay:build",
            _ROWS,
            "the steady steps' replay model (None without one), read by the replay table and the findings' what-ifs",
        ),
        ValueSpec(
            "peak",
            "profparse.analysis.peaks:choose_peak",
            ("header", "events", "flops", "peak_tflops"),
            "the peak MFU is measured against: tflops (NaN if unknown), dtype, device, note",
        ),
    )
}

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            "events",
            "profparse.tables.parsed:event_rows",
            ("parsed",),
            "docs/tables.md",
            "one row per trace event, with nesting, launch links, stage, stage_rule, step, substage",
            reads=("substeps",),
            stored=False,  # the cache keeps the columns it is made from
            slice_columns="profparse.tables.parsed:event_columns",
        ),
        TableSpec(
            "kernels",
            "profparse.tables.rows:kernel_table",
            _ROWS,
            "docs/tables.md",
            "GPU activity (kernels, memcpy, memset) with stage and launching runtime call / CPU op",
        ),
        TableSpec(
            "ops",
            "profparse.tables.rows:op_table",
            _ROWS,
            "docs/tables.md",
            "CPU ops with self time, stage, step and the GPU time they launched",
        ),
        TableSpec(
            "host_time",
            "profparse.tables.host_time:host_time",
            _ROWS,
            "docs/tables.md",
            "host wall and levels per (scope, step, stage), shared by stage_summary and stage_levels",
            public=False,
            written=False,
        ),
        TableSpec(
            "stage_summary",
            "profparse.tables.stage_summary:stage_summary",
            (*_ROWS, "host_time"),
            "docs/tables.md",
            "per (step, stage) and total per stage: host wall, op time, GPU time/busy/idle, counts, bytes",
        ),
        TableSpec(
            "steps",
            "profparse.tables.parsed:step_windows",
            ("attribution",),
            "docs/tables.md",
            "the step windows found (ProfilerStep#N, else between optimizer steps)",
            stored=False,  # part of the attribution the cache keeps
        ),
        TableSpec(
            "warnings",
            "profparse.analysis.quality:quality_checks",
            ("parsed",),
            "docs/tables.md",
            "quality checks that found something: check, severity, count, value, message",
            reads=("runtime_calls", "steps"),
        ),
        TableSpec(
            "load_breakdown",
            "profparse.analysis.load:load_breakdown",
            (*_ROWS, "substeps", "host_time"),
            "docs/analyses.md",
            "loading sub-steps (config, class resolution, instantiation, weights, device transfer, unattributed)",
        ),
        TableSpec(
            "stage_levels",
            "profparse.analysis.levels:stage_levels",
            (*_ROWS, "stage_summary", "host_time"),
            "docs/analyses.md",
            "per (step, stage) and stage: Python, op, runtime and device time, device idle, launch latency",
        ),
        TableSpec(
            "modules",
            "profparse.analysis.modules:module_table",
            _ROWS,
            "docs/analyses.md",
            "forward and backward host/GPU time per nn.Module instance (recompute labelled)",
        ),
        TableSpec(
            "memory",
            "profparse.analysis.memory:memory_timeline",
            _ROWS,
            "docs/analyses.md",
            "the allocator timeline: one row per [memory] event with totals, device, stage and step",
        ),
        TableSpec(
            "memory_by_stage",
            "profparse.analysis.memory:memory_by_stage",
            ("memory",),
            "docs/analyses.md",
            "per (step, stage, device): allocated at start/end, peak, bytes allocated and freed",
        ),
        TableSpec(
            "memory_categories",
            "profparse.analysis.memory_categories:memory_categories",
            (*_ROWS, "memory"),
            "docs/memory_categories.md",
            "one row per allocation: category (parameter, gradient, ...), the rule, where it was made and freed",
        ),
        TableSpec(
            "memory_peak_categories",
            "profparse.analysis.memory_categories:memory_peak_categories",
            ("events", "memory", "memory_categories"),
            "docs/memory_categories.md",
            "per (step, stage, device, category): bytes live at the group's highest Total Allocated",
        ),
        TableSpec(
            "runtime_calls",
            "profparse.analysis.runtime:runtime_calls",
            (*_ROWS, "stage_summary"),
            "docs/communication.md",
            "per (step, stage, call name): count, time and share of host wall of runtime and driver calls",
        ),
        TableSpec(
            "collectives",
            "profparse.analysis.comm:collectives",
            (*_ROWS, "header"),
            "docs/communication.md",
            "one row per collective kernel: kind, stage, bytes, bandwidths, process group, exposed time",
        ),
        TableSpec(
            "comm_exposure",
            "profparse.analysis.comm:comm_exposure",
            ("events", "collectives", "attribution"),
            "docs/communication.md",
            "per (step, stage, device): collective time, the part no other GPU work overlaps, overlap %",
        ),
        # before the FLOPs: their counts stay cached for efficiency and gemms, and the path's temporaries would add
        # to them at the peak of ``parse``
        TableSpec(
            "critical_path",
            "profparse.analysis.critical_path:path_table",
            _ROWS,
            "docs/critical_path.md",
            "one row per segment of each step's critical path: step, stage, bound, start, end, event",
        ),
        TableSpec(
            "replay",
            "profparse.analysis.profiler_cost:replay_table",
            (*_ROWS, "header", "replay_model"),
            "docs/without_profiler.md",
            "per steady step: measured, replayed unchanged, in a loop, and replayed without the profiler's cost",
            written=False,  # a replay per step: computed when summarize or advise asks, not by parse
            stored=False,
        ),
        TableSpec(
            "flops",
            "profparse.analysis.flop_counts:flop_table",
            (*_ROWS, "flop_counts"),
            "docs/efficiency.md",
            "FLOPs, bytes, GPU time and achieved TFLOP/s per counted op; uncounted ops with their time",
        ),
        TableSpec(
            "efficiency",
            "profparse.analysis.efficiency:efficiency_table",
            ("parsed", "flops", "peak"),
            "docs/efficiency.md",
            "FLOPs, achieved TFLOP/s, MFU and HFU per (step, stage), step, stage and module",
            reads=("stage_summary", "steps"),
        ),
        TableSpec(
            "gemms",
            "profparse.analysis.gemms:gemm_table",
            ("events", "flops", "peak"),
            "docs/efficiency.md",
            "matmul shapes (batch, M, N, K, dtype): count, FLOPs, GPU time, TFLOP/s and % of the device's peak",
        ),
        TableSpec(
            "findings",
            "profparse.analysis.advice:findings",
            ("parsed",),
            "docs/advice.md",
            "what to change: kind, stage, steps, saving per step (time on the critical path the fix removes), fix",
            reads=("critical_path", "comm_exposure", "stage_summary", "flops", "peak", "steps", "replay_model"),
        ),
    )
}


def written() -> list[TableSpec]:
    """The tables ``profparse parse`` writes, the biggest (events) first."""
    return [spec for spec in TABLES.values() if spec.written]


def inputs_of(name: str, held: Collection[str] = ()) -> set[str]:
    """Every table and value that computing ``name`` may read, directly or through what those read (``needs`` and
    ``reads``; not :data:`INPUTS`); not through what is ``held`` already (read, not made again)."""
    out: set[str] = set()
    todo = [name]
    while todo:
        for need in direct_inputs(todo.pop()):
            if need not in out:
                out.add(need)
                if need not in held:
                    todo.append(need)
    return out


def direct_inputs(name: str) -> tuple[str, ...]:
    """The tables and values that computing ``name`` reads itself (``needs`` and ``reads``; not :data:`INPUTS`)."""
    spec: TableSpec | ValueSpec = TABLES[name] if name in TABLES else VALUES[name]
    reads = spec.reads if isinstance(spec, TableSpec) else ()
    return tuple(need for need in (*spec.needs, *reads) if need in TABLES or need in VALUES)


def needed() -> set[str]:
    """The tables and values that some table or value reads."""
    return {need for spec in (*TABLES.values(), *VALUES.values()) for need in spec.needs}


def public_tables() -> list[TableSpec]:
    """The tables a ParsedTrace offers as attributes."""
    return [spec for spec in TABLES.values() if spec.public]
