"""Allocated memory over time per device (``Total Allocated`` of ``[memory]`` events), over stage bands, stacked by
what the bytes hold (the ``memory_categories`` table: parameters, gradients, optimizer state, activations, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from profparse.analysis.memory_categories import CATEGORIES, live_by_category
from profparse.outputs.views._common import (
    STAGE_COLORS,
    Figure,
    Prepared,
    fmt_bytes,
    host_stage_bands,
    optional_table,
    stage_bands,
    time_unit,
    trace_title,
)
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "memory"
TITLE = "Memory allocated over time"
MAX_MEMORY_POINTS = 4000  # per device; longer series are reduced to the max per time bin
MIN_MEMORY_BYTES = 64 << 10  # devices whose allocations stay below this are not plotted
#: One colour per memory category, the same in the PNG and the report page.
CATEGORY_COLORS: dict[str, str] = {
    "parameter": "#4c72b0",
    "gradient": "#dd8452",
    "optimizer_state": "#8172b3",
    "activation": "#c44e52",
    "temporary": "#e5c062",
    "input": "#55a868",
    "before_trace": "#8c8c8c",
    "other": "#b8b8b8",
}


def _device_label(device: str, relative: bool) -> str:
    label = device.upper() if device == "cpu" else device
    return f"{label} (change since first event)" if relative else label


def memory_series(parsed: ParsedTrace) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(device label, ts_ns, bytes allocated) per device, from the analyses' memory table or ``[memory]`` events."""
    table = optional_table(parsed, "memory")
    if table is not None and {"ts_ns", "allocated_bytes", "device"} <= set(table.columns):
        out = []
        for device, group in table.groupby("device", observed=True, sort=True):
            g = group.dropna(subset=["allocated_bytes"]).sort_values("ts_ns", kind="stable")
            label = _device_label(str(device), "relative" in g.columns and bool(g["relative"].any()))
            values = g["allocated_bytes"].to_numpy(np.float64)
            if len(values):
                out.append((label, g["ts_ns"].to_numpy(np.int64), values))
        return out
    events = parsed.raw.events
    memory = (events["kind"] == "memory").to_numpy()
    allocated = events["mem_total_allocated_bytes"].to_numpy()
    change = events["mem_bytes"].to_numpy()
    rows = np.flatnonzero(memory & ((allocated != NULL) | (change != NULL)))
    if len(rows) == 0:
        return []
    dtype = events["mem_device_type"].to_numpy()[rows]
    dev = events["mem_device_id"].to_numpy()[rows]
    ts_all = events["ts_ns"].to_numpy()
    out = []
    for t, d in sorted(set(zip(dtype.tolist(), dev.tolist(), strict=True))):
        pick = rows[(dtype == t) & (dev == d)]
        pick = pick[np.argsort(ts_all[pick], kind="stable")]
        label = "CPU" if t == 0 else (f"GPU {d}" if t == 1 else f"device type {t} id {d}")
        total = allocated[pick]
        if (total != NULL).any():
            keep = pick[total != NULL]
            out.append((label, ts_all[keep], allocated[keep].astype(np.float64)))
        else:  # older traces: only the size of each allocation / free; plot the running sum
            delta = np.where(change[pick] == NULL, 0, change[pick]).astype(np.float64)
            out.append((f"{label} (change since first event)", ts_all[pick], np.cumsum(delta)))
    return out


def category_series(parsed: ParsedTrace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per device label (as :func:`memory_series` names it): ts_ns and the bytes live per category after each
    event (one column per :data:`CATEGORIES`, adding up to Total Allocated), from the ``memory_categories`` table."""
    try:
        memory, table = parsed.table("memory"), parsed.table("memory_categories")
    except (AttributeError, KeyError):
        return {}
    if memory.empty or "allocated_bytes" not in memory.columns:
        return {}
    live = live_by_category(parsed.raw.events, memory, table).astype(np.float64)
    device = memory["device"].cat.codes.to_numpy()
    relative = memory["relative"].to_numpy() if "relative" in memory.columns else np.zeros(len(memory), bool)
    ts = memory["ts_ns"].to_numpy(np.int64)
    out = {}
    for code, name in enumerate(memory["device"].cat.categories):
        rows = np.flatnonzero(device == code)
        if len(rows):
            out[_device_label(str(name), bool(relative[rows].any()))] = (ts[rows], live[rows])
    return out


def peak_rows(ts: np.ndarray, values: np.ndarray, bins: int) -> np.ndarray:
    """At most ``bins`` rows, in time order: the highest value of each time bin (peaks stay visible, and a row
    keeps its own point, so what is stacked at it still adds up to it)."""
    if len(ts) <= bins:
        return np.arange(len(ts))
    edges = np.linspace(ts[0], ts[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, bins - 1)
    order = np.lexsort((-np.arange(len(ts)), values, which))  # per bin, the highest value (its first row) last
    last = np.r_[which[order][1:] != which[order][:-1], True]
    return np.sort(order[last])


def _stacked(live: np.ndarray) -> dict[str, np.ndarray]:
    """{category: bytes live at each drawn point}, the categories that hold bytes at some point."""
    return {c: live[:, i] for i, c in enumerate(CATEGORIES) if np.any(live[:, i] != 0)}


#: event kinds that do not set the memory plot's time axis
UNTIMED = ("metadata", "instant")


def data(parsed: ParsedTrace) -> tuple[Prepared | None, str | None]:
    """Per device (peak >= 64 KiB): label, ts since the first event and bytes (at most 4000 points, the max per
    bin) and, where the allocations are labelled, the bytes live per category at those points; the host stage
    bands; the time span."""
    series = memory_series(parsed)
    if not series:
        return None, "no [memory] events (capture with profile_memory=True)"
    peaks = {label: float(np.abs(values).max()) if len(values) else 0.0 for label, _, values in series}
    series = [item for item in series if peaks[item[0]] >= MIN_MEMORY_BYTES]
    if not series:
        top = max(peaks.values())
        return None, f"[memory] events never reach {MIN_MEMORY_BYTES >> 10} KiB allocated (peak {top:,.0f} B)"
    events = parsed.raw.events
    # the time axis: spans, GPU activity and memory events, not Kineto's "Record Window End" instant (up to
    # ~100 ms after the last event of a capture) nor metadata
    timed = ~events["kind"].isin(UNTIMED).to_numpy()
    ts = events["ts_ns"].to_numpy()[timed]
    origin = int(ts.min())
    end = int((ts + events["dur_ns"].to_numpy()[timed]).max())
    by_category = category_series(parsed)
    devices = []
    for label, ts, values in series:
        keep = peak_rows(ts, values, MAX_MEMORY_POINTS)
        device = {"label": label, "ts_ns": (ts[keep] - origin).astype(np.int64), "bytes": values[keep]}
        category_ts, live = by_category.get(label, (None, None))
        if category_ts is not None and np.array_equal(category_ts, ts):
            device["categories"] = _stacked(live[keep])
        devices.append(device)
    bands = host_stage_bands(parsed)
    bands = bands.assign(start_ns=bands["start_ns"] - origin, end_ns=bands["end_ns"] - origin)
    return {
        "title": trace_title(parsed),
        "devices": devices,
        "bands": bands,
        "span_ns": end - origin,
    }, None


def _draw_device(ax: Any, dev: dict[str, Any], scale: float) -> str:
    """One device's axes: the categories stacked (where labelled) under the Total Allocated line; its byte unit."""
    ts, values = dev["ts_ns"] / scale, dev["bytes"]
    bscale, bunit = fmt_bytes(float(np.abs(values).max()) if len(values) else 0)
    categories = dev.get("categories") or {}
    if categories:
        ax.stackplot(
            ts,
            *(np.asarray(v) / bscale for v in categories.values()),
            colors=[CATEGORY_COLORS[c] for c in categories],
            step="post",
            alpha=0.9,
            linewidth=0,
        )
    ax.step(ts, values / bscale, where="post", color="#222222", linewidth=1.2)
    peak = int(np.argmax(values))
    ax.annotate(
        f"peak {values[peak] / bscale:,.1f} {bunit}",
        xy=(ts[peak], values[peak] / bscale),
        xytext=(6, -2),
        textcoords="offset points",
        fontsize=8,
        va="top",
    )
    low, high = min(float(values.min()), 0.0) / bscale, max(float(values.max()), 0.0) / bscale
    ax.set_ylim(low * 1.15, high * 1.15 if high > 0 else 1)
    ax.grid(alpha=0.25)
    return bunit


def _legends(fig: Any, stages: list[str], devices: list[dict[str, Any]]) -> None:
    """The stages shaded and the categories drawn on any device (in :data:`CATEGORIES` order), right of the plots:
    figure legends, each of which the layout makes room for (a second legend of an axes is not, and was cut off
    at the figure's edge when it was the wider one)."""
    from matplotlib.patches import Patch

    if stages:
        handles = [Patch(facecolor=STAGE_COLORS[s], label=s) for s in stages]
        fig.legend(handles=handles, title="stage", loc="outside right upper", frameon=False)
    shown = [c for c in CATEGORIES if any(c in (d.get("categories") or {}) for d in devices)]
    if shown:
        handles = [Patch(facecolor=CATEGORY_COLORS[c], label=c) for c in shown]
        fig.legend(handles=handles, title="category", loc="outside right lower", frameon=False)


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    devices, span = prepared["devices"], prepared["span_ns"]
    scale, unit = time_unit(span)
    fig, axes = plt.subplots(
        len(devices), 1, figsize=(13, 1.6 + 2.6 * len(devices)), sharex=True, squeeze=False, layout="constrained"
    )
    for i, (ax, dev) in enumerate(zip(axes[:, 0], devices, strict=True)):
        present = stage_bands(ax, prepared["bands"], 0, scale)
        bunit = _draw_device(ax, dev, scale)
        ax.set_ylabel(f"{dev['label']}\nallocated ({bunit})")
        if i == 0:
            _legends(fig, present, devices)
    axes[-1, 0].set_xlabel(f"time since first event ({unit})")
    axes[-1, 0].set_xlim(0, span / scale)
    stacked = ", stacked by category" if any(d.get("categories") for d in devices) else ""
    fig.suptitle(f"Memory allocated over time{stacked}, stages shaded: {prepared['title']}")
    return fig
