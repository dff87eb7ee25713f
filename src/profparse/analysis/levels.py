"""The stage x level matrix: where each stage's time goes, from Python down to the device.

Levels (host self times do not overlap one another on a thread):

- ``python_ns``: self time of Python frames outside any op (interpreter time, including time a frame spends
  blocked, e.g. ``run_backward`` waiting for the autograd thread);
- ``op_ns``: self time of CPU ops (the framework op layer), plus the self time of Python frames running inside
  an op (Python decompositions), reported on its own as ``op_python_ns``;
- ``runtime_ns``: self time of CUDA/HIP runtime and driver calls (launches, copies, syncs), of which
  ``sync_ns`` in ``*Synchronize`` calls;
- ``device_ns``: duration of GPU activity (kernels, memcpy, memset) launched by the stage; ``device_busy_ns`` and
  ``device_idle_ns`` as in ``stage_summary`` (idle = gaps between the stage's first and last GPU activity in
  each step);
- launch latency: GPU start minus the start of the runtime call that launched it, per stage (count, mean,
  p50/p90/p99/max).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse import tables
from profparse.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.trace.events import GPU_ACTIVITY_KINDS, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask

SYNC = re.compile(r"(?i)synchroniz")
SUM_COLUMNS = (
    "python_ns",
    "op_ns",
    "op_python_ns",
    "runtime_ns",
    "sync_ns",
    "device_ns",
    "python_count",
    "op_count",
    "runtime_count",
    "device_count",
)
LATENCY_COLUMNS = (
    "launch_latency_count",
    "launch_latency_mean_ns",
    "launch_latency_p50_ns",
    "launch_latency_p90_ns",
    "launch_latency_p99_ns",
    "launch_latency_max_ns",
)
QUANTILES = ((0.5, "launch_latency_p50_ns"), (0.9, "launch_latency_p90_ns"), (0.99, "launch_latency_p99_ns"))


def stage_levels(events: pd.DataFrame, links: Links, attribution: Attribution, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per row of ``summary`` (the internal ``stage_summary``: scope, step, stage) with the level columns."""
    n_stages = len(STAGES)
    stage = attribution.stage.astype(np.int64)
    step = attribution.step
    dur = events["dur_ns"].to_numpy()
    self_ns = links.self_ns
    python = kind_mask(events, {"python_function"}) & links.host
    in_op = links.enclosing_op >= 0
    op = kind_mask(events, {"cpu_op"}) & links.host
    runtime = kind_mask(events, RUNTIME_KINDS) & links.host
    names = events["name"].cat.categories
    sync_codes = np.fromiter((SYNC.search(str(x)) is not None for x in names), dtype=bool, count=len(names))
    sync = runtime & sync_codes[events["name"].cat.codes.to_numpy()]
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    launched = np.flatnonzero(activity & (links.launch >= 0))
    latency = events["ts_ns"].to_numpy()[launched] - events["ts_ns"].to_numpy()[links.launch[launched]]

    measures = {
        "python_ns": (python & ~in_op, self_ns),
        "op_ns": (op | (python & in_op), self_ns),
        "op_python_ns": (python & in_op, self_ns),
        "runtime_ns": (runtime, self_ns),
        "sync_ns": (sync, self_ns),
        "device_ns": (activity, dur),
        "python_count": (python & ~in_op, None),
        "op_count": (op, None),
        "runtime_count": (runtime, None),
        "device_count": (activity, None),
    }
    step_values = np.unique(step[step != NULL])
    step_index = np.searchsorted(step_values, step)
    step_index[step == NULL] = len(step_values)
    labels = np.concatenate([step_values, [NULL]])
    frames = []
    for scope, index, keys in (("step", step_index, labels), ("total", np.zeros_like(step), np.array([NULL]))):
        key = index * n_stages + stage
        groups = len(keys) * n_stages
        cols: dict[str, np.ndarray] = {
            "scope": np.full(groups, scope, dtype=object),
            "step": np.repeat(keys, n_stages),
            "stage": np.tile(np.arange(n_stages), len(keys)),
        }
        for column, (mask, weights) in measures.items():
            w = None if weights is None else weights[mask]
            cols[column] = np.bincount(key[mask], weights=w, minlength=groups).astype(np.int64)
        cols.update(_latency(key[launched], latency, groups))
        frames.append(pd.DataFrame(cols))
    levels = pd.concat(frames, ignore_index=True)
    levels.loc[(levels["scope"] == "step") & (levels["step"] == NULL), "scope"] = "outside_steps"

    rows = summary[["scope", "step", "stage", "gpu_busy_ns", "gpu_idle_ns"]].copy()
    rows["stage_code"] = rows["stage"].cat.codes.astype(np.int64)
    merged = rows.merge(
        levels.rename(columns={"stage": "stage_code"}), on=["scope", "step", "stage_code"], how="left", sort=False
    )
    out = pd.DataFrame(
        {
            "scope": merged["scope"].to_numpy(),
            "step": merged["step"].to_numpy(),
            "stage": tables.stage_categorical(merged["stage_code"].to_numpy()),
        }
    )
    for column in SUM_COLUMNS[:6]:
        out[column] = merged[column].fillna(0).to_numpy().astype(np.int64)
    out["device_busy_ns"] = merged["gpu_busy_ns"].to_numpy().astype(np.int64)
    out["device_idle_ns"] = merged["gpu_idle_ns"].to_numpy().astype(np.int64)
    for column in SUM_COLUMNS[6:]:
        out[column] = merged[column].fillna(0).to_numpy().astype(np.int64)
    for column in LATENCY_COLUMNS:
        values = merged[column].to_numpy()
        out[column] = np.where(np.isnan(values.astype(np.float64)), NULL, values).astype(np.int64)
    out["launch_latency_count"] = np.where(out["launch_latency_count"] == NULL, 0, out["launch_latency_count"])
    return out


def _latency(key: np.ndarray, latency: np.ndarray, groups: int) -> dict[str, np.ndarray]:
    """Launch latency count/mean/quantiles/max per group (NaN where a group has no launches)."""
    out = {c: np.full(groups, np.nan) for c in LATENCY_COLUMNS}
    out["launch_latency_count"] = np.bincount(key, minlength=groups).astype(np.float64)
    if len(key) == 0:
        return out
    frame = pd.DataFrame({"key": key, "latency": latency})
    grouped = frame.groupby("key")["latency"]
    index = grouped.size().index.to_numpy()
    out["launch_latency_mean_ns"][index] = np.rint(grouped.mean().to_numpy())
    out["launch_latency_max_ns"][index] = grouped.max().to_numpy()
    for q, column in QUANTILES:
        out[column][index] = np.rint(grouped.quantile(q).to_numpy())
    return out
