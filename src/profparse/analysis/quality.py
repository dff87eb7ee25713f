"""Quality checks that speak up when an answer may be doubtful.

Each check returns a row: ``check`` (a stable id), ``severity`` (``info``/``warning``/``error``), ``count``,
``value`` (a number in the check's unit, e.g. ns or a share) and a one-line ``message``. Only checks that found
something produce a row; an empty table means nothing looked wrong.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from profparse.analysis.critical_path import blocking_calls
from profparse.analysis.profiler_cost import CALIBRATION_KEY
from profparse.base.arrays import as_text, text_order
from profparse.base.errors import ProfparseError
from profparse.base.formats import count_text
from profparse.base.marks import STAGES
from profparse.stages.collective_match import COLLECTIVE_RULE_NAMES
from profparse.stages.collective_order import ORDER_RULE_NAMES
from profparse.stages.gpu_inference import INFERENCE_RULES
from profparse.stages.rules import GPU_UNLINKED
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import kind_mask
from profparse.trace.source import open_trace

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

COLUMNS = ("check", "severity", "count", "value", "message")
OTHER_SHARE_WARN = 0.05
RUNTIME_SHARE_WARN = 0.01  # allocator or sync calls taking >= 1% of the steps' wall time are a warning, else info


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
    order = np.lexsort((end, ts, key))  # at one start, the shorter first: the same answer in any file order
    key, ts, end = key[order], ts[order], end[order]
    same = key[1:] == key[:-1]
    reach = end[:-1]
    overlap = same & (ts[1:] < reach)
    return int(overlap.sum()), int(np.minimum(reach - ts[1:], end[1:] - ts[1:])[overlap].sum())


#: Rows equal on every column are equal on these. Two columns leave as few rows as six did on the shared and sample
#: traces (at most 2 in a thousand) and hash in half the time.
_FIRST_KEY = ("ts_ns", "name")


def _repeated_hash(events: pd.DataFrame, rows: np.ndarray, columns: list[str]) -> np.ndarray:
    """Which of ``rows`` share their hash of ``columns`` with another of them."""
    h = np.zeros(len(rows), dtype=np.uint64)
    for column in columns:
        series = events[column]
        values = series.cat.codes.to_numpy() if isinstance(series.dtype, pd.CategoricalDtype) else series.to_numpy()
        h *= np.uint64(0x9E3779B97F4A7C15)  # wraps around: fine for a hash
        h += values[rows].astype(np.uint64, copy=False)
    # Sorting the hashes (numpy's SIMD sort) finds the repeated values; a hash lookup of those few marks their rows.
    # Same answer as pd.Series(h).duplicated(keep=False), ~5x faster.
    ordered = np.sort(h)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(repeated):
        return np.zeros(len(h), dtype=bool)
    return pd.Series(h).isin(np.unique(repeated)).to_numpy()


def _duplicate_rows(events: pd.DataFrame, mask: np.ndarray, key: list[str]) -> np.ndarray:
    """Rows (positions, in order) of ``mask`` that are equal to another row on every column of ``key``.

    Narrowed in two hashes: first on :data:`_FIRST_KEY` (start time, name), which on a real trace leaves a few
    rows in a thousand, then on every column of ``key`` for those; only rows whose full hash repeats are compared.
    The narrowing makes it ~10x faster than hashing all ~45 columns of every row."""
    rows = np.flatnonzero(mask)
    first = [c for c in _FIRST_KEY if c in key]
    for columns in (first, key):
        if not len(rows):
            break
        rows = rows[_repeated_hash(events, rows, columns)]
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    return rows[events.iloc[rows][key].duplicated(keep=False).to_numpy()]


class _AllEvents(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []  # noqa: N815 (the file's key)


def _same_in_file(path: str, events: pd.DataFrame, rows: np.ndarray) -> int | None:
    """How many of ``rows`` (equal to another of them on every table column) repeat an earlier one in the file,
    every field and ``args`` compared; None when the file cannot be read again. Reading the events again costs a
    pass over the file, paid only when some rows look the same in the tables."""
    try:
        with open_trace(path) as stream:
            raw = msgspec.json.decode(stream.read(), type=_AllEvents).traceEvents
    except (OSError, ProfparseError, msgspec.DecodeError, ValueError, EOFError):
        return None
    index = events["trace_index"].to_numpy()[rows]
    if len(index) and int(index.max()) >= len(raw):
        return None
    full = pd.Series([json.dumps(msgspec.json.decode(raw[i]), sort_keys=True) for i in index.tolist()], dtype=object)
    return int(full.duplicated().sum())


def gpu_devices(parsed: ParsedTrace) -> list[str]:
    """The devices that ran the trace's GPU activity, for headers: their names in ``deviceProperties`` (which lists
    every device of the machine, 8 for one rank of an 8-GPU node), else ``GPU <id>`` (traces without it); a trace
    with no GPU activity: the ``deviceProperties`` names (none for a CPU trace)."""
    properties = [d for d in parsed.header.get("deviceProperties", []) if isinstance(d, dict)]
    names = [str(d.get("name")) for d in properties]
    events = parsed.raw.events
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    if not activity.any():
        return names
    device = events["device"].to_numpy()[activity]
    device = np.where(device == NULL, events["pid"].to_numpy()[activity], device)
    used = {int(d) for d in np.unique(device)}
    if names:
        named = [str(d.get("name")) for d in properties if _device_id(d) in used]
        return named or names  # ids that name no listed device: the machine's list, as it is
    return [f"GPU {d}" for d in sorted(used)]


def _device_id(properties: dict[str, Any]) -> int | None:
    try:
        return int(properties.get("id"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _top_names(names: pd.Series, n: int = 3) -> str:
    """The most frequent names of ``names`` with their counts: ``ncclKernel_SendRecv x3, ...``."""
    counts = as_text(names).value_counts()
    more = f", +{len(counts) - n} more" if len(counts) > n else ""
    return ", ".join(f"{name} x{int(c)}" for name, c in counts.head(n).items()) + more


def _gpu_inference_rows(
    activity: np.ndarray, launch: np.ndarray, attribution: Any, dur: np.ndarray, gpu_total: int, names: pd.Series
) -> list[dict[str, Any]]:
    """GPU activity without a launching runtime call: how much got a stage by each inference rule (``info``, value
    in ns), and how much stayed ``other.gpu_unlinked`` (``warning``, value = share of GPU time)."""
    rows: list[dict[str, Any]] = []
    no_launch = activity & (launch < 0)
    if not no_launch.any():
        return rows
    rule_names = attribution.rule_names
    missing_ns = int(dur[no_launch].sum())
    for rule in (*COLLECTIVE_RULE_NAMES, *ORDER_RULE_NAMES, *INFERENCE_RULES):
        mask = no_launch & (attribution.rule == rule_names.index(rule))
        if mask.any():
            ns = int(dur[mask].sum())
            share = ns / gpu_total if gpu_total else 0.0
            # collective kernels launched before the trace began: named, so that a reader can find them
            named = f": {_top_names(names[mask])}" if rule in ORDER_RULE_NAMES else ""
            rows.append(
                _row(f"gpu_inferred.{rule.removeprefix('gpu.')}", "info", mask.sum(), ns,
                     f"{count_text(mask.sum(), 'GPU event')} without a recorded launch ({ns / 1e6:.3f} ms, "
                     f"{share:.1%} of GPU time) staged by inference ({rule}){named}")
            )  # fmt: skip
    unlinked = no_launch & (attribution.rule == rule_names.index(GPU_UNLINKED))
    if unlinked.any():
        ns = int(dur[unlinked].sum())
        share = ns / gpu_total if gpu_total else 0.0
        rows.append(
            _row("gpu_unlinked", "warning", unlinked.sum(), share,
                 f"{count_text(unlinked.sum(), 'GPU event')} ({ns / 1e6:.3f} ms, {share:.1%} of GPU time) without a "
                 f"launching runtime call not staged by inference (other.gpu_unlinked; {missing_ns / 1e6:.3f} ms had "
                 "no launch)")
        )  # fmt: skip
    return rows


def _in_step_calls(parsed: ParsedTrace, call_class: str) -> tuple[int, int, float, str]:
    """(count, ns, share of the steps' wall, top names) of runtime calls of one class inside step windows."""
    calls = parsed.table("runtime_calls")
    calls = calls[(calls["scope"] == "step") & (calls["call_class"] == call_class).to_numpy()]
    if calls.empty:
        return 0, 0, 0.0, ""
    steps = parsed.steps
    wall = int((steps["end_ns"] - steps["start_ns"]).sum()) if len(steps) else 0
    by_name = calls.groupby("name", observed=True)["count"].sum()
    by_name = by_name.iloc[np.lexsort((text_order(by_name.index), -by_name.to_numpy()))]  # equal counts by name
    names = ", ".join(f"{name} x{int(n)}" for name, n in by_name.head(3).items())
    total = int(calls["total_ns"].sum())
    return int(calls["count"].sum()), total, (total / wall if wall else 0.0), names


def _allocator_churn_row(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """Device malloc/free calls inside steps: the caching allocator is giving memory back and asking again."""
    count, ns, share, names = _in_step_calls(parsed, "malloc")
    free_count, free_ns, free_share, free_names = _in_step_calls(parsed, "free")
    count, ns, share = count + free_count, ns + free_ns, share + free_share
    if not count:
        return []
    severity = "warning" if share >= RUNTIME_SHARE_WARN else "info"
    listed = "; ".join(n for n in (names, free_names) if n)
    message = f"allocator churn: {count} malloc/free calls inside steps took {ns / 1e6:,.2f} ms ({share:.1%}; {listed})"
    return [_row("allocator_churn", severity, count, ns, message)]


def _sync_in_step_row(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """Host-blocking synchronize calls inside steps (``.item()``, ``.cpu()``, explicit syncs)."""
    count, ns, share, names = _in_step_calls(parsed, "sync")
    if not count:
        return []
    severity = "warning" if share >= RUNTIME_SHARE_WARN else "info"
    message = f"{count} synchronize calls inside steps blocked the host {ns / 1e6:,.2f} ms ({share:.1%}; {names})"
    return [_row("sync_in_step", severity, count, ns, message)]


def _inferred_sync_row(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """Runtime calls the critical path takes as blocking from their timing alone (no ``cuda_sync`` events)."""
    _, inferred = blocking_calls(parsed.raw.events, parsed.links)
    count = int(inferred.sum())
    if not count:
        return []
    ns = int(parsed.raw.events["dur_ns"].to_numpy()[inferred].sum())
    message = (
        f"the trace has no cuda_sync events: the critical path took {count} runtime calls ({ns / 1e6:,.2f} ms) as "
        "blocking because they returned when GPU work ended (capture with enable_cuda_sync_events for exact waits)"
    )
    return [_row("critical_path_inferred_sync", "info", count, ns, message)]


def _reading_rows(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """What reading the file found: truncation, dropped events, trailing bytes, lone surrogates, negative
    durations, repeated ``ProfilerStep#N``."""
    report, rows = parsed.raw.report, []
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
    surrogates = getattr(report, "lone_surrogates", 0)
    if surrogates:
        message = f"{surrogates} lone surrogate escapes (\\ud800...) in strings were read as U+FFFD (no event lost)"
        rows.append(_row("lone_surrogates", "warning", surrogates, 0, message))
    negative = int(parsed.raw.events.attrs.get("negative_dur", 0))
    if negative:
        rows.append(
            _row("negative_duration", "warning", negative, 0, f"{negative} events had a negative dur (set to 0)")
        )
    for message in getattr(parsed.attribution, "step_notes", ()):  # repeated ProfilerStep#N: renumbered or dropped
        rows.append(_row("repeated_steps", "warning", 0, 0, message))
    for message in getattr(parsed.attribution, "cut_notes", ()):  # a last step the profiler stopped inside
        rows.append(_row("cut_short_step", "info", 1, 0, message))
    for message in getattr(parsed.attribution, "warm_notes", ()):  # no step after the first optimizer step
        rows.append(_row("warm_up_only", "warning", 1, 0, message))
    return rows


#: stream overlaps up to this share of the GPU time are Hopper's programmatic dependent launch (cuBLAS's split-K
#: reduce starts ~0.1 us before its GEMM ends: 53 times, 6 us in all, on an H200 step), not broken timestamps
STREAM_OVERLAP_SHARE = 0.001


def _clock_rows(parsed: ParsedTrace, activity: np.ndarray) -> list[dict[str, Any]]:
    """GPU activity outside the profiled window, overlapping on a stream, or starting before its launch."""
    events, links, rows = parsed.raw.events, parsed.links, []
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    window = _profiled_window(events, links.host)
    if window is not None and activity.any():
        outside = activity & ((ts < window[0]) | (ts + dur > window[1]))
        if outside.any():
            rows.append(
                _row("outside_window", "warning", outside.sum(), dur[outside].sum(),
                     f"{count_text(outside.sum(), 'GPU event')} (partly) outside the profiled window")
            )  # fmt: skip
    overlaps, overlap_ns = _stream_overlaps(events, activity)
    if overlaps:
        overlapping = count_text(overlaps, "GPU event")
        message = f"{overlapping} overlapping the one before on its stream ({overlap_ns / 1e6:.3f} ms)"
        material = overlap_ns > STREAM_OVERLAP_SHARE * float(dur[activity].sum())
        if not material:
            message += ": a kernel launched with programmatic dependent launch starts before the one it follows ends"
        rows.append(_row("stream_overlap", "warning" if material else "info", overlaps, overlap_ns, message))
    launched = activity & (links.launch >= 0)
    if launched.any():
        early = launched.copy()
        early[launched] = ts[launched] < ts[links.launch[launched]]
        if early.any():
            rows.append(
                _row("timestamps_backwards", "warning", early.sum(), 0,
                     f"{count_text(early.sum(), 'GPU event')} starting before the call that launched them (clock skew)")
            )  # fmt: skip
    return rows


def _duplicate_events_row(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """Events that appear twice in the file, every field and args equal."""
    events = parsed.raw.events
    key = [c for c in events.columns if c != "trace_index"]  # every field the tables keep
    real = (events["kind"] != "metadata").to_numpy()
    alike = _duplicate_rows(events, real, key) if len(events) else np.zeros(0, dtype=np.int64)
    if not len(alike):
        return []
    duplicates = _same_in_file(parsed.path, events, alike)  # args too: the tables keep only some of them
    if duplicates is None:
        duplicates = int(events.iloc[alike][key].duplicated().sum())
    if not duplicates:
        return []
    message = f"{duplicates} events appear twice (every field and args equal)"
    return [_row("duplicate_events", "warning", duplicates, 0, message)]


def _stage_rows(parsed: ParsedTrace, activity: np.ndarray, gpu_total: int) -> list[dict[str, Any]]:
    """Stages a training trace should have but lacks, and the share of host and GPU time left in ``other``."""
    events, links, attribution, rows = parsed.raw.events, parsed.links, parsed.attribution, []
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
    dur = events["dur_ns"].to_numpy()
    for label, mask, weights, total in (
        ("host op self time", ops, links.self_ns, links.self_ns[ops].sum()),
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
    return rows


#: classes of runtime calls (``runtime_calls.call_class``) that put work on the device: a trace with some of them
#: and no GPU activity left the device out
DEVICE_WORK_CLASSES = ("launch", "memcpy", "memset")


def _capture_rows(parsed: ParsedTrace, activity: np.ndarray) -> list[dict[str, Any]]:
    """A capture that left one side out (torch.profiler's ``activities``): launches and copies but no GPU activity,
    or GPU activity but no host event at all."""
    if not activity.any():
        calls = parsed.table("runtime_calls")
        launches = int(
            calls.loc[(calls["scope"] == "total") & calls["call_class"].isin(DEVICE_WORK_CLASSES), "count"].sum()
        )
        if launches:
            return [_row("no_gpu_activity", "warning", launches, 0,
                         f"{count_text(launches, 'kernel launch or copy call')} but no GPU activity: the capture left "
                         "the device out (add ProfilerActivity.CUDA to torch.profiler's activities); GPU time, GPU "
                         "idle, MFU and the GPU on the critical path are not measured")]  # fmt: skip
    elif not parsed.links.host.any():
        return [_row("no_host_events", "warning", int(activity.sum()), 0,
                     "GPU activity but no host event: the capture left the host out (add ProfilerActivity.CPU to "
                     "torch.profiler's activities); stages only inferred from the GPU activity")]  # fmt: skip
    return []


def _uncalibrated_row(parsed: ParsedTrace) -> list[dict[str, Any]]:
    """The step time without the profiler rests on default costs per event (no calibration in the trace)."""
    steps = parsed.attribution.steps
    steady = int(steps["steady"].sum()) if "steady" in steps else len(steps)
    if not steady or isinstance(parsed.header.get(CALIBRATION_KEY), dict):
        return []
    return [_row("profiler_cost_uncalibrated", "info", steady, 0.0,
                 "the step time without the profiler uses default costs per recorded event (docs/without_profiler.md);"
                 " capture with profparse (scripts/capture.py) to measure them")]  # fmt: skip


def quality_checks(parsed: ParsedTrace) -> pd.DataFrame:
    """Run every check on a parsed trace; one row per finding."""
    events = parsed.raw.events
    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    dur = events["dur_ns"].to_numpy()
    gpu_total = int(dur[activity].sum())
    rows = [
        *_reading_rows(parsed),
        *_gpu_inference_rows(activity, parsed.links.launch, parsed.attribution, dur, gpu_total, events["name"]),
        *_allocator_churn_row(parsed),
        *_sync_in_step_row(parsed),
        *_inferred_sync_row(parsed),
        *_clock_rows(parsed, activity),
        *_duplicate_events_row(parsed),
        *_capture_rows(parsed, activity),
        *_stage_rows(parsed, activity, gpu_total),
        *_uncalibrated_row(parsed),
    ]
    return pd.DataFrame(rows, columns=list(COLUMNS))
