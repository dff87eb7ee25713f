"""The summary's "Memory at the peak, by category" section: per device and step, what is live at the step's highest
Total Allocated (the ``memory_peak_categories`` table), and which ops made the biggest activations live at the
device's highest peak (the ``memory_categories`` table, :mod:`profparse.analysis.memory_categories`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profparse.analysis.memory_categories import CATEGORIES
from profparse.base.arrays import as_text
from profparse.base.formats import STEP_ROWS, Column, Table, display, total_bytes_text
from profparse.trace.kinds import NULL

TOP_ACTIVATIONS = 5


def _step_peaks(peak: pd.DataFrame) -> list[dict[str, Any]]:
    """Per device and step: the stage whose peak is highest, that peak and its bytes per category."""
    rows: list[dict[str, Any]] = []
    for (device, step), group in peak.groupby(["device", "step"], observed=True, sort=True):
        highest = group.loc[group["peak_allocated_bytes"] == group["peak_allocated_bytes"].max()]
        first = highest.iloc[0]
        at_peak = highest[highest["stage"] == first["stage"]]
        live = {str(c): int(b) for c, b in zip(at_peak["category"], at_peak["live_bytes"], strict=True)}
        rows.append(
            {
                "device": str(device),
                "step": None if step == NULL else int(step),
                "stage": str(first["stage"]),
                "peak_allocated_bytes": int(first["peak_allocated_bytes"]),
                "peak_ts_ns": int(first["peak_ts_ns"]),
                **{c: live.get(c, 0) for c in CATEGORIES},
            }
        )
    return rows


def _top_activations(table: pd.DataFrame, device: str, at_ns: int, top: int) -> list[dict[str, Any]]:
    """The ops whose activations live at ``at_ns`` on ``device`` take the most bytes."""
    free = table["free_ts_ns"].to_numpy()
    live = (
        (table["device"].astype(str).to_numpy() == device)
        & (table["category"].astype(str).to_numpy() == "activation")
        & (table["ts_ns"].to_numpy() <= at_ns)
        & ((free == NULL) | (free > at_ns))
        & table["op_name"].notna().to_numpy()  # no op to name (astype(str) says "nan" before pandas 3, not after)
    )
    rows = table.loc[live, ["op_name", "bytes"]]
    grouped = rows.groupby(as_text(rows["op_name"]), sort=False)["bytes"].agg(["sum", "count"])
    grouped = grouped.sort_values("sum", ascending=False, kind="stable").head(top)
    return [
        {"device": device, "op": str(name), "bytes": int(r["sum"]), "count": int(r["count"])}
        for name, r in grouped.iterrows()
    ]


def memory_categories_data(peak: pd.DataFrame, table: pd.DataFrame, top: int = TOP_ACTIVATIONS) -> dict[str, list]:
    """The section's data (internal frames: NULL sentinels): step peaks, and the biggest live activations at each
    device's highest step peak."""
    steps = _step_peaks(peak) if len(peak) else []
    activations: list[dict[str, Any]] = []
    for device in dict.fromkeys(r["device"] for r in steps):
        highest = max((r for r in steps if r["device"] == device), key=lambda r: r["peak_allocated_bytes"])
        activations += _top_activations(table, device, highest["peak_ts_ns"], top)
    return {"step_peaks": steps, "top_activations": activations}


def _bytes(value: Any) -> str:
    return "-" if not value else total_bytes_text(value)


def _peak_table(device: str, steps: list[dict[str, Any]], several: bool) -> Table:
    shown = [c for c in CATEGORIES if any(r[c] for r in steps)]
    columns = [
        Column("step", "step", lambda s: "outside" if s is None else str(s)),
        Column("stage", "at"),
        Column("peak_allocated_bytes", "peak", total_bytes_text),
    ] + [Column(c, _LABELS.get(c, c), _bytes) for c in shown]
    title = f"Memory at the peak, by category, {display(device)}" if several else "Memory at the peak, by category"
    note = "" if several else f"{display(device)}; "
    note += "live at each step's highest Total Allocated; at: its stage"
    return Table(title, columns, steps, note=note, index=2, text_rows=STEP_ROWS)


_LABELS = {
    "optimizer_state": "optim state",
    "activation": "activations",
    "temporary": "temporaries",
    "before_trace": "before trace",
}


def memory_categories_tables(data: dict[str, Any]) -> list[Table]:
    """What fills each step's memory peak, per device (none when the trace has no allocation)."""
    section = data.get("memory_categories") or {}
    steps = section.get("step_peaks") or []
    if not steps or not any(r["peak_allocated_bytes"] for r in steps):
        return []
    devices = list(dict.fromkeys(r["device"] for r in steps))
    tables = [_peak_table(d, [r for r in steps if r["device"] == d], len(devices) > 1) for d in devices]
    activations = section.get("top_activations") or []
    if activations:
        columns = [
            Column("device", "device", display),
            Column("op", "op", display),
            Column("bytes", "live", total_bytes_text),
            Column("count", "allocations", lambda n: f"{n:,}"),
        ]
        note = "live at the highest step peak, by allocating op"
        tables.append(Table("Biggest activations at the peak", columns, activations, note=note, index=2, group=True))
    return tables
