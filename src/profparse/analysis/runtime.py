"""Runtime and driver calls per stage and step: which CUDA/HIP calls the host spent its time in.

One row per (scope, step, stage, call name) with the call's ``count``, ``total_ns`` (sum of durations; a driver
call nested in a runtime call counts in both), ``max_ns`` and ``share`` of the stage's host wall time
(``stage_summary.host_wall_ns`` of the same scope, step and stage; calls on several threads at once can add up to
more than 1). ``call_class`` groups the names: ``malloc``, ``free``, ``sync``, ``memcpy``, ``memset``, ``launch``,
``other``. The quality checks ``allocator_churn`` and ``sync_in_step`` (``profparse.analysis.quality``) read this table.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.base.arrays import grouped, row_positions, taken, text_order
from profparse.stages.attribute import Attribution
from profparse.tables.host_time import SYNC_NAME
from profparse.tables.rows import stage_categorical
from profparse.tables.scopes import by_scope, scope_rank
from profparse.trace.kinds import NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask

#: (class, pattern) in order; the first that matches a call's name decides.
CALL_CLASSES: tuple[tuple[str, re.Pattern], ...] = (
    ("free", re.compile(r"(?i)^(cuda|hip)(Free|HostFree)|^cuMem(Free|Release)|^hipExtFree")),
    ("malloc", re.compile(r"(?i)^(cuda|hip)(Malloc|HostAlloc|HostMalloc|ExtMalloc)|^cuMem(Alloc|Create)")),
    ("sync", SYNC_NAME),
    ("memcpy", re.compile(r"(?i)memcpy")),
    ("memset", re.compile(r"(?i)memset")),
    ("launch", re.compile(r"(?i)launch")),
)
CLASSES = (*(name for name, _ in CALL_CLASSES), "other")
COLUMNS = ("scope", "step", "stage", "name", "call_class", "count", "total_ns", "max_ns", "host_wall_ns", "share")


def call_class(name: str) -> str:
    """The class of one runtime/driver call name (``cudaFree`` -> ``free``, ``hipDeviceSynchronize`` -> ``sync``)."""
    for label, pattern in CALL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def _host_wall(rows: pd.DataFrame, stage_summary: pd.DataFrame) -> np.ndarray:
    """The host wall time of each row's (scope, step, stage_code) in the stage summary (one row per key), 0 where
    it has none."""
    at = row_positions(
        [rows[c].to_numpy() for c in ("scope", "step", "stage_code")],
        [
            stage_summary["scope"].to_numpy(),
            stage_summary["step"].to_numpy(),
            stage_summary["stage"].cat.codes.to_numpy(),
        ],
    )
    return taken(stage_summary["host_wall_ns"].to_numpy(), at, 0).astype(np.int64)


def runtime_calls(
    events: pd.DataFrame, links: Links, attribution: Attribution, stage_summary: pd.DataFrame
) -> pd.DataFrame:
    """Per (scope, step, stage, name) of host runtime/driver calls; ``stage_summary`` is the internal stage summary.

    ``scope`` is ``step`` (one row per step), ``outside_steps`` (calls outside every step) or ``total``; rows are
    ordered by scope, step, stage, then time spent (most first).
    """
    rows = np.flatnonzero(kind_mask(events, RUNTIME_KINDS) & links.host)
    names = events["name"].cat.categories
    step = attribution.step[rows]
    keys = {
        "stage_code": attribution.stage[rows].astype(np.int64),
        "name_code": events["name"].cat.codes.to_numpy()[rows],
    }
    dur = events["dur_ns"].to_numpy()[rows]
    aggs = {"count": (dur, "size"), "total_ns": (dur, "sum"), "max_ns": (dur, "max")}
    frames = []
    for scope in ("step", "total"):
        steps = step if scope == "step" else np.full(len(step), NULL, dtype=np.int64)
        out = grouped({"step": steps, **keys}, aggs, sort=False)
        out["scope"] = scope
        frames.append(out)
    out = pd.concat(frames, ignore_index=True)
    by_scope(out)
    host_wall = _host_wall(out, stage_summary)
    used = np.unique(out["name_code"].to_numpy())
    classes = pd.Categorical([call_class(str(names[c])) for c in used], categories=list(CLASSES))
    result = pd.DataFrame(
        {
            "scope": out["scope"].to_numpy(),
            "step": out["step"].to_numpy().astype(np.int64),
            "stage": stage_categorical(out["stage_code"].to_numpy()),
            "name": pd.Categorical.from_codes(out["name_code"].to_numpy(), dtype=events["name"].dtype),
            "call_class": classes.take(np.searchsorted(used, out["name_code"].to_numpy())),
            "count": out["count"].to_numpy().astype(np.int64),
            "total_ns": out["total_ns"].to_numpy().astype(np.int64),
            "max_ns": out["max_ns"].to_numpy().astype(np.int64),
            "host_wall_ns": host_wall,
            "share": np.divide(
                out["total_ns"].to_numpy(dtype=np.float64),
                host_wall,
                out=np.full(len(out), np.nan),
                where=host_wall > 0,
            ),
        }
    )
    if result.empty:
        result["name"] = pd.Categorical([], dtype=events["name"].dtype)
        result["call_class"] = pd.Categorical([], categories=list(CLASSES))
    scope_order = scope_rank(result["scope"])
    # equal times by name: the same order whatever order the file wrote the calls in
    by_name = text_order(result["name"])
    order = np.lexsort(
        (by_name, -result["total_ns"].to_numpy(), result["stage"].cat.codes, result["step"], scope_order)
    )
    return result.iloc[order].reset_index(drop=True)[list(COLUMNS)]
