"""The summary's "What bounds each step" section: per stage, the time on the steps' critical paths by what bounds
it (host Python, ops, launches, GPU compute, communication, copies, sync waits, data, GPU idle), and the events
longest on the path (the ``critical_path`` table, :mod:`profparse.analysis.critical_path`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.critical_path import BOUNDS
from profparse.base.formats import Column, Table, ms_text, share_text
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.trace.kinds import NULL

TOP_EVENTS = 5
GPU_BOUNDS = frozenset({"gpu_compute", "gpu_comm", "memcpy"})
LABEL_WIDTH = 50


def critical_path_data(path: pd.DataFrame, top: int = TOP_EVENTS) -> dict[str, Any]:
    """The section's data: per stage the ns on the path by bound (all steps summed), and the ``top`` events with
    the most time on the path (an event cut by its children counts all its segments)."""
    if path.empty:
        return {"steps": 0, "per_stage": [], "longest": []}
    ns = path["end_ns"].to_numpy() - path["start_ns"].to_numpy()
    frame = path.assign(ns=ns)
    table = frame.pivot_table(index="stage", columns="bound", values="ns", aggfunc="sum", observed=True, fill_value=0)
    per_stage = [
        {
            "stage": str(stage),
            "total_ns": int(table.loc[stage].sum()),
            "bounds": {str(b): int(table.loc[stage, b]) for b in BOUNDS if b in table.columns and table.loc[stage, b]},
        }
        for stage in STAGES
        if stage in table.index and table.loc[stage].sum()
    ]
    return {"steps": int(path["step"].nunique()), "per_stage": per_stage, "longest": _longest(frame, top)}


def _longest(frame: pd.DataFrame, top: int) -> list[dict[str, Any]]:
    # each event's time summed with numpy first, and only the rows of the ``top`` events grouped by pandas: a
    # copy of every segment row of a big trace's path, grouped, was the peak of summarize
    index = frame["trace_index"].to_numpy()
    rows = np.flatnonzero(index != NULL)
    if not len(rows):
        return []
    order = rows[np.argsort(index[rows], kind="stable")]
    starts = np.flatnonzero(np.concatenate([[True], index[order][1:] != index[order][:-1]]))
    totals = np.add.reduceat(frame["ns"].to_numpy()[order], starts)
    keys = index[order][starts]
    chosen_keys = keys[np.lexsort((keys, -totals))[:top]]  # ties: the earlier event
    del order, starts, totals, keys
    events = frame.iloc[rows[np.isin(index[rows], chosen_keys)]]
    grouped = events.groupby("trace_index", sort=False).agg(
        ns=("ns", "sum"),
        name=("name", "first"),
        step=("step", "first"),
        stage=("stage", "first"),
        bound=("bound", "first"),
    )
    order = np.lexsort((grouped.index.to_numpy(), -grouped["ns"].to_numpy()))[:top]  # ties: the earlier event
    chosen = grouped.iloc[order]
    return [
        {
            "trace_index": int(i),
            "name": str(r.name),
            "step": int(r.step),
            "stage": str(r.stage),
            "bound": str(r.bound),
            "ns": int(r.ns),
        }
        for i, r in zip(chosen.index, chosen.itertuples(index=False), strict=True)
    ]


def _labels(events: list[dict[str, Any]]) -> list[str]:
    """Short distinct names: a kernel's without its template arguments, a host event's as it is."""
    labels: list[str] = []
    for r in events:
        label = shorten_name(r["name"], LABEL_WIDTH, kernel=r["bound"] in GPU_BOUNDS)
        repeats = sum(1 for seen in labels if seen == label or seen.startswith(label + " ["))
        labels.append(f"{label} [{repeats + 1}]" if repeats else label)
    return labels


def _free(free: dict[str, int], whole: int, bound: str) -> dict[str, float]:
    """The row's share of the path replayed without the profiler (nothing when there is no such path)."""
    return {"without": free.get(bound, 0) / whole} if whole else {}


def critical_path_tables(data: dict[str, Any]) -> list[Table]:
    """Per stage the ms on the path by bound, and the longest events on it (none when no step has a path)."""
    section = data.get("critical_path") or {}
    per_stage = section.get("per_stage") or []
    if not per_stage:
        return []
    stages = [r["stage"] for r in per_stage]
    by_stage = {r["stage"]: r["bounds"] for r in per_stage}
    whole = sum(r["total_ns"] for r in per_stage)
    without = section.get("without_profiler") or {}
    free, free_whole = without.get("bounds") or {}, without.get("total_ns") or 0
    rows = []
    for bound in BOUNDS:  # one row per bound (columns per stage keep the lines short)
        cells = {stage: by_stage[stage].get(bound, 0) for stage in stages}
        total = sum(cells.values())
        if total or free.get(bound):
            share = total / whole if whole else None
            rows.append({"bound": bound, **cells, "total": total, "share": share, **_free(free, free_whole, bound)})
    every = {"bound": "all", **{r["stage"]: r["total_ns"] for r in per_stage}, "total": whole, "share": 1.0}
    rows.append({**every, **({"without": 1.0} if free_whole else {})})
    columns = [
        Column("bound", "bound"),
        *(Column(stage, stage, ms_text) for stage in stages),
        Column("total", "total", ms_text),
        Column("share", "share", share_text),
    ]
    note = f"ms on the critical path by stage, {section['steps']} steps summed"
    if free_whole:
        # its share of the steady steps' path replayed without the profiler (docs/without_profiler.md)
        columns.append(Column("without", "w/o profiler", share_text))
        note += f"; w/o profiler: {without['steps']} steady"
    tables = [Table("What bounds each step", columns, rows, note=note)]
    longest = section.get("longest") or []
    if longest:
        labels = _labels(longest)
        top_rows = [{**r, "label": label} for r, label in zip(longest, labels, strict=True)]
        top_columns = [
            Column("label", "event", code=True),
            Column("step", "step"),
            Column("stage", "stage"),
            Column("bound", "bound"),
            Column("ns", "ms on path", ms_text),
        ]
        tables.append(Table("Longest events on the critical path", top_columns, top_rows, last_left=False))
    return tables
