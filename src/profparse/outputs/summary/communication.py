"""The summary's "Communication" sections: collectives per stage, kind and process group, and how much of their
time no other GPU work overlaps (the ``collectives`` and ``comm_exposure`` tables, :mod:`profparse.analysis.comm`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profparse.analysis.comm import by_stage
from profparse.base.formats import Column, Table, display, ms_text, plain, total_bytes_text
from profparse.trace.kinds import NULL


def communication_data(
    table: pd.DataFrame, exposure: pd.DataFrame, steady: list[int] | None = None
) -> dict[str, list[dict]]:
    """The section's data: :func:`~profparse.analysis.comm.by_stage` rows and the exposure per stage (devices
    summed), over the whole trace and (``steady_exposure``) over the ``steady`` steps alone."""
    if table.empty and exposure.empty:  # no collective (most traces): the grouping of empty frames cost ~10 ms
        return {"by_stage": [], "exposure": [], "steady_exposure": []}
    rows = [{k: plain(v, null=NULL) for k, v in r.items()} for r in by_stage(table).to_dict("records")]
    total = exposure[exposure["scope"] == "total"]
    in_steady = exposure[(exposure["scope"] == "step") & exposure["step"].isin(steady or [])]
    return {"by_stage": rows, "exposure": _per_stage(total), "steady_exposure": _per_stage(in_steady)}


def _per_stage(exposure: pd.DataFrame) -> list[dict]:
    sums = ["comm_count", "comm_ns", "overlapped_ns", "exposed_ns"]
    per_stage = exposure.groupby("stage", observed=True, sort=True)[sums].sum().reset_index()
    return [
        {
            **{k: plain(v, null=NULL) for k, v in r.items()},
            "overlap_pct": 100 * r["overlapped_ns"] / r["comm_ns"] if r["comm_ns"] else None,
        }
        for r in per_stage.to_dict("records")
    ]


def _gbps(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _size(row: dict[str, Any]) -> str:
    if row["bytes"] is None:
        return "unknown"
    return total_bytes_text(row["bytes"]) + ("" if not row["unknown_bytes_count"] else "+?")


def communication_tables(data: dict[str, Any]) -> list[Table]:
    """Collectives per stage and kind, and their exposed time per stage (none when the trace has no collective)."""
    comm = data.get("communication") or {}
    if not comm.get("by_stage"):
        return []
    by_stage_rows = [{**r, "size": r} for r in comm["by_stage"]]
    columns = [
        Column("stage", "stage"),
        Column("kind", "collective"),
        Column("pg", "group", lambda v: display(v)),
        Column("count", "count", lambda n: f"{n:,}"),
        Column("size", "bytes", _size),
        Column("time_ns", "time ms", ms_text),
        Column("algbw_gbps", "algbw GB/s", _gbps),
        Column("busbw_gbps", "busbw GB/s", _gbps),
        Column("exposed_ns", "exposed ms", ms_text),
    ]
    records = [
        {"stage": r["stage"], "name": f"{r['kind']} {r['pg']}", "column": c, "value": r[c]}
        for r in comm["by_stage"]
        for c in ("count", "bytes", "time_ns", "algbw_gbps", "busbw_gbps", "exposed_ns")
    ]
    note = "collective kernels; exposed = not overlapped by other GPU work"
    tables = [Table("Communication per stage", columns, by_stage_rows, note=note, index=3, group=True, records=records)]
    exposure = [
        Column("stage", "stage"),
        Column("comm_ns", "comm ms", ms_text),
        Column("overlapped_ns", "overlapped ms", ms_text),
        Column("exposed_ns", "exposed ms", ms_text),
        Column("overlap_pct", "overlap", lambda v: "-" if v is None else f"{v:.1f}%"),
    ]
    tables.append(Table("Communication exposed per stage", exposure, comm["exposure"], note="all steps"))
    return tables
