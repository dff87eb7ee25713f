"""The stage summary: one row per (step, stage) and per stage over the whole trace, from host and GPU time."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.gpu_time import gpu_time
from profparse.tables.host_time import host_time as host_time_of
from profparse.tables.host_time import step_labels
from profparse.tables.rows import stage_categorical
from profparse.tables.scopes import by_scope
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask

SUMMARY_COLUMNS = (
    "step",
    "stage",
    "host_wall_ns",
    "host_op_ns",
    "gpu_time_ns",
    "gpu_busy_ns",
    "gpu_overlap_ns",
    "gpu_idle_ns",
    "kernel_count",
    "gpu_activity_count",
    "launch_count",
    "memcpy_bytes",
)


def stage_summary(
    events: pd.DataFrame, links: Links, attribution: Attribution, host_time: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (step, stage) plus one per stage over the whole trace (``scope`` = ``total``).

    Host wall: :func:`host_time` (per step capped at the step window). GPU busy / overlap / idle: :func:`gpu_time`,
    summed over devices; per step they add up to the step's GPU spans. Total rows add up the rows of the steps and
    of ``outside_steps``.
    """
    step = attribution.step
    n_stages = len(STAGES)
    dur = events["dur_ns"].to_numpy()
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    kernel = kind_mask(events, {"kernel"})
    memcpy = kind_mask(events, {"gpu_memcpy"})
    op = kind_mask(events, {"cpu_op"}) & links.host
    launcher = np.zeros(len(events), dtype=bool)
    launcher[links.launch[links.launch >= 0]] = True
    launcher &= kind_mask(events, RUNTIME_KINDS)
    memcpy_bytes = events["bytes"].to_numpy()[memcpy]
    memcpy_bytes = np.where(memcpy_bytes == NULL, 0, memcpy_bytes)
    host = host_time_of(events, links, attribution) if host_time is None else host_time  # ParsedTrace computes it once
    gpu = gpu_time(events, attribution)

    step_values = step_labels(attribution)
    labels = np.concatenate([step_values, [NULL]])

    def step_rows(values: np.ndarray) -> np.ndarray:
        """Step numbers -> position in ``labels`` (the last one for NULL)."""
        pos = np.minimum(np.searchsorted(step_values, values), max(len(step_values) - 1, 0))
        found = (values != NULL) & (len(step_values) > 0)
        found[found] = step_values[pos[found]] == values[found]
        return np.where(found, pos, len(step_values))

    codes, distinct = pd.factorize(step, sort=True)  # step_rows of the few distinct steps, not of every event
    key = step_rows(np.asarray(distinct, dtype=np.int64))[codes] * n_stages + attribution.stage
    groups = len(labels) * n_stages

    def total(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(key[mask], weights=weights, minlength=groups).astype(np.int64)

    gpu_key = np.repeat(step_rows(gpu.step), n_stages) * n_stages + np.tile(np.arange(n_stages), len(gpu.step))
    host_rows = host[host["scope"] != "total"]
    frame = pd.DataFrame(
        {
            "scope": "step",
            "step": np.repeat(labels, n_stages),
            "stage": stage_categorical(np.tile(np.arange(n_stages), len(labels))),
            "host_wall_ns": host_rows["host_wall_ns"].to_numpy(),
            "host_op_ns": total(op, links.self_ns[op]),
            "gpu_time_ns": total(activity, dur[activity]),
            "gpu_busy_ns": np.bincount(gpu_key, weights=gpu.busy, minlength=groups).astype(np.int64),
            "gpu_overlap_ns": np.bincount(gpu_key, weights=gpu.overlap, minlength=groups).astype(np.int64),
            "gpu_idle_ns": np.bincount(gpu_key, weights=gpu.idle, minlength=groups).astype(np.int64),
            "kernel_count": total(kernel),
            "gpu_activity_count": total(activity),
            "launch_count": total(launcher),
            "memcpy_bytes": total(memcpy, memcpy_bytes),
        }
    )
    values = [c for c in frame.columns if c not in ("scope", "step", "stage")]
    present = (np.bincount(key, minlength=groups) > 0) | (frame[values].to_numpy() != 0).any(axis=1)
    totals = frame.groupby("stage", observed=False, sort=True)[values].sum().reset_index()
    totals.insert(0, "step", NULL)
    totals.insert(0, "scope", "total")
    totals["host_wall_ns"] = host.loc[host["scope"] == "total", "host_wall_ns"].to_numpy()
    frame = frame[present | (frame["step"] != NULL).to_numpy()]
    summary = pd.concat([frame, totals[frame.columns]], ignore_index=True)
    for column in values:
        summary[column] = summary[column].astype(np.int64)
    return by_scope(summary).reset_index(drop=True)
