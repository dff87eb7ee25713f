"""Build the columnar event table from decoded chunks.

One row per entry of ``traceEvents`` (in file order, ``trace_index`` = position in the array), typed columns,
times as int64 nanoseconds, strings dictionary-encoded. Categories of every schema era are normalised into
``kind`` (e.g. legacy ``Kernel`` and current ``kernel`` are both ``kernel``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from profparse.trace.decode import Args, DecodeReport, Event, TraceDecoder

NULL = np.iinfo(np.int64).min  # sentinel for a missing integer inside numpy arrays

KINDS: tuple[str, ...] = (
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "memory",
    "instant",
    "flow_start",
    "flow_end",
    "metadata",
    "other",
)
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

CATEGORY_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_sync": "cuda_sync",
}
GPU_ACTIVITY_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GPU_TRACK_KINDS = GPU_ACTIVITY_KINDS | {"gpu_user_annotation", "cuda_sync"}
RUNTIME_KINDS = frozenset({"cuda_runtime", "cuda_driver"})

INT_ARG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("correlation", "correlation"),
    ("external_id", "external_id"),
    ("sequence_number", "sequence_number"),
    ("fwd_thread_id", "fwd_thread_id"),
    ("stream", "stream"),
    ("device", "device"),
    ("bytes", "bytes"),
    ("mem_bytes", "mem_bytes"),
    ("mem_total_allocated_bytes", "total_allocated"),
    ("mem_total_reserved_bytes", "total_reserved"),
    ("mem_device_type", "device_type"),
    ("mem_device_id", "device_id"),
    ("mem_addr", "addr"),
    ("python_id", "python_id"),
    ("python_parent_id", "python_parent_id"),
)

_EMPTY_ARGS = Args()
_LEGACY_RANGE = re.compile(r"^(ProfilerStep#\d+|Optimizer\.(step|zero_grad)#|enumerate\(DataLoader\)#|##)")
_EXACT_TS_LIMIT_US = float(2**42)  # beyond this a float64 of microseconds cannot hold whole nanoseconds


class _TsText(msgspec.Struct):
    ts: Any = None


_TS_TEXT = msgspec.json.Decoder(list[_TsText], float_hook=str)


class _Interner:
    """Map strings to stable small integer codes across chunks."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []

    def encode(self, items: list[str]) -> np.ndarray:
        codes = self.codes
        values = self.values

        def code(s: str) -> int:
            c = codes.get(s)
            if c is None:
                c = codes[s] = len(values)
                values.append(s)
            return c

        return np.fromiter((code(s) for s in items), dtype=np.int32, count=len(items))


def _int_array(values: list[Any]) -> np.ndarray:
    """Python ints/None -> int64 numpy array with ``NULL`` for missing (pyarrow does the loop in C)."""
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = pa.array([v if isinstance(v, int) and -(2**63) < v < 2**63 else None for v in values], pa.int64())
    return pc.fill_null(arr, NULL).to_numpy()


def _us_to_ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (float64) -> int64 nanoseconds, rounding to the nearest nanosecond."""
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000).astype(np.int64)


def _exact_ts_ns(texts: list[Any]) -> np.ndarray:
    """Timestamps as decoded text (floats) or ints (whole microseconds) -> exact int64 nanoseconds."""
    as_text = [v if isinstance(v, str) else ("0" if v is None else str(v)) for v in texts]
    dec = pa.array(as_text, pa.string()).cast(pa.decimal128(30, 6))
    scaled = pc.multiply(dec, pa.scalar(1000, pa.decimal128(4, 0)))
    return pc.round(scaled, 0).cast(pa.int64()).to_numpy()


class EventTableBuilder:
    """Accumulate decoded chunks into one columnar table."""

    def __init__(self) -> None:
        self.names = _Interner()
        self.cats = _Interner()
        self.phs = _Interner()
        self.pid_labels: dict[int, str] = {}
        self.tid_labels: dict[int, str] = {}
        self.chunks: list[dict[str, np.ndarray]] = []
        self.rows = 0
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}

    def _ids(self, values: list[Any], labels: dict[int, str]) -> np.ndarray:
        """pid/tid values (ints, numeric strings, labels) -> int64; a label gets a stable negative id."""
        try:
            return np.array(values, dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            pass
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            if isinstance(v, int) and not isinstance(v, bool) and -(2**63) < v < 2**63:
                out[i] = v
                continue
            text = "" if v is None else str(v)
            try:
                out[i] = int(text)
                continue
            except ValueError:
                pass
            digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=5).digest()
            key = -(1 + int.from_bytes(digest, "little"))
            labels[key] = text
            out[i] = key
        return out

    def add(self, events: list[Event], raw_chunk: bytes | None = None) -> None:
        n = len(events)
        if n == 0:
            return
        cols: dict[str, np.ndarray] = {}
        cols["trace_index"] = np.arange(self.rows, self.rows + n, dtype=np.int64)
        cols["ph_code"] = self.phs.encode([e.ph for e in events])
        cols["cat_code"] = self.cats.encode([e.cat or "" for e in events])
        cols["name_code"] = self.names.encode([e.name for e in events])
        ts = np.array([e.ts if e.ts is not None else np.nan for e in events], dtype=np.float64)
        dur = np.array([e.dur if e.dur is not None else 0.0 for e in events], dtype=np.float64)
        missing_ts = np.isnan(ts)
        ts[missing_ts] = 0.0
        if raw_chunk is not None and np.abs(ts).max(initial=0.0) >= _EXACT_TS_LIMIT_US and (ts % 1).any():
            cols["ts_ns"] = _exact_ts_ns([t.ts for t in _TS_TEXT.decode(raw_chunk)])
        else:
            cols["ts_ns"] = _us_to_ns(ts)
        cols["ts_missing"] = missing_ts
        cols["dur_ns"] = np.maximum(_us_to_ns(dur), 0)
        cols["negative_dur"] = dur < 0
        cols["pid"] = self._ids([e.pid for e in events], self.pid_labels)
        cols["tid"] = self._ids([e.tid for e in events], self.tid_labels)
        args = [e.args if e.args is not None else _EMPTY_ARGS for e in events]
        for column, attr in INT_ARG_COLUMNS:
            cols[column] = _int_array([getattr(a, attr) for a in args])
        cols["flow_id"] = _int_array([e.id if isinstance(e.id, int) else None for e in events])
        self._metadata(events, cols)
        self.chunks.append(cols)
        self.rows += n

    def _metadata(self, events: list[Event], cols: dict[str, np.ndarray]) -> None:
        meta_code = self.phs.codes.get("M")
        if meta_code is None:
            return
        for i in np.flatnonzero(cols["ph_code"] == meta_code):
            event = events[i]
            if event.args is None or event.args.name is None:
                continue
            pid, tid = int(cols["pid"][i]), int(cols["tid"][i])
            if event.name == "process_name":
                self.process_names[pid] = event.args.name
            elif event.name == "thread_name":
                self.thread_names[(pid, tid)] = event.args.name

    def build(self) -> pd.DataFrame:
        """Concatenate the chunks into the event DataFrame."""
        keys = self.chunks[0].keys() if self.chunks else []
        merged = {k: np.concatenate([c[k] for c in self.chunks]) for k in keys}
        if not merged:
            return empty_event_frame()
        kind = self._kinds(merged["ph_code"], merged["cat_code"], merged["name_code"])
        frame = pd.DataFrame(
            {
                "trace_index": merged["trace_index"],
                "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
                "category": pd.Categorical.from_codes(merged["cat_code"], categories=self.cats.values),
                "ph": pd.Categorical.from_codes(merged["ph_code"], categories=self.phs.values),
                "name": pd.Categorical.from_codes(merged["name_code"], categories=self.names.values),
                "ts_ns": merged["ts_ns"],
                "dur_ns": merged["dur_ns"],
                "pid": merged["pid"],
                "tid": merged["tid"],
            }
        )
        for column, _ in INT_ARG_COLUMNS:
            frame[column] = merged[column]
        frame["flow_id"] = merged["flow_id"]
        invalid = merged["ts_missing"] & (kind != KIND_CODE["metadata"])
        frame.attrs["dropped_missing_ts"] = int(invalid.sum())
        frame.attrs["negative_dur"] = int(merged["negative_dur"].sum())
        if invalid.any():
            frame = frame.loc[~invalid].reset_index(drop=True)
        return frame

    def _kinds(self, ph_code: np.ndarray, cat_code: np.ndarray, name_code: np.ndarray) -> np.ndarray:
        ph_kind = np.full(len(self.phs.values), KIND_CODE["other"], dtype=np.int8)
        for i, ph in enumerate(self.phs.values):
            ph_kind[i] = {
                "M": KIND_CODE["metadata"],
                "s": KIND_CODE["flow_start"],
                "f": KIND_CODE["flow_end"],
                "t": KIND_CODE["flow_end"],
                "i": KIND_CODE["instant"],
                "I": KIND_CODE["instant"],
            }.get(ph, -1)
        cat_kind = np.array([KIND_CODE[CATEGORY_KIND.get(c, "other")] for c in self.cats.values], dtype=np.int8)
        kind = ph_kind[ph_code]
        complete = kind == -1
        kind[complete] = cat_kind[cat_code[complete]]
        legacy_ops = np.array([c == "Operator" for c in self.cats.values], dtype=bool)
        if legacy_ops.any():  # 2021 traces file record_function ranges under "Operator" too
            ranges = np.array([_LEGACY_RANGE.match(n) is not None for n in self.names.values], dtype=bool)
            kind[legacy_ops[cat_code] & ranges[name_code]] = KIND_CODE["user_annotation"]
        memory_code = self.names.codes.get("[memory]")
        if memory_code is not None:
            kind[(kind == KIND_CODE["instant"]) & (name_code == memory_code)] = KIND_CODE["memory"]
        return kind


def empty_event_frame() -> pd.DataFrame:
    """An event table with every column and no rows."""
    cols: dict[str, Any] = {
        "trace_index": np.array([], np.int64),
        "kind": pd.Categorical([], categories=list(KINDS)),
        "category": pd.Categorical([]),
        "ph": pd.Categorical([]),
        "name": pd.Categorical([]),
        "ts_ns": np.array([], np.int64),
        "dur_ns": np.array([], np.int64),
        "pid": np.array([], np.int64),
        "tid": np.array([], np.int64),
    }
    for column, _ in INT_ARG_COLUMNS:
        cols[column] = np.array([], np.int64)
    cols["flow_id"] = np.array([], np.int64)
    frame = pd.DataFrame(cols)
    frame.attrs.update(dropped_missing_ts=0, negative_dur=0)
    return frame


@dataclass
class RawTrace:
    """A decoded trace: the event table, top-level keys, track names and the decoder's report."""

    path: str
    events: pd.DataFrame
    header: dict[str, Any]
    report: DecodeReport
    process_names: dict[int, str]
    thread_names: dict[tuple[int, int], str]
    pid_labels: dict[int, str]
    tid_labels: dict[int, str]


def read_trace(
    path: str | Path,
    *,
    strict: bool = False,
    chunk_bytes: int | None = None,
    progress: Any = None,
) -> RawTrace:
    """Decode a trace file into a :class:`RawTrace` (streaming, chunk by chunk)."""
    kwargs = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    decoder = TraceDecoder(path, strict=strict, **kwargs)
    builder = EventTableBuilder()
    for events, raw in decoder.chunks_with_text():
        builder.add(events, raw)
        if progress is not None:
            progress(decoder.report.bytes_read)
    frame = builder.build()
    if frame.attrs.get("dropped_missing_ts"):
        decoder.report.drop("event without ts", frame.attrs["dropped_missing_ts"])
    return RawTrace(
        path=str(path),
        events=frame,
        header=decoder.header,
        report=decoder.report,
        process_names=builder.process_names,
        thread_names=builder.thread_names,
        pid_labels=builder.pid_labels,
        tid_labels=builder.tid_labels,
    )
