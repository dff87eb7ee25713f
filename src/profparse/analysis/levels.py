"""The stage x level matrix: where each stage's time goes, from Python down to the device.

Host levels split the stage's host wall time (``stage_summary.host_wall_ns``) exactly, with no double counting
(see :func:`profparse.tables.host_time.host_time`): at each moment of the stage's wall time, the innermost event of each
thread running the stage gives a level, and where several threads run the stage at once the moment counts once,
for the first of ops, Python inside ops, runtime calls, Python, synchronize, waiting:

- ``python_ns``: Python frames and user ranges outside any op (interpreter time);
- ``op_ns``: CPU ops (the framework op layer), including Python frames running inside an op (Python
  decompositions), reported on their own as ``op_python_ns``;
- ``runtime_ns``: CUDA/HIP runtime and driver calls (launches, copies), including ``sync_ns`` in ``*Synchronize``
  calls;
- ``wait_ns``: a thread blocked in a waiting Python frame (``threading`` waits, locks, queues, sleeps, the main
  thread in ``run_backward`` while the engine's threads work), when no thread runs the stage's work meanwhile;

so ``python_ns + op_ns + runtime_ns + wait_ns == host_wall_ns``. Device levels:

- ``device_ns``: duration of GPU activity (kernels, memcpy, memset) launched by the stage; ``device_busy_ns``,
  ``device_overlap_ns`` and ``device_idle_ns`` as ``gpu_busy_ns``, ``gpu_overlap_ns`` and ``gpu_idle_ns`` of
  ``stage_summary`` (:func:`profparse.tables.gpu_time.gpu_time`);
- launch latency: GPU start minus the start of the runtime call that launched it, per stage (count, mean,
  p50/p90/p99/max). GPU activity replayed by a CUDA / HIP graph launch (launch kind ``graph``: one call, many
  kernels, :mod:`profparse.stages.graph_launch`) has no launch of its own: it is left out of the latency figures
  and counted in ``graph_kernel_count``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.base.arrays import row_positions, taken
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.stages.graph_launch import graph_rule_mask
from profparse.tables.host_time import host_time as host_time_of
from profparse.tables.rows import stage_categorical
from profparse.tables.scopes import by_scope
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL, RUNTIME_KINDS
from profparse.trace.link import Links, kind_mask

HOST_COLUMNS = ("python_ns", "op_ns", "op_python_ns", "runtime_ns", "sync_ns", "wait_ns")
SUM_COLUMNS = (
    "device_ns",
    "python_count",
    "op_count",
    "runtime_count",
    "device_count",
    "graph_kernel_count",
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


def stage_levels(
    events: pd.DataFrame,
    links: Links,
    attribution: Attribution,
    stage_summary: pd.DataFrame,
    host_time: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per row of ``stage_summary`` (the internal one: scope, step, stage) with the level columns;
    ``host_time`` is :func:`profparse.tables.host_time.host_time`'s result where the caller has it already."""
    levels = _counted_levels(events, links, attribution)
    host = (host_time_of(events, links, attribution) if host_time is None else host_time).copy()  # not the cached one
    host["op_ns"] = host["op_ns"] + host["op_python_ns"]
    host["runtime_ns"] = host["runtime_ns"] + host["sync_ns"]
    host = host[["scope", "step", "stage_code", *HOST_COLUMNS]]

    # each summary row's counts and host times, looked up by (scope, step, stage_code): one row of each per key
    codes = stage_summary["stage"].cat.codes.to_numpy().astype(np.int64)
    key = [stage_summary["scope"].to_numpy(), stage_summary["step"].to_numpy(), codes]
    at_levels = row_positions(key, [levels[c].to_numpy() for c in ("scope", "step", "stage_code")])
    at_host = row_positions(key, [host[c].to_numpy() for c in ("scope", "step", "stage_code")])

    # the columns gathered first and made one frame at once: a column assigned to a frame costs ~0.3 ms
    out: dict[str, np.ndarray | pd.Categorical] = {
        "scope": key[0],
        "step": key[1],
        "stage": stage_categorical(codes),
    }
    for column in HOST_COLUMNS:
        out[column] = taken(host[column].to_numpy(), at_host, 0).astype(np.int64)
    out[SUM_COLUMNS[0]] = taken(levels[SUM_COLUMNS[0]].to_numpy(), at_levels, 0).astype(np.int64)
    for column in ("busy", "overlap", "idle"):
        out[f"device_{column}_ns"] = stage_summary[f"gpu_{column}_ns"].to_numpy().astype(np.int64)
    for column in SUM_COLUMNS[1:]:
        out[column] = taken(levels[column].to_numpy(), at_levels, 0).astype(np.int64)
    for column in LATENCY_COLUMNS:
        values = taken(levels[column].to_numpy(), at_levels, np.nan).astype(np.float64)
        out[column] = np.where(np.isnan(values), NULL, values).astype(np.int64)
    count = out["launch_latency_count"]
    out["launch_latency_count"] = np.where(count == NULL, 0, count)
    return pd.DataFrame(out)


def _counted_levels(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """Device time, counts per level and launch latency per (scope, step, stage_code): ``step`` rows per step
    (``outside_steps`` for events outside every step) and ``total`` rows per stage."""
    n_stages = len(STAGES)
    stage = attribution.stage  # int8: a key below is int64
    step = attribution.step
    dur = events["dur_ns"].to_numpy()
    python = kind_mask(events, {"python_function"}) & links.host
    in_op = links.enclosing_op >= 0
    op = kind_mask(events, {"cpu_op"}) & links.host
    runtime = kind_mask(events, RUNTIME_KINDS) & links.host
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    graph = activity & graph_rule_mask(attribution.rule, attribution.rule_names)
    launched = np.flatnonzero(activity & (links.launch >= 0) & ~graph)  # a graph replay has no launch per kernel
    latency = events["ts_ns"].to_numpy()[launched] - events["ts_ns"].to_numpy()[links.launch[launched]]

    measures = {
        "device_ns": (activity, dur),
        "python_count": (python & ~in_op, None),
        "op_count": (op, None),
        "runtime_count": (runtime, None),
        "device_count": (activity, None),
        "graph_kernel_count": (graph, None),
    }
    # a sorted factorize ranks the steps in one hash pass (NULL, the smallest int64, ranks first): np.unique and a
    # searchsorted would sort and search every event
    rank, sorted_steps = pd.factorize(step, sort=True)
    step_values = np.asarray(sorted_steps[sorted_steps != NULL], dtype=np.int64)
    step_index = rank.astype(np.int64, copy=False)  # shifted in place: no second int64 per event
    step_index -= len(sorted_steps) - len(step_values)
    step_index[step == NULL] = len(step_values)
    labels = np.concatenate([step_values, [NULL]])
    frames = []
    by_step: dict[str, np.ndarray] = {}
    key = step_index * n_stages + stage
    del rank, step_index
    for scope, keys in (("step", labels), ("total", np.array([NULL]))):
        groups = len(keys) * n_stages
        cols: dict[str, np.ndarray] = {
            "scope": np.full(groups, scope, dtype=object),
            "step": np.repeat(keys, n_stages),
            "stage_code": np.tile(np.arange(n_stages), len(keys)),
        }
        for column, (mask, weights) in measures.items():
            if scope == "total":  # the steps (and outside) partition the events: their sums, exactly
                cols[column] = by_step[column].reshape(len(labels), n_stages).sum(axis=0)
                continue
            w = None if weights is None else weights[mask]
            cols[column] = by_step[column] = np.bincount(key[mask], weights=w, minlength=groups).astype(np.int64)
        # the total's key is the stage alone
        cols.update(_latency(key[launched] if scope == "step" else stage[launched].astype(np.int64), latency, groups))
        frames.append(pd.DataFrame(cols))
    levels = pd.concat(frames, ignore_index=True)
    return by_scope(levels)


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
