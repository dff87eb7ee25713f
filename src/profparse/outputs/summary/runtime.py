"""The summary's "Runtime calls per stage" section: the CUDA/HIP runtime and driver calls the host spent most time
in, per stage (from the ``runtime_calls`` table, :mod:`profparse.analysis.runtime`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.base.formats import Column, Table, ms_text, share_text
from profparse.base.marks import STAGES


def top_calls(table: pd.DataFrame, top: int) -> dict[str, list[dict]]:
    """Per stage, the ``top`` calls by time over the whole trace (``total`` rows), as JSON-ready records."""
    totals = table[table["scope"] == "total"]
    out: dict[str, list[dict]] = {}
    for stage, rows in totals.groupby("stage", observed=True, sort=True):
        out[str(stage)] = [
            {
                "name": str(r.name),
                "call_class": str(r.call_class),
                "count": int(r.count),
                "total_ns": int(r.total_ns),
                "share": None if np.isnan(r.share) else float(r.share),
            }
            for r in rows.head(top).itertuples(index=False)
        ]
    return out


def runtime_calls_tables(data: dict[str, Any]) -> list[Table]:
    """The section's table: per stage its top calls (none when the trace has no runtime calls)."""
    top_calls = data.get("runtime_calls") or {}
    rows = [
        {"stage": stage, **item, "label": f"{item['name']} ({item['call_class']})"}
        for stage in STAGES
        for item in top_calls.get(stage) or []
    ]
    if not rows:
        return []
    columns = [
        Column("stage", "stage"),
        Column("total_ns", "ms", ms_text),
        Column("share", "share", share_text),
        Column("count", "calls", lambda n: f"{n:,}"),
        Column("label", "call", code=True),
    ]
    records = [
        {"stage": r["stage"], "name": r["name"], "column": c, "value": r[c]}
        for r in rows
        for c in ("call_class", "total_ns", "share", "count")
    ]
    note = "host time per stage; share: of the stage's host wall"
    title = "Runtime calls per stage"
    return [Table(title, columns, rows, note=note, index=1, last_left=True, group=True, records=records)]
