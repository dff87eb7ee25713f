"""Quality checks that speak up when an answer may be doubtful.

Each check returns a row: ``check`` (a stable id), ``severity`` (``info``/``warning``/``error``), ``count``,
``value`` (a number in the check's unit, e.g. ns or a share) and a one-line ``message``. Only checks that found
something produce a row; an empty table means nothing looked wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.marks import STAGES
from profparse.trace.events import GPU_ACTIVITY_KINDS
from profparse.trace.link import kind_mask

COLUMNS = ("check", "severity", "count", "value", "message")
OTHER_SHARE_WARN = 0.05


def _row(check: str, severity: str, count: int, value: float, message: str) -> dict[str, Any]:
    return {"check": check, "severity": severity, "count": int(count), "value": float(value), "message": message}


def _profiled_window(events: pd.DataFrame, host: np.ndarray) -> tuple[int, int] | None:
    """The profiler's own span (category ``Trace``) if present, else the extent of host events."""
    trace_span = (events["category"] == "Trace").to_numpy()
    if trace_span.any():
        rows = np.flatnonzero(trace_span)
        ts = events["ts_ns"].to_numpy()[rows]
        end = ts + events["dur_ns"].to_numpy()[rows]
        return int(ts.min()), int(end.max())
    if not host.any():
        return None
    ts = events["ts_ns"].to_numpy()[host]
    end = ts + events["dur_ns"].to_numpy()[host]
    return int(ts.min()), int(end.max())


def _stream_overlaps(events: pd.DataFrame, activity: np.ndarray) -> tuple[int, int]:
    """(count, overlapping ns) of GPU activity that starts before the previous one on its stream ended."""
    rows = np.flatnonzero(activity)
    if len(rows) < 2:
        return 0, 0
    ts = events["ts_ns"].to_numpy()[rows]
    end = ts + events["dur_ns"].to_numpy()[rows]
    key = events["pid"].to_numpy()[rows] * 1_000_003 + events["tid"].to_numpy()[rows]
    order = np.lexsort((ts, key))
    key, ts, end = key[order], ts[order], end[order]
    same = key[1:] == key[:-1]
    reach = end[:-1]
    overlap = same & (ts[1:] < reach)
    return int(overlap.sum()), int(np.minimum(reach - ts[1:], end[1:] - ts[1:])[overlap].sum())


def _duplicate_rows(events: pd.DataFrame, mask: np.ndarray, key: list[str]) -> int:
    """``events.loc[mask, key].duplicated().sum()``, comparing only rows whose hash of ``key`` repeats."""
    rows = np.flatnonzero(mask)
    h = np.zeros(len(rows), dtype=np.uint64)
    for column in key:
        series = events[column]
        values = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) else series.to_numpy()
        h = h * np.uint64(0x9E3779B97F4A7C15) + values[rows].astype(np.uint64)  # wraps around: fine for a hash
    maybe = pd.Series(h).duplicated(keep=False).to_numpy()
    del h
    if not maybe.any():
        return 0
    return int(events.iloc[rows[maybe]][key].duplicated().sum())


def quality_checks(parsed: Any) -> pd.DataFrame:
    """Run every check on a parsed trace; one row per finding."""
    events = parsed.raw.events
    links = parsed.links
    attribution = parsed.attribution
    report = parsed.raw.report
    rows: list[dict[str, Any]] = []
    n = len(events)
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    gpu_total = int(dur[activity].sum())

    if report.truncated:
        rows.append(
            _row("truncated", "warning", report.events_read, report.truncated_at_byte or 0,
                 f"trace is truncated at byte {report.truncated_at_byte}; {report.events_read} events recovered")
        )  # fmt: skip
    for reason, count in report.dropped.items():
        rows.append(_row("dropped_events", "warning", count, 0, f"{count} events dropped as invalid: {reason}"))
    trailing = getattr(report, "trailing_bytes", 0)
    if trailing:
        message = f"{trailing} bytes after the end of the JSON document were ignored (no event lost)"
        rows.append(_row("trailing_data", "warning", trailing, 0, message))
    negative = int(events.attrs.get("negative_dur", 0))
    if negative:
        rows.append(
            _row("negative_duration", "warning", negative, 0, f"{negative} events had a negative dur (set to 0)")
        )

    unlinked = activity & (links.launch < 0)
    if unlinked.any():
        share = dur[unlinked].sum() / gpu_total if gpu_total else 0.0
        rows.append(
            _row("gpu_unlinked", "warning", unlinked.sum(), share,
                 f"{int(unlinked.sum())} GPU events ({share:.1%} of GPU time) have no launching runtime call")
        )  # fmt: skip

    window = _profiled_window(events, links.host)
    if window is not None and activity.any():
        outside = activity & ((ts < window[0]) | (ts + dur > window[1]))
        if outside.any():
            rows.append(
                _row("outside_window", "warning", outside.sum(), dur[outside].sum(),
                     f"{int(outside.sum())} GPU events lie (partly) outside the profiled window")
            )  # fmt: skip

    overlaps, overlap_ns = _stream_overlaps(events, activity)
    if overlaps:
        rows.append(
            _row("stream_overlap", "warning", overlaps, overlap_ns,
                 f"{overlaps} GPU events overlap the previous one on the same stream ({overlap_ns / 1e6:.3f} ms)")
        )  # fmt: skip

    launched = activity & (links.launch >= 0)
    if launched.any():
        early = launched.copy()
        early[launched] = ts[launched] < ts[links.launch[launched]]
        if early.any():
            rows.append(
                _row("timestamps_backwards", "warning", early.sum(), 0,
                     f"{int(early.sum())} GPU events start before the call that launched them (clock skew)")
            )  # fmt: skip

    key = ["ph", "name", "ts_ns", "dur_ns", "pid", "tid"]
    real = (events["kind"] != "metadata").to_numpy()
    duplicates = _duplicate_rows(events, real, key) if n else 0
    if duplicates:
        rows.append(_row("duplicate_events", "warning", duplicates, 0, f"{duplicates} events appear twice"))

    stage = attribution.stage
    stage_names = list(STAGES)
    present = {name: bool(((stage == code) & (links.host | activity)).any()) for code, name in enumerate(stage_names)}
    training = present["optimizer"] or present["backward"]
    for expected in ("forward", "backward", "optimizer"):
        if training and not present[expected]:
            rows.append(
                _row("missing_stage", "warning", 0, 0,
                     f"this looks like a training trace but no {expected} stage was found")
            )  # fmt: skip
    if not any(present[s] for s in ("forward", "backward", "optimizer", "load")):
        rows.append(_row("no_stages", "warning", 0, 0, "no stage could be attributed: everything is 'other'"))

    other = stage == stage_names.index("other")
    ops = kind_mask(events, {"cpu_op"}) & links.host
    op_total = links.self_ns[ops].sum()
    for label, mask, weights, total in (
        ("host op self time", ops, links.self_ns, op_total),
        ("GPU time", activity, dur, gpu_total),
    ):
        if total <= 0:
            continue
        share = float(weights[mask & other].sum() / total)
        if share > 0:
            unclassified = attribution.rule == attribution.rule_names.index("other.unclassified")
            loose = float(weights[mask & unclassified].sum() / total)
            severity = "warning" if loose > OTHER_SHARE_WARN else "info"
            rows.append(
                _row(f"other_share_{'gpu' if label == 'GPU time' else 'host'}", severity, int((mask & other).sum()),
                     share, f"{share:.1%} of {label} is in 'other' ({loose:.1%} unclassified)")
            )  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))
