"""Memory per stage from the allocator's ``[memory]`` events (``profile_memory=True``).

Each event is one allocation (``Bytes`` > 0) or free (``Bytes`` < 0) with the allocator's totals *after* it
(``Total Allocated``, ``Total Reserved``), on one device (``Device Type``, ``Device Id``). Events take the stage
and step of the op they happen in. Legacy traces without totals get ``allocated_bytes`` as a running sum of
``Bytes`` from the first event (``relative`` = True: the level before the trace is unknown).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.base.arrays import grouped
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.rows import stage_categorical
from profparse.tables.scopes import by_scope, scope_rank
from profparse.trace.kinds import NULL
from profparse.trace.link import Links, kind_mask

# c10::DeviceType codes (the ones that matter for traces; ROCm reports CUDA)
DEVICE_TYPES = {
    0: "cpu",
    1: "cuda",
    2: "mkldnn",
    6: "hip",
    9: "xla",
    12: "xpu",
    13: "mps",
    14: "meta",
    20: "privateuse1",
}
TIMELINE_COLUMNS = (
    "trace_index",
    "ts_ns",
    "device",
    "device_type",
    "device_id",
    "bytes",
    "allocated_bytes",
    "reserved_bytes",
    "relative",
    "stage",
    "step",
    "op_name",
)
BY_STAGE_COLUMNS = (
    "scope",
    "step",
    "stage",
    "device",
    "start_allocated_bytes",
    "end_allocated_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "alloc_bytes",
    "freed_bytes",
    "alloc_count",
    "free_count",
    "first_ts_ns",
    "last_ts_ns",
    "relative",
)


def device_label(device_type: int, device_id: int) -> str:
    kind = DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return kind if kind == "cpu" or device_id == NULL or device_id < 0 else f"{kind}:{int(device_id)}"


def _names_of(names: pd.Series, rows: np.ndarray) -> pd.Categorical:
    """The ``name`` of each row in ``rows`` (``-1`` = missing), sharing the name categories."""
    codes = names.cat.codes.to_numpy()
    return pd.Categorical.from_codes(np.where(rows >= 0, codes[np.maximum(rows, 0)], -1), dtype=names.dtype)


def memory_timeline(events: pd.DataFrame, links: Links, attribution: Attribution) -> pd.DataFrame:
    """One row per ``[memory]`` event, ordered by device then time."""
    rows = np.flatnonzero(kind_mask(events, {"memory"}))
    col = {c: events[c].to_numpy()[rows] for c in ("trace_index", "ts_ns", "mem_device_type", "mem_device_id")}
    nbytes = events["mem_bytes"].to_numpy()[rows]
    nbytes = np.where(nbytes == NULL, 0, nbytes)
    dtype = np.where(col["mem_device_type"] == NULL, 0, col["mem_device_type"])
    did = np.where(col["mem_device_id"] == NULL, -1, col["mem_device_id"])
    pairs = pd.DataFrame({"t": dtype, "i": did})
    codes, uniques = pd.MultiIndex.from_frame(pairs).factorize() if len(rows) else (np.zeros(0, np.int64), [])
    labels = [device_label(t, i) for t, i in uniques]
    categories = sorted(set(labels))
    device = pd.Categorical.from_codes(
        np.array([categories.index(label) for label in labels], dtype=np.int64)[codes] if len(rows) else codes,
        categories=categories,
    )
    order = np.lexsort((col["trace_index"], col["ts_ns"], device.codes))
    allocated = events["mem_total_allocated_bytes"].to_numpy()[rows]
    reserved = events["mem_total_reserved_bytes"].to_numpy()[rows]
    frame = pd.DataFrame(
        {
            "trace_index": col["trace_index"],
            "ts_ns": col["ts_ns"],
            "device": device,
            "device_type": dtype,
            "device_id": did,
            "bytes": nbytes,
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "relative": allocated == NULL,
            "stage": stage_categorical(attribution.stage[rows]),
            "step": attribution.step[rows],
            "op_name": _names_of(events["name"], links.enclosing_op[rows]),
        }
    ).iloc[order]
    frame = frame.reset_index(drop=True)
    missing = frame["relative"].to_numpy()
    if missing.any():  # legacy: running sum per device where the trace gives no totals
        running = frame.groupby("device", observed=True)["bytes"].cumsum().to_numpy()
        frame.loc[missing, "allocated_bytes"] = running[missing]
    return frame


def counted_bytes(timeline: pd.DataFrame) -> np.ndarray:
    """Each event's ``Bytes`` where it moved ``Total Allocated``, else 0.

    Some events change only the reserve: CPU captures hold one ``Bytes = 1,020,864`` event whose ``Total
    Allocated`` stays 0 and whose ``Total Reserved`` becomes 1,020,864 (an allocator reserving a pool). Counting
    it as allocated would print ``allocated 997 KiB`` next to ``peak 172 B``; it shows in ``peak_reserved_bytes``.
    The first event of a device is counted (the level before it is unknown); so are legacy running sums.
    """
    allocated = timeline["allocated_bytes"].to_numpy()
    nbytes = timeline["bytes"].to_numpy()
    device = timeline["device"].cat.codes.to_numpy()  # rows are in time order within each device
    first = np.ones(len(device), dtype=bool)
    first[1:] = device[1:] != device[:-1]
    previous = np.concatenate([[0], allocated[:-1]])
    moved = first | timeline["relative"].to_numpy() | (allocated - previous == nbytes)
    return np.where(moved, nbytes, 0)


def memory_by_stage(memory: pd.DataFrame) -> pd.DataFrame:
    """Per (scope, step, stage, device): allocated at start/end, peaks, bytes allocated and freed.

    ``start_allocated_bytes`` is the device's total just before the group's first event, ``end`` just after its
    last, ``peak`` the highest total in between (the start included); ``alloc_bytes`` / ``freed_bytes`` sum the
    ``Bytes`` that moved the total (:func:`counted_bytes`: reserve-only events are left out). Totals are
    device-wide: allocations of other stages running at the same time (another thread) are in them. ``scope`` =
    ``step`` (one row per step and stage; ``outside_steps`` for events outside every step) or ``total`` (the whole
    trace per stage).
    """
    if memory.empty:
        return _empty_by_stage()
    t = memory
    allocated = t["allocated_bytes"].to_numpy()
    nbytes = counted_bytes(t)
    reserved = t["reserved_bytes"].to_numpy()
    before, after, ts = allocated - nbytes, allocated, t["ts_ns"].to_numpy()
    reserved = np.where(reserved == NULL, np.iinfo(np.int64).min, reserved)
    aggs = {  # (first and last: the rows are in time order within each device)
        "start": (before, "first"),
        "end": (after, "last"),
        "peak": (after, "max"),
        "peak_reserved": (reserved, "max"),
        "alloc_bytes": (np.where(nbytes > 0, nbytes, 0), "sum"),
        "freed_bytes": (np.where(nbytes < 0, -nbytes, 0), "sum"),
        "alloc_count": (nbytes > 0, "sum"),
        "free_count": (nbytes < 0, "sum"),
        "first_ts_ns": (ts, "min"),
        "last_ts_ns": (ts, "max"),
        "relative": (t["relative"].to_numpy(), "any"),
    }
    step = t["step"].to_numpy()
    keys = {"stage": t["stage"].cat.codes.to_numpy(), "device": t["device"].cat.codes.to_numpy()}
    frames = []
    for scope in ("step", "total"):
        steps = step if scope == "step" else np.full(len(step), NULL, dtype=step.dtype)
        out = grouped({"step": steps, **keys}, aggs, sort=True)
        out["scope"] = scope
        frames.append(out)
    out = pd.concat(frames, ignore_index=True)
    by_scope(out)
    result = pd.DataFrame(
        {
            "scope": out["scope"].to_numpy(),
            "step": out["step"].to_numpy().astype(np.int64),
            "stage": pd.Categorical.from_codes(out["stage"].to_numpy().astype(np.int8), categories=list(STAGES)),
            "device": pd.Categorical.from_codes(out["device"].to_numpy(), dtype=t["device"].dtype),
            "start_allocated_bytes": out["start"].to_numpy().astype(np.int64),
            "end_allocated_bytes": out["end"].to_numpy().astype(np.int64),
            "peak_allocated_bytes": np.maximum(out["peak"], out["start"]).to_numpy().astype(np.int64),
            "peak_reserved_bytes": np.where(
                out["peak_reserved"] == np.iinfo(np.int64).min, NULL, out["peak_reserved"]
            ).astype(np.int64),
            "alloc_bytes": out["alloc_bytes"].to_numpy().astype(np.int64),
            "freed_bytes": out["freed_bytes"].to_numpy().astype(np.int64),
            "alloc_count": out["alloc_count"].to_numpy().astype(np.int64),
            "free_count": out["free_count"].to_numpy().astype(np.int64),
            "first_ts_ns": out["first_ts_ns"].to_numpy().astype(np.int64),
            "last_ts_ns": out["last_ts_ns"].to_numpy().astype(np.int64),
            "relative": out["relative"].to_numpy().astype(bool),
        }
    )
    scope_order = scope_rank(result["scope"])
    order = np.lexsort((result["device"].cat.codes, result["stage"].cat.codes, result["step"], scope_order))
    return result.iloc[order].reset_index(drop=True)


def _empty_by_stage() -> pd.DataFrame:
    frame = pd.DataFrame({c: np.array([], np.int64) for c in BY_STAGE_COLUMNS})
    frame["scope"] = frame["scope"].astype(object)
    frame["stage"] = stage_categorical(np.array([], np.int8))
    frame["device"] = pd.Categorical([])
    frame["relative"] = frame["relative"].astype(bool)
    return frame
