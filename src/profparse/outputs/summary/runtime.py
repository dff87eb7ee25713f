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
    """Per stage, the ``top`` calls by time over the whole trace (``total`` rows), as JSON-ready records. The table
    lists each stage's calls most time first; its rows are read as Python values once (a group-by and a tuple per
    row cost a few ms on a handful of rows)."""
    totals = table[(table["scope"] == "total").to_numpy()]
    stage = totals["stage"]
    codes = stage.cat.codes.to_numpy()
    columns = {c: totals[c].tolist() for c in ("name", "call_class", "count", "total_ns", "share")}
    out: dict[str, list[dict]] = {}
    for code, label in enumerate(stage.cat.categories.tolist()):
        rows = np.flatnonzero(codes == code)[:top].tolist()
        if rows:
            out[str(label)] = [
                {
                    "name": str(columns["name"][i]),
                    "call_class": str(columns["call_class"][i]),
                    "count": int(columns["count"][i]),
                    "total_ns": int(columns["total_ns"][i]),
                    "share": None if np.isnan(columns["share"][i]) else float(columns["share"][i]),
                }
                for i in rows
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
