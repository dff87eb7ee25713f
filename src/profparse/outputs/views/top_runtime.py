"""The runtime and driver calls (launches, copies, synchronisation) with the most host time, per stage.

Built from the ``runtime_calls`` table (analysis/runtime.py), the same numbers as the summary's "Runtime calls".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.base.names import unique_labels
from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import TOP_N, top_draw, with_title

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "top_runtime"
TITLE = "Top runtime calls per stage"


def data(parsed: ParsedTrace, n: int = TOP_N) -> tuple[Prepared | None, str | None]:
    """Per stage, the ``n`` calls with the most host time over the whole trace; ``share``: of the stage's host
    wall (the summary's "Runtime calls per stage" shows the same rows)."""
    table = parsed.runtime_calls
    totals = table[(table["scope"] == "total").to_numpy() & (table["total_ns"] > 0).to_numpy()]
    if totals.empty:
        return None, "no runtime calls in this trace (CPU only)"
    stages = []
    for stage in STAGES:
        mine = totals[(totals["stage"] == stage).to_numpy()].sort_values("total_ns", ascending=False, kind="stable")
        if mine.empty:
            continue
        total = int(mine["total_ns"].sum())
        top = mine.head(n)
        names = [str(x) for x in top["name"]]
        rows = pd.DataFrame(
            {
                "name": names,
                "label": unique_labels(names, kernel=False),
                "total_ns": top["total_ns"].to_numpy(np.int64),
                "count": top["count"].to_numpy(np.int64),
                "share": top["share"].to_numpy(float),  # of the stage's host wall, as in the summary
            }
        )
        stages.append({"stage": stage, "total_ns": total, "events": int(mine["count"].sum()), "top": rows})
    prepared = {"what": "host time", "heading": TITLE, "stages": stages}
    return with_title(prepared, parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
