"""Allocated memory over time per device (``Total Allocated`` of ``[memory]`` events), over stage bands."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from profparse.outputs.views._common import (
    Figure,
    Prepared,
    fmt_bytes,
    host_stage_bands,
    optional_table,
    stage_bands,
    stage_legend,
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


def memory_series(parsed: ParsedTrace) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(device label, ts_ns, bytes allocated) per device, from the analyses' memory table or ``[memory]`` events."""
    table = optional_table(parsed, "memory")
    if table is not None and {"ts_ns", "allocated_bytes", "device"} <= set(table.columns):
        out = []
        for device, group in table.groupby("device", observed=True, sort=True):
            g = group.dropna(subset=["allocated_bytes"]).sort_values("ts_ns", kind="stable")
            relative = "relative" in g.columns and bool(g["relative"].any())
            label = str(device).upper() if str(device) == "cpu" else str(device)
            label = f"{label} (change since first event)" if relative else label
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


def reduce_series(ts: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``bins`` points: the maximum per time bin (peaks stay visible)."""
    if len(ts) <= bins:
        return ts, values
    edges = np.linspace(ts[0], ts[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, bins - 1)
    peak = np.full(bins, -np.inf)
    np.maximum.at(peak, which, values)
    keep = np.isfinite(peak)
    return edges[:-1][keep].astype(np.int64), peak[keep]


def data(parsed: ParsedTrace) -> tuple[Prepared | None, str | None]:
    """Per device (peak >= 64 KiB): label, ts since the first event and bytes (at most 4000 points, the max per
    bin); the host stage bands; the time span."""
    series = memory_series(parsed)
    if not series:
        return None, "no [memory] events (capture with profile_memory=True)"
    peaks = {label: float(np.abs(values).max()) if len(values) else 0.0 for label, _, values in series}
    series = [item for item in series if peaks[item[0]] >= MIN_MEMORY_BYTES]
    if not series:
        top = max(peaks.values())
        return None, f"[memory] events never reach {MIN_MEMORY_BYTES >> 10} KiB allocated (peak {top:,.0f} B)"
    events = parsed.raw.events
    timed = events["ts_ns"].to_numpy()[(events["kind"] != "metadata").to_numpy()]
    origin = int(timed.min())
    devices = []
    for label, ts, values in series:
        ts, values = reduce_series(ts, values, MAX_MEMORY_POINTS)
        devices.append({"label": label, "ts_ns": (ts - origin).astype(np.int64), "bytes": values})
    bands = host_stage_bands(parsed)
    bands = bands.assign(start_ns=bands["start_ns"] - origin, end_ns=bands["end_ns"] - origin)
    return {
        "title": trace_title(parsed),
        "devices": devices,
        "bands": bands,
        "span_ns": int(timed.max()) - origin,
    }, None


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    devices, span = prepared["devices"], prepared["span_ns"]
    scale, unit = time_unit(span)
    fig, axes = plt.subplots(
        len(devices), 1, figsize=(13, 1.6 + 2.6 * len(devices)), sharex=True, squeeze=False, layout="constrained"
    )
    for i, (ax, dev) in enumerate(zip(axes[:, 0], devices, strict=True)):
        ts, values = dev["ts_ns"], dev["bytes"]
        bscale, bunit = fmt_bytes(float(np.abs(values).max()) if len(values) else 0)
        present = stage_bands(ax, prepared["bands"], 0, scale)
        ax.step(ts / scale, values / bscale, where="post", color="#222222", linewidth=1.2)
        peak = int(np.argmax(values))
        ax.annotate(
            f"peak {values[peak] / bscale:,.1f} {bunit}",
            xy=(ts[peak] / scale, values[peak] / bscale),
            xytext=(6, -2),
            textcoords="offset points",
            fontsize=8,
            va="top",
        )
        ax.set_ylabel(f"{dev['label']}\nallocated ({bunit})")
        low, high = min(float(values.min()), 0.0) / bscale, max(float(values.max()), 0.0) / bscale
        ax.set_ylim(low * 1.15, high * 1.15 if high > 0 else 1)
        ax.grid(alpha=0.25)
        if i == 0:
            stage_legend(ax, present, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1, 0].set_xlabel(f"time since first event ({unit})")
    axes[-1, 0].set_xlim(0, span / scale)
    fig.suptitle(f"Memory allocated over time, stages shaded: {prepared['title']}")
    return fig
