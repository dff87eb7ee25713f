"""Parquet output: one file per table in a folder (readable by pandas, DuckDB, polars)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profparse import tables
from profparse.analysis import TABLES as ANALYSIS_TABLES
from profparse.outputs.files import atomic_dir
from profparse.trace.events import NULL

TABLES = ("events", "kernels", "ops", "stage_summary", "steps", "warnings") + ANALYSIS_TABLES


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """DataFrame with internal NULL-sentinel int64 columns -> Arrow table with real nulls."""
    columns = {}
    for name in frame.columns:
        series = frame[name]
        if series.dtype == np.int64:
            values = series.to_numpy()
            mask = values == NULL
            columns[name] = pa.array(values, mask=mask if mask.any() else None)
        elif isinstance(series.dtype, pd.CategoricalDtype):
            codes = series.cat.codes.to_numpy().astype(np.int32)
            missing = codes < 0
            columns[name] = pa.DictionaryArray.from_arrays(
                pa.array(codes, mask=missing if missing.any() else None),
                pa.array(series.cat.categories.astype(str).to_numpy(dtype=object), pa.string()),
            )
        else:
            columns[name] = pa.array(series.to_numpy(), from_pandas=True)
    return pa.table(columns)


def internal_tables(parsed: Any) -> dict[str, pd.DataFrame]:
    """The tables to write, with internal NULL sentinels."""
    raw, links, attribution = parsed.raw.events, parsed.links, parsed.attribution
    return {
        "events": parsed._analysis.add_substage(tables.event_table(raw, links, attribution)),
        "kernels": tables.kernel_table(raw, links, attribution),
        "ops": tables.op_table(raw, links, attribution),
        "stage_summary": tables.stage_summary(raw, links, attribution),
        "steps": attribution.steps,
        "warnings": parsed.warnings,
        **parsed._analysis.tables(),
    }


def _write_one(name: str, frame: pd.DataFrame, folder: Path, metadata: dict[str, str] | None) -> None:
    table = to_arrow(frame)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    # Dictionary pages only for text: on numbers (times, ids) they rarely pay off and cost a failed attempt each
    text = [f.name for f in table.schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    pq.write_table(table, folder / f"{name}.parquet", compression="zstd", use_dictionary=text)


def write_tables(frames: dict[str, pd.DataFrame], folder: Path, metadata: dict[str, str] | None = None) -> None:
    """One file per table; the biggest is written in a second thread (Parquet encoding runs without the GIL)."""
    if not frames:
        return
    names = sorted(frames, key=lambda name: len(frames[name]) * len(frames[name].columns), reverse=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        big = pool.submit(_write_one, names[0], frames[names[0]], folder, metadata)
        try:
            for name in names[1:]:
                _write_one(name, frames[name], folder, metadata)
        finally:
            big.result()


def write_parquet(parsed: Any, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write every table of ``parsed`` into ``out_dir`` (atomically: all tables or nothing)."""
    out_dir = Path(out_dir)
    metadata = {"profparse.source": str(parsed.path)}
    with atomic_dir(out_dir, force=force) as tmp:
        write_tables(internal_tables(parsed), tmp, metadata)
    return out_dir


def read_parquet(out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Read a folder written by :func:`write_parquet` back into DataFrames."""
    out_dir = Path(out_dir)
    nullable_ints = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get
    return {p.stem: pq.read_table(p).to_pandas(types_mapper=nullable_ints) for p in sorted(out_dir.glob("*.parquet"))}
