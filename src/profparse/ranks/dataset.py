"""The Parquet dataset: per-rank partitions ``<table>/rank=<r>/part-0.parquet``, plain tables, reading back."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profparse.base.errors import InputNotFoundError, TraceFormatError
from profparse.base.formats import path_text
from profparse.ranks.discovery import valid_rank
from profparse.ranks.results import RankResult

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

PLAIN_TABLES = ("ranks", "failed_ranks", "collective_matches")  # one file each, not partitioned
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def table_names() -> tuple[str, ...]:
    """The per-rank tables written for each rank: the same as a single-trace ``parse`` writes."""
    from profparse.tables.registry import written

    return tuple(spec.name for spec in written())


def partitioned_tables(out_dir: str | Path) -> list[str]:
    """The tables of a written dataset that are partitioned by rank (folders holding ``rank=<r>`` folders)."""
    root = Path(out_dir)
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name not in PLAIN_TABLES and _TABLE_NAME.fullmatch(p.name) and any(p.glob("rank=*"))
    )


def partition_dir(root: str | Path, table: str, rank: int) -> Path:
    """``root/<table>/rank=<r>``; ``rank`` must be a non-negative int (never text from a trace)."""
    rank = valid_rank(rank)
    if rank is None or not isinstance(table, str) or not _TABLE_NAME.fullmatch(table) or table in PLAIN_TABLES:
        raise ValueError(f"bad partition {table!r} / {rank!r}")
    return Path(root) / table / f"rank={rank}"


def write_rank_tables(parsed: ParsedTrace, root: str | Path, rank: int, metadata: dict[str, str] | None = None) -> dict:
    """Write every table of one parsed trace as ``root/<table>/rank=<r>/part-0.parquet``; returns row counts."""
    import pyarrow.parquet as pq

    from profparse.outputs.parquet import internal_tables, to_arrow

    frames = internal_tables(parsed)
    rows = {}
    written: list[Path] = []
    try:
        for name, frame in frames.items():
            table = to_arrow(frame)
            if metadata:
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
            folder = partition_dir(root, name, rank)
            folder.mkdir(parents=True, exist_ok=True)
            written.append(folder)
            pq.write_table(table, folder / "part-0.parquet", compression="zstd")
            rows[name] = table.num_rows
    except BaseException:
        for folder in written:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return rows


RANKS_COLUMNS = ("rank", "rank_source", "file", "status", "error", "exit_code", "events", "seconds")
# written since the devices were kept; a dataset without it reads back with no devices
RANKS_EXTRA_COLUMNS = ("devices",)


def ranks_table(results: Iterable[RankResult]) -> pd.DataFrame:
    """One row per input file: its rank, where the rank came from, ok/failed and why, the GPUs it ran on."""
    rows = [
        {
            "rank": r.rank,
            "rank_source": r.source,
            "file": path_text(r.path),  # a name that is not UTF-8 as \xNN (Arrow writes UTF-8 only)
            "status": "ok" if r.ok else "failed",
            "error": None if r.error is None else path_text(r.error),
            "exit_code": r.exit_code,
            "events": r.events,
            "seconds": round(r.seconds, 3),
            "devices": [str(d) for d in r.devices],
        }
        for r in sorted(results, key=lambda r: r.rank)
    ]
    return pd.DataFrame(rows, columns=[*RANKS_COLUMNS, *RANKS_EXTRA_COLUMNS])


def write_plain_parquet(frame: pd.DataFrame, folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("rank", pa.int64()),
            ("rank_source", pa.string()),
            ("file", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("exit_code", pa.int64()),
            ("events", pa.int64()),
            ("seconds", pa.float64()),
            ("devices", pa.list_(pa.string())),  # the devices that ran GPU work: deviceProperties names, else GPU <id>
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, folder / "part-0.parquet")


def _conform(table: Any, schema: Any) -> Any:
    import pyarrow as pa

    columns = [
        table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema
    ]
    return pa.table(columns, schema=schema.with_metadata(table.schema.metadata))


def unify_partitions(root: str | Path) -> list[str]:
    """Give every partition of a table the same schema (an all-null column in one rank is typed like the others).

    Readers take the schema of one file and cast the others to it, so a ``null``-typed column in the first file
    would make the whole table unreadable. Returns the tables that had to be rewritten.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    fixed = []
    for name in partitioned_tables(root):
        parts = sorted((Path(root) / name).glob("rank=*/part-0.parquet"))
        schemas = [pq.read_schema(p).remove_metadata() for p in parts]
        if len(parts) < 2 or all(s.equals(schemas[0]) for s in schemas[1:]):
            continue
        try:
            unified = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue
        for part, schema in zip(parts, schemas, strict=True):
            if schema.equals(unified):
                continue
            table = _conform(pq.read_table(part), unified)
            tmp = part.with_name(".part-0.parquet.partial")
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, part)
        fixed.append(name)
    return fixed


def read_table(out_dir: str | Path, table: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One table of a dataset written by :func:`parse_ranks`, all ranks, with an int ``rank`` column, by rank
    (only ``columns`` and ``rank`` when ``columns`` is given).

    A folder that only looks like such a dataset (files that are not Parquet, a table without ``rank``
    partitions) is a :class:`~profparse.base.errors.TraceFormatError` (exit 4), not an Arrow error."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    folder = Path(out_dir) / table
    if not _TABLE_NAME.fullmatch(table) or not folder.is_dir():
        raise InputNotFoundError(f"{folder}: no such table folder")
    partitioned = table not in PLAIN_TABLES
    partitioning = "hive" if partitioned else None
    try:
        frame = (
            ds.dataset(folder, format="parquet", partitioning=partitioning)
            .to_table(columns=None if columns is None else [*columns, *(["rank"] if partitioned else [])])
            .to_pandas(types_mapper=_nullable_ints)
        )
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise TraceFormatError(f"{folder}: not a readable profparse rank dataset table ({reason})") from None
    if partitioned and "rank" not in frame.columns:
        raise TraceFormatError(f"{folder}: not a profparse rank dataset table (no rank=N partitions)")
    if partitioned:
        frame["rank"] = _rank_numbers(folder, frame["rank"])
        frame = frame.sort_values("rank", kind="stable").reset_index(drop=True)
    return frame


def _rank_numbers(folder: Path, ranks: pd.Series) -> pd.Series:
    """The partitions' ranks as int64; a ``rank=abc`` (or negative, or fractional) folder is a TraceFormatError."""
    numbers = pd.to_numeric(ranks.astype("string"), errors="coerce")
    bad = ranks[numbers.isna() | (numbers < 0) | (numbers % 1 != 0)]
    if len(bad):
        raise TraceFormatError(f"{folder}: partition rank={bad.iloc[0]} is not a rank number (rank=N, N >= 0)")
    return numbers.astype("int64")


def _nullable_ints(arrow_type: Any) -> Any:
    import pyarrow as pa

    return {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get(arrow_type)


def is_rank_dataset(folder: str | Path) -> bool:
    """True for a folder written by :func:`parse_ranks` (``ranks/`` and ``stage_summary/`` inside)."""
    folder = Path(folder)
    return (folder / "ranks").is_dir() and (folder / "stage_summary").is_dir()


def results_from_dataset(out_dir: str | Path) -> list[RankResult]:
    """Rebuild the per-rank results (stage summaries, failures) from a written dataset."""
    table = read_table(out_dir, "ranks")
    summary = read_table(out_dir, "stage_summary")
    missing = sorted(set(RANKS_COLUMNS) - set(table.columns)) + sorted({"scope", "stage"} - set(summary.columns))
    if missing:
        raise TraceFormatError(f"{out_dir}: not a profparse rank dataset (columns missing: {', '.join(missing)})")
    names = _stage_names(out_dir)
    results = []
    for row in table.itertuples(index=False):
        ok = row.status == "ok"
        devices = getattr(row, "devices", None)
        results.append(
            RankResult(
                path=str(row.file),
                rank=int(row.rank),
                source=str(row.rank_source),
                ok=ok,
                error=None if pd.isna(row.error) else str(row.error),
                exit_code=int(row.exit_code),
                events=int(row.events),
                seconds=float(row.seconds),
                stage_summary=summary[summary["rank"] == int(row.rank)].drop(columns="rank") if ok else None,
                stage_names=names.get(int(row.rank)) if ok else None,
                devices=[str(d) for d in devices] if devices is not None and not _missing(devices) else [],
            )
        )
    return results


def _missing(value: Any) -> bool:
    """A null cell (None, NaN, NA), as opposed to a list (which ``pd.isna`` would test item by item)."""
    return value is None or (not hasattr(value, "__len__") and bool(pd.isna(value)))


def _stage_names(out_dir: str | Path) -> dict[int, pd.DataFrame]:
    """Per rank, the time per (stage, kernel or op name), from the dataset's ``kernels`` and ``ops`` tables."""
    from profparse.ranks.late import stage_name_totals

    root = Path(out_dir)
    if not (root / "kernels").is_dir() or not (root / "ops").is_dir():
        return {}
    kernels = read_table(root, "kernels", ["stage", "name", "dur_ns"])
    ops = read_table(root, "ops", ["stage", "name", "self_ns"])
    ranks = sorted(set(kernels["rank"]) | set(ops["rank"]))
    k, o = dict(list(kernels.groupby("rank"))), dict(list(ops.groupby("rank")))
    empty_k, empty_o = kernels.iloc[:0], ops.iloc[:0]
    return {int(r): stage_name_totals(k.get(r, empty_k), o.get(r, empty_o)) for r in ranks}


MATCH_WARNINGS_KEY = b"profparse.match_warnings"


def write_matches(frame: pd.DataFrame, folder: Path, warnings: Sequence[str]) -> None:
    """The ``collective_matches`` table (one file), the matching's warnings in its schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from profparse.ranks.late import match_schema

    types = match_schema()
    schema = pa.schema([(name, types[name]) for name in frame.columns])
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({MATCH_WARNINGS_KEY: json.dumps(list(warnings))})
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet", compression="zstd")


def read_matches(out_dir: str | Path) -> tuple[pd.DataFrame | None, list[str]]:
    """``collective_matches`` and its warnings; ``(None, [])`` for a dataset written before the table existed."""
    import pyarrow.parquet as pq

    folder = Path(out_dir) / "collective_matches"
    if not folder.is_dir():
        return None, []
    frame = read_table(out_dir, "collective_matches")
    try:
        metadata = pq.read_schema(folder / "part-0.parquet").metadata or {}
        warnings = json.loads(metadata.get(MATCH_WARNINGS_KEY, b"[]"))
    except (OSError, ValueError):
        warnings = []
    return frame, [str(w) for w in warnings] if isinstance(warnings, list) else []
