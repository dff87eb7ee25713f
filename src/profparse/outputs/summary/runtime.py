"""The summary's "Runtime calls per stage" section: the CUDA/HIP runtime and driver calls the host spent most time
in, per stage (from the ``runtime_calls`` table, :mod:`profparse.analysis.runtime`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.base.formats import Table
from profparse.base.marks import STAGES
from profparse.outputs.summary.top import stage_top_table


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
    note = "host time per stage; share: of the stage's host wall"
    keys = ("call_class", "total_ns", "share", "count")
    return [stage_top_table("Runtime calls per stage", rows, "call", keys, note)]
