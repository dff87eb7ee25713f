"""Parquet output: one file per table in a folder (readable by pandas, DuckDB, polars)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pandas.arrays import SparseArray

from profparse.base import phase_clock
from profparse.base.files import atomic_dir
from profparse.base.formats import path_text
from profparse.tables.parsed import ParsedTrace
from profparse.tables.registry import TableSpec, inputs_of, resolve, written
from profparse.trace.budget import release_memory
from profparse.trace.kinds import NULL


def _with_nulls(values: np.ndarray, missing: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Arrow array of ``values`` with nulls where ``missing``, sharing the values' memory (``pa.array(values,
    mask=...)`` makes extra copies); an all-null column gets buffers that are never written, so take no memory."""
    n = len(values)
    nulls = int(np.count_nonzero(missing))
    if nulls == 0:
        return pa.array(values, type=kind)
    if nulls == n:
        none = pa.py_buffer(np.zeros((n + 7) // 8, np.uint8))  # calloc: pages appear only if written
        return pa.Array.from_buffers(kind, n, [none, pa.py_buffer(np.zeros(n, dtype=values.dtype))], nulls)
    valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(kind, n, [valid, pa.py_buffer(np.ascontiguousarray(values))], nulls)


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """DataFrame with internal NULL-sentinel int64 columns -> Arrow table with real nulls."""
    return pa.table({name: arrow_column(frame[name]) for name in frame.columns})


def arrow_column(values: pd.Series | np.ndarray | pd.Categorical | SparseArray) -> pa.Array:
    """One column (a Series, or an array as :func:`~profparse.tables.parsed.event_columns` gives) -> Arrow: int64
    with NULL sentinels (sparse ones as dense) with real nulls, a categorical as a dictionary array."""
    dtype = values.dtype
    if dtype == np.int64 or isinstance(dtype, pd.SparseDtype):
        ints = values if isinstance(values, np.ndarray) else values.to_numpy(dtype=np.int64)
        return _with_nulls(ints, ints == NULL, pa.int64())
    if isinstance(dtype, pd.CategoricalDtype):
        categorical = values.array if isinstance(values, pd.Series) else values
        codes = categorical.codes.astype(np.int32)
        return pa.DictionaryArray.from_arrays(
            _with_nulls(codes, codes < 0, pa.int32()),
            pa.array(categorical.categories.astype(str).to_numpy(dtype=object), pa.string()),
        )
    return pa.array(values if isinstance(values, np.ndarray) else values.to_numpy(), from_pandas=True)


class RowSlices:
    """A long table made one slice of rows at a time, so that writing it never holds all of it at once."""

    def __init__(
        self, rows: int, make: Callable[[int, int], pd.DataFrame], columns: Callable[[int, int], dict[str, Any]]
    ) -> None:
        self.rows = rows
        self.make = make  # (start, stop) -> the table's rows start:stop
        self.columns = columns  # (start, stop) -> the same rows as columns (:func:`arrow_column` takes each)

    def frame(self) -> pd.DataFrame:
        return self.make(0, self.rows)

    def arrow(self, start: int, stop: int) -> pa.Table:
        """Rows ``start:stop`` as Arrow, from their columns: no DataFrame of them is made."""
        return pa.table({name: arrow_column(values) for name, values in self.columns(start, stop).items()})


Table = pd.DataFrame | RowSlices


def table_makers(parsed: ParsedTrace, release: bool = False) -> dict[str, Callable[[], Table]]:
    """The tables to write (:func:`profparse.tables.registry.written`), each computed only when its function is
    called (internal NULL sentinels). A table or value that a later one reads (:func:`last_reader`) is held until
    then; with ``release``, what this writer computed is forgotten once its last reader is made."""
    specs = written()
    last = last_reader(specs)
    held = parsed.computed()
    makers: dict[str, Callable[[], Table]] = {}
    for position, spec in enumerate(specs):
        if spec.slice_columns is not None:
            rows, columns = spec.function(), resolve(spec.slice_columns)
            makers[spec.name] = lambda rows=rows, columns=columns: RowSlices(
                len(parsed.raw.events), lambda a, b: rows(parsed, a, b), lambda a, b: columns(parsed, a, b)
            )
            continue
        done = [name for name, at in last.items() if at == position and name not in held] if release else []

        def make(name: str = spec.name, keep: bool = last[spec.name] > position, done: list[str] = done) -> Table:
            before = parsed.computed()
            frame = parsed.table(name, keep=keep)
            if release:
                # what this table computed and a later one reads is lent too (a reader done with it early may
                # give it back, :meth:`ParsedTrace.done_with`), but not what the first table, written beside the
                # others, reads to the end
                kept = {name} if keep else set()
                for lent in (kept | (parsed.computed() - before - {name})) - held - set(done):
                    if last.get(lent, 0) < len(specs):
                        parsed.lend(lent)
            parsed.forget(done)
            return frame

        makers[spec.name] = make
    return makers


def last_reader(specs: list[TableSpec]) -> dict[str, int]:
    """Per table or value that ``specs`` (in writing order) read or are: the position of the last one that reads it.
    A table reads what it needs directly, and what those need only where they are not made yet: once the flops
    table is made, a later reader of it does not read the FLOP counts it was made from (55 MiB on a 300 MB trace,
    given back then, not after the findings). The first table is written beside all the others, so what it reads
    is read until the end (``len(specs)``)."""
    last: dict[str, int] = {}
    made: set[str] = set()
    for position, spec in enumerate(specs):
        reads = inputs_of(spec.name, held=made)
        made |= reads | {spec.name}
        for name in reads | {spec.name}:
            last[name] = len(specs) if position == 0 or last.get(name) == len(specs) else position
    return last


def internal_tables(parsed: ParsedTrace) -> dict[str, pd.DataFrame]:
    """The tables to write, with internal NULL sentinels."""
    made = {name: make() for name, make in table_makers(parsed).items()}
    return {name: table.frame() if isinstance(table, RowSlices) else table for name, table in made.items()}


#: rows per row group: far fewer than pyarrow's 1Mi, so a long table is written in little memory (one row group of the
#: events table, ~20 MB converted to Arrow per 64 Ki rows, is made and encoded in the second thread while the other
#: tables are computed: part of the peak of ``profparse parse``); files are ~3% larger than with 256 Ki rows
ROW_GROUP = 1 << 15


def _arrow(frame: pd.DataFrame, metadata: dict[str, str] | None) -> pa.Table:
    return _with_metadata(to_arrow(frame), metadata)


def _with_metadata(table: pa.Table, metadata: dict[str, str] | None) -> pa.Table:
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    return table


def _options(schema: pa.Schema) -> dict[str, Any]:
    # Dictionary pages only for text: on numbers (times, ids) they rarely pay off and cost a failed attempt each.
    # Min/max statistics only for numbers (times, steps, ids: what a reader's filter skips row groups by): on the
    # text columns they were a quarter of encoding the events table, and the file is no smaller with them.
    # Integers (times, ids, counts) as DELTA_BINARY_PACKED instead of PLAIN: the encoding, not zstd, was most of
    # the events table's write; DELTA takes about a quarter less CPU, is a few % smaller and reads back as fast
    # (pyarrow, pandas, DuckDB and polars read it).
    text = [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    numbers = [f.name for f in schema if f.name not in set(text)]
    integers = {f.name: "DELTA_BINARY_PACKED" for f in schema if pa.types.is_integer(f.type)}
    return {
        "compression": "zstd",
        "use_dictionary": text,
        "write_statistics": numbers or False,
        "column_encoding": integers or None,
    }


_CLOCK = phase_clock.Totals()  # with PROFPARSE_PROFILE_PHASES: seconds making tables vs encoding them


def _write(table: Table, path: Path, metadata: dict[str, str] | None) -> None:
    """Write one table (:func:`_encode`), timing its making apart from its encoding under
    PROFPARSE_PROFILE_PHASES."""
    if not phase_clock.ENABLED:
        _encode(table, path, metadata)
        return
    t0, making = time.perf_counter(), [0.0]
    if isinstance(table, RowSlices):
        columns = table.columns

        def timed(start: int, stop: int) -> dict[str, Any]:
            t = time.perf_counter()
            part = columns(start, stop)
            making[0] += time.perf_counter() - t
            return part

        table = RowSlices(table.rows, table.make, timed)
    _encode(table, path, metadata)
    _CLOCK.add("tables", making[0])
    _CLOCK.add("parquet", time.perf_counter() - t0 - making[0])


def _encode(table: Table, path: Path, metadata: dict[str, str] | None) -> None:
    """Encode one table to ``path``: a long table of fixed-width columns is converted (and for :class:`RowSlices`
    made) one row group at a time, so only one row group's data exists at once."""
    part: Callable[[int, int], pa.Table]
    if isinstance(table, RowSlices):
        rows, part = table.rows, table.arrow
    else:
        sliceable = all(
            isinstance(dtype, pd.CategoricalDtype) or (isinstance(dtype, np.dtype) and dtype.kind in "iufb")
            for dtype in table.dtypes
        )  # every slice converts to the same Arrow types
        if len(table) <= ROW_GROUP or not sliceable:
            arrow = _arrow(table, metadata)
            pq.write_table(arrow, path, row_group_size=ROW_GROUP, **_options(arrow.schema))
            return
        rows, part = len(table), lambda start, stop: to_arrow(table.iloc[start:stop])
    first = _with_metadata(part(0, min(ROW_GROUP, rows)), metadata)
    with pq.ParquetWriter(path, first.schema, **_options(first.schema)) as out:
        out.write_table(first, row_group_size=ROW_GROUP)
        del first
        for start in range(ROW_GROUP, rows, ROW_GROUP):
            piece = _with_metadata(part(start, min(start + ROW_GROUP, rows)), metadata)
            out.write_table(piece, row_group_size=ROW_GROUP)
            del piece


def write_tables(
    frames: Mapping[str, Table | Callable[[], Table]],
    folder: Path,
    metadata: dict[str, str] | None = None,
    on_table: Callable[[str], Any] | None = None,
) -> None:
    """One file per table. ``frames`` may hold functions that compute a table, each called only when its turn
    comes. The first table (the biggest: events) is written in a second thread while the others are computed and
    written here one by one, so the two overlap (Parquet encoding and most numpy work run without the GIL) and
    no more than one of the other tables exists at a time. ``on_table(name)`` is called as each table is done."""
    items = list(frames.items())
    if not items:
        return
    (first_name, first), rest = items[0], items[1:]
    wall, cpu = time.perf_counter(), phase_clock.cpu()
    with ThreadPoolExecutor(max_workers=1) as writer:
        pending = writer.submit(
            _write, _made(first) if callable(first) else first, folder / f"{first_name}.parquet", metadata
        )
        del first
        try:
            for name, item in rest:
                _write(_made(item) if callable(item) else item, folder / f"{name}.parquet", metadata)
                release_memory()
                if on_table is not None:
                    on_table(name)
        finally:
            pending.result()
    release_memory()
    if on_table is not None:
        on_table(first_name)
    if phase_clock.ENABLED:
        _CLOCK.emit()
        phase_clock.emit("tables+parquet", time.perf_counter() - wall, phase_clock.cpu() - cpu)


def _made(make: Callable[[], Table]) -> Table:
    t0 = time.perf_counter()
    table = make()
    _CLOCK.add("tables", time.perf_counter() - t0)
    return table


def write_parquet(
    parsed: ParsedTrace,
    out_dir: str | Path,
    *,
    force: bool = False,
    on_table: Callable[[str], Any] | None = None,
    release: bool = False,
) -> Path:
    """Write every table of ``parsed`` into ``out_dir`` (atomically: all tables or nothing); ``on_table(name)``
    is called as each table is written (e.g. to advance a progress bar). ``release``: forget each table and value
    the writing computed once no later table reads it (for a caller that is done with ``parsed``'s tables)."""
    out_dir = Path(out_dir)
    metadata = {"profparse.source": path_text(parsed.path)}  # a name that is not UTF-8 as \xNN
    with atomic_dir(out_dir, force=force, verb="parse", inputs=[parsed.path]) as tmp:
        write_tables(table_makers(parsed, release=release), tmp, metadata, on_table)
    return out_dir


def read_parquet(out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Read a folder written by :func:`write_parquet` back into DataFrames."""
    out_dir = Path(out_dir)
    nullable_ints = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get
    return {p.stem: pq.read_table(p).to_pandas(types_mapper=nullable_ints) for p in sorted(out_dir.glob("*.parquet"))}
