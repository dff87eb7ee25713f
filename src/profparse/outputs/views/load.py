"""Loading sub-steps (the analyses' ``load_breakdown`` table): time per sub-step, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.names import unique_labels
from profparse.outputs.views._common import (
    STAGE_COLORS,
    Figure,
    Prepared,
    fmt_time,
    optional_table,
    time_unit,
    trace_title,
)

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "load"
TITLE = "Loading sub-steps"


def _first(table: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    return next((c for c in names if c in table.columns), None)


def data(parsed: ParsedTrace) -> tuple[Prepared | None, str | None]:
    """Sub-steps in order of first start: name, label, total ns."""
    table = optional_table(parsed, "load_breakdown")
    if table is None:
        if not hasattr(type(parsed), "load_breakdown"):
            return None, "no load_breakdown table in this version of profparse"
        return None, "no loading sub-steps (no load stage, or no Python frames to split it: capture with_stack=True)"
    label = _first(table, ("substep", "sub_step", "name", "step_name"))
    value = _first(table, ("dur_ns", "time_ns", "wall_ns", "total_ns"))
    if label is None or value is None:
        if label is not None and {"start_ns", "end_ns"} <= set(table.columns):
            table = table.assign(dur_ns=table["end_ns"] - table["start_ns"])
            value = "dur_ns"
        else:
            return None, f"load_breakdown has no sub-step/time columns ({', '.join(map(str, table.columns))})"
    grouped = table.groupby(label, sort=False, observed=True)[value].sum()
    if "start_ns" in table.columns:
        starts = table.groupby(label, sort=False, observed=True)["start_ns"].min()
        grouped = grouped.reindex(starts.sort_values().index)
    grouped = grouped[grouped > 0]
    if grouped.empty:
        return None, "load_breakdown has no time"
    names = [str(i) for i in grouped.index]
    rows = pd.DataFrame({"name": names, "label": unique_labels(names, 44), "total_ns": grouped.to_numpy(np.int64)})
    return {"title": trace_title(parsed), "substeps": rows}, None


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    rows = prepared["substeps"]
    values = rows["total_ns"].to_numpy(float)
    scale, unit = time_unit(float(values.max()))
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.4 * len(rows)), layout="constrained")
    y = np.arange(len(rows))
    total = float(values.sum())
    ax.barh(y, values / scale, color=STAGE_COLORS["load"], height=0.7)
    for yi, v in zip(y, values, strict=True):
        ax.text(v / scale, yi, f"  {v / scale:,.2f} {unit}  {v / total:.0%}", va="center", fontsize=8)
    ax.set_yticks(y, list(rows["label"]))
    ax.invert_yaxis()
    ax.set_xlim(0, values.max() / scale * 1.25)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(f"Loading sub-steps ({fmt_time(total)} in all): {prepared['title']}")
    return fig
