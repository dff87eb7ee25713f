"""A trace after reading, linking and stage attribution: :class:`ParsedTrace`, whose tables are those of
:data:`~profparse.tables.registry.TABLES`, each computed on first use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from profparse.stages.attribute import Attribution
from profparse.tables.registry import TABLES, VALUES, TableSpec, needed, public_tables, resolve
from profparse.tables.rows import event_links, event_table, nullable
from profparse.trace.budget import release_memory
from profparse.trace.events import RawTrace
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import Links

#: The notebook renderers, resolved when called (outputs sit above this layer; no Jupyter import anywhere).
NOTEBOOK_HTML = "profparse.outputs.notebook:trace_html"
NOTEBOOK_REPORT = "profparse.outputs.notebook:trace_report"


class TableStore(Protocol):
    """Where computed tables are kept between runs (a :class:`profparse.cache` entry)."""

    def table(self, name: str) -> pd.DataFrame | None: ...

    def put_table(self, name: str, frame: pd.DataFrame) -> None: ...


@dataclass(repr=False)
class ParsedTrace:
    """A trace after linking and stage attribution; tables are computed on first access.

    Every table of :data:`~profparse.tables.registry.TABLES` marked ``public`` is an attribute with nullable
    columns (``parsed.kernels``); :meth:`table` gives the internal form (int64 ``NULL``, int64's minimum, for
    missing)."""

    raw: RawTrace
    links: Links
    attribution: Attribution
    options: dict[str, Any] = field(default_factory=dict)
    cache: TableStore | None = None  # the cache entry this trace was read from or stored in, if any
    _internal: dict[str, Any] = field(default_factory=dict, init=False)
    _public: dict[str, pd.DataFrame] = field(default_factory=dict, init=False)
    _lent: set[str] = field(default_factory=set, init=False)  # held only for tables a writer has still to make

    if TYPE_CHECKING:  # the registry's public tables, attached below; seen by IDEs and type checkers
        # (tests/test_registry.py keeps this list equal to registry.public_tables(), in order)
        @property
        def events(self) -> pd.DataFrame: ...
        @property
        def kernels(self) -> pd.DataFrame: ...
        @property
        def ops(self) -> pd.DataFrame: ...
        @property
        def stage_summary(self) -> pd.DataFrame: ...
        @property
        def steps(self) -> pd.DataFrame: ...
        @property
        def warnings(self) -> pd.DataFrame: ...
        @property
        def load_breakdown(self) -> pd.DataFrame: ...
        @property
        def stage_levels(self) -> pd.DataFrame: ...
        @property
        def modules(self) -> pd.DataFrame: ...
        @property
        def memory(self) -> pd.DataFrame: ...
        @property
        def memory_by_stage(self) -> pd.DataFrame: ...
        @property
        def memory_categories(self) -> pd.DataFrame: ...
        @property
        def memory_peak_categories(self) -> pd.DataFrame: ...
        @property
        def runtime_calls(self) -> pd.DataFrame: ...
        @property
        def collectives(self) -> pd.DataFrame: ...
        @property
        def comm_exposure(self) -> pd.DataFrame: ...
        @property
        def critical_path(self) -> pd.DataFrame: ...
        @property
        def replay(self) -> pd.DataFrame: ...
        @property
        def flops(self) -> pd.DataFrame: ...
        @property
        def efficiency(self) -> pd.DataFrame: ...
        @property
        def gemms(self) -> pd.DataFrame: ...
        @property
        def findings(self) -> pd.DataFrame: ...

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

    def table(self, name: str, keep: bool = True) -> pd.DataFrame:
        """Table ``name`` with internal NULL sentinels, as the writers and analyses use it; read from the cache
        entry when stored there, else computed (and stored). ``keep=False``, for a writer that needs a table
        once: not held afterwards unless another table or value needs it."""
        frame = self._internal.get(name)
        if frame is None:
            spec = TABLES[name]
            stored = self.cache is not None and spec.stored
            frame = self.cache.table(name) if stored else None
            if frame is None:
                frame = spec.function()(**self._arguments(spec.needs))
                if stored:
                    self.cache.put_table(name, frame)
            if keep or name in needed():
                self._internal[name] = frame
        return frame

    def computed(self) -> set[str]:
        """The tables and values held now (internal form)."""
        return set(self._internal)

    def forget(self, names: Iterable[str]) -> None:
        """Stop holding these tables and values (internal and public form): a writer that is done with them gives
        their memory back; they are computed again if asked for."""
        for name in names:
            self._internal.pop(name, None)
            self._public.pop(name, None)
            self._lent.discard(name)

    def lend(self, name: str) -> None:
        """Mark table ``name`` as held only for tables a writer has still to make: a reader that is done with it
        may give it back early (:meth:`done_with`)."""
        if name in self._internal:
            self._lent.add(name)

    def done_with(self, name: str) -> None:
        """A reader is done with ``name``: forgotten if it was only lent (:meth:`lend`), else kept."""
        if name in self._lent:
            self.forget([name])

    def value(self, name: str) -> Any:
        """An intermediate result that several tables read (:data:`~profparse.tables.registry.VALUES`)."""
        if name not in self._internal:
            spec = VALUES[name]
            self._internal[name] = spec.function()(**self._arguments(spec.needs))
            release_memory()  # its temporaries, freed in the heap, would stay resident under the tables that read it
        return self._internal[name]

    def public(self, name: str) -> pd.DataFrame:
        """Table ``name`` with nullable columns where the internal one has NULL sentinels."""
        if name not in self._public:
            self._public[name] = nullable_columns(self.table(name))
        return self._public[name]

    def __getattr__(self, name: str) -> pd.DataFrame:
        """A public table declared after this class was made (the declared ones are properties)."""
        spec = TABLES.get(name)
        if spec is None or not spec.public or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.public(name)

    def _arguments(self, needs: tuple[str, ...]) -> dict[str, Any]:
        """The keyword arguments of a compute function: each of ``needs`` by its name."""
        inputs = {
            "events": lambda: self.raw.events,
            "links": lambda: self.links,
            "attribution": lambda: self.attribution,
            "header": lambda: self.raw.header,
            "peak_tflops": lambda: self.options.get("peak_tflops"),
            "parsed": lambda: self,
        }
        return {n: inputs[n]() if n in inputs else self.value(n) if n in VALUES else self.table(n) for n in needs}

    def with_substage(self, events: pd.DataFrame) -> pd.DataFrame:
        """``events`` (rows of the event table, in order) with the loading ``substage`` and ``substage_rule``."""
        substeps = self.value("substeps")
        out = events.copy(deep=False)
        raw_index = self.raw.events["trace_index"].to_numpy()
        index = out["trace_index"].to_numpy()
        rows: slice | np.ndarray = slice(None)
        if len(index) != len(raw_index) or not np.array_equal(index, raw_index):
            rows = np.searchsorted(raw_index, index)
        out["substage"] = substeps.substage_column(rows)
        out["substage_rule"] = substeps.rule_column(rows)
        return out

    @property
    def peak(self) -> Any:
        """The peak that MFU is measured against: ``tflops`` (NaN if unknown), ``dtype``, ``device``, ``note``."""
        return self.value("peak")

    @property
    def rules(self) -> pd.DataFrame:
        """The stage rules that were applied, highest priority first."""
        return pd.DataFrame([vars(r) for r in self.attribution.rules])

    def _repr_html_(self) -> str:
        """What Jupyter shows for a trace: the report's headline and the overview per stage."""
        return resolve(NOTEBOOK_HTML)(self)

    def report(self) -> Any:
        """The full HTML report (``profparse report``'s page): shown inline in Jupyter, ``.save(path)`` writes it."""
        return resolve(NOTEBOOK_REPORT)(self)

    def __repr__(self) -> str:
        """A few lines: path, events, steps, stages, devices, warnings and the tables."""
        events = self.raw.events
        kinds = events["kind"].value_counts()
        gpu_kinds = [kind for kind in GPU_ACTIVITY_KINDS if kind in kinds.index]
        gpu = events["kind"].isin(gpu_kinds).to_numpy()
        devices = ["CPU"] + [f"GPU {d}" for d in sorted(set(events["device"].to_numpy()[gpu].tolist()) - {NULL})]
        steps = self.attribution.steps
        step_text = "none found"
        if len(steps):
            sources = ", ".join(sorted(set(steps["source"].astype(str))))
            step_text = f"{len(steps)} ({steps['step'].min()}-{steps['step'].max()}, from {sources})"
        summary = self.table("stage_summary")
        totals = summary[summary["scope"] == "total"]
        present = [f"{r.stage} {r.host_wall_ns / 1e6:,.2f} ms" for r in totals.itertuples() if r.host_wall_ns > 0]
        names = [f".{spec.name}" for spec in public_tables()]
        lines = [
            f"ParsedTrace({self.path!r})",
            f"  events:   {len(events):,} ({int(kinds.get('cpu_op', 0)):,} CPU ops, {int(gpu.sum()):,} GPU activities)",
            f"  steps:    {step_text}",
            f"  stages:   {', '.join(present) or 'none with host time'} (host wall)",
            f"  devices:  {', '.join(devices)}" + (f"; rank {self.rank}" if self.rank is not None else ""),
            f"  warnings: {len(self.table('warnings'))} (see .warnings)",
            "  tables:   " + " ".join(names[: len(names) // 2]),
            "            " + " ".join(names[len(names) // 2 :]),
        ]
        return "\n".join(lines)


def _table_property(spec: TableSpec) -> property:
    def get(self: ParsedTrace) -> pd.DataFrame:
        return self.public(spec.name)

    get.__name__, get.__doc__ = spec.name, spec.summary[:1].upper() + spec.summary[1:] + "."
    return property(get)


for _spec in public_tables():
    setattr(ParsedTrace, _spec.name, _table_property(_spec))


def nullable_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its NULL-sentinel int64 columns (plain or sparse, as the event table keeps rarely set args)
    turned into nullable Int64 columns: what users get from the Python API."""
    out = frame.copy(deep=False)
    for column in out.columns:
        dtype = out[column].dtype
        sparse = isinstance(dtype, pd.SparseDtype) and dtype.subtype == np.int64
        if not sparse and dtype != np.int64:
            continue
        values = out[column].sparse.to_dense().to_numpy() if sparse else out[column].to_numpy()
        if (values == NULL).any():
            out[column] = nullable(values)
        elif sparse:
            out[column] = values
    return out


def event_rows(parsed: ParsedTrace, start: int = 0, stop: int | None = None) -> pd.DataFrame:
    """Rows ``start:stop`` of the event table (every row by default), with the loading sub-steps."""
    return parsed.with_substage(event_table(parsed.raw.events, parsed.links, parsed.attribution, start, stop))


def event_columns(parsed: ParsedTrace, start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of :func:`event_rows` as its columns (name -> NumPy array, Categorical or SparseArray),
    in its order, without a DataFrame: the Parquet writer converts them to Arrow one slice at a time."""
    events = parsed.raw.events
    rows = slice(start, stop)
    columns: dict[str, Any] = {}
    for name in events.columns:
        series = events[name]  # a NumPy column as its array; Categorical, SparseArray as they are
        columns[name] = series.to_numpy()[rows] if isinstance(series.dtype, np.dtype) else series.array[rows]
    columns.update(event_links(events, parsed.links, parsed.attribution, start, stop))
    substeps = parsed.value("substeps")
    columns["substage"] = substeps.substage_column(rows)
    columns["substage_rule"] = substeps.rule_column(rows)
    return columns


def step_windows(attribution: Attribution) -> pd.DataFrame:
    return attribution.steps
