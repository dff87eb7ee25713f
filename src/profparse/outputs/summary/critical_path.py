"""The summary's "What bounds each step" section: per stage, the time on the steps' critical paths by what bounds
it (host Python, ops, launches, GPU compute, communication, copies, sync waits, data, GPU idle), and the events
longest on the path (the ``critical_path`` table, :mod:`profparse.analysis.critical_path`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.critical_path import BOUNDS
from profparse.base.arrays import grouped
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
    # summed per stage and bound on the columns' codes: a copy of the path's rows (pivot_table's, or one with the
    # segment lengths added) is the biggest thing a big trace's summary would hold
    stage, bound = path["stage"].astype("category").cat, path["bound"].astype("category").cat
    stage_codes, bound_codes = stage.codes.to_numpy(), bound.codes.to_numpy()
    width = len(bound.categories)
    key = stage_codes.astype(np.intp)
    key *= width
    key += bound_codes
    weights = ns
    if (stage_codes < 0).any() or (bound_codes < 0).any():  # a row without a stage or bound is in no cell
        known = (stage_codes >= 0) & (bound_codes >= 0)
        key, weights = key[known], ns[known]
    sums = np.bincount(key, weights=weights, minlength=len(stage.categories) * width)
    sums = sums.reshape(len(stage.categories), width)
    del key, weights
    by_stage = {
        str(name): dict(zip(map(str, bound.categories), row, strict=True))
        for name, row in zip(stage.categories, sums, strict=True)
    }
    per_stage = [
        {
            "stage": name,
            "total_ns": int(sum(by_stage[name].values())),
            "bounds": {b: int(by_stage[name][b]) for b in BOUNDS if by_stage[name].get(b)},
        }
        for name in STAGES
        if sum(by_stage.get(name, {}).values())
    ]
    return {"steps": int(path["step"].nunique()), "per_stage": per_stage, "longest": _longest(path, ns, top)}


def _longest(path: pd.DataFrame, ns: np.ndarray, top: int) -> list[dict[str, Any]]:
    # each event's time summed by its index (one float per event: exact below 2^53 ns), and only the rows of the
    # ``top`` events grouped by pandas: sorting the path's rows by event, or grouping a copy of them, was the peak
    # of summarize on a big trace
    index = path["trace_index"].to_numpy()
    on_path = index != NULL
    if not on_path.any():
        return []
    on_path_index = index[on_path]
    totals = np.bincount(on_path_index, weights=ns[on_path])
    first = np.full(len(totals), np.iinfo(np.int64).max)  # each event's first time on the path
    np.minimum.at(first, on_path_index, path["start_ns"].to_numpy()[on_path])
    present = np.zeros(len(totals), dtype=bool)
    present[on_path_index] = True
    del on_path_index
    keys = np.flatnonzero(present)
    totals, first = totals[keys], first[keys]
    # ties: the earlier event in time, then in the file (a trace need not write events in time order)
    chosen_keys = keys[np.lexsort((keys, first, -totals))[:top]]
    del on_path, totals, first, present, keys
    picked = np.flatnonzero(np.isin(index, chosen_keys))
    rows = path.iloc[picked]
    event = index[picked]
    per_event = grouped(
        {"trace_index": event},
        {"first": (rows["start_ns"].to_numpy(), "min"), "row": (np.arange(len(picked)), "first")},
        sort=False,
    )
    per_event["ns"] = pd.Series(ns[picked]).groupby(event, sort=False).sum().to_numpy()  # (pandas: compensated)
    order = np.lexsort((per_event["trace_index"], per_event["first"], -per_event["ns"].to_numpy()))[:top]
    chosen = per_event.iloc[order]
    named = rows.iloc[chosen["row"].to_numpy()]
    columns = (chosen["trace_index"], named["name"], named["step"], named["stage"], named["bound"], chosen["ns"])
    return [
        {
            "trace_index": int(i),
            "name": str(name),
            "step": int(step),
            "stage": str(stage),
            "bound": str(bound),
            "ns": int(total),
        }
        for i, name, step, stage, bound, total in zip(*columns, strict=True)
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
