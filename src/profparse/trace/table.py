"""The event table: decoded chunks accumulated into preallocated columns, then one DataFrame."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pandas.arrays import SparseArray

from profparse.trace.budget import Tally
from profparse.trace.columns import ChunkColumns, Interner, chunk_columns
from profparse.trace.kinds import (
    CATEGORY_KIND,
    GPU_TRACK_KINDS,
    INT_ARG_COLUMNS,
    KIND_CODE,
    KINDS,
    NULL,
    OPTIONAL_ARG_COLUMNS,
    TEXT_ARG_COLUMNS,
    kind_codes,
)
from profparse.trace.schema import TEXT_ARG_FIELDS, Event, FastEvent

_INITIAL_ROWS = 1 << 12  # the first chunk's rows or the size hint usually decide; this is the floor
_ARG_KEYS = frozenset(column for column, _ in INT_ARG_COLUMNS) | frozenset(TEXT_ARG_FIELDS)
#: an integer args column with values on at most 1 row in SPARSE_SHARE is kept sparse (values and int32 row numbers:
#: 12 bytes per value instead of 8 per row); most args belong to a few kinds of event (stream, device: GPU work;
#: sequence_number: autograd ops; correlation and flow ids: launches and kernels; the collectives' sizes), and dense
#: they were most of the event table's memory. A reader's ``.to_numpy()`` makes the dense column for as long as it
#: keeps it.
SPARSE_SHARE = 2
#: ``SparseArray.from_indices`` (pandas >= 3.1) builds the column from its rows without a dense pass
_FROM_INDICES = getattr(SparseArray, "from_indices", None)


def _code_dtype(categories: int) -> type:
    """The smallest signed integer type that holds codes for ``categories`` values and -1."""
    if categories < 127:
        return np.int8
    if categories < 32767:
        return np.int16
    return np.int32


def _all_null(n: int) -> np.ndarray:
    """A read-only int64 column of ``n`` NULLs that takes no memory (stride 0)."""
    return np.broadcast_to(np.int64(NULL), (n,))


def args_column(values: np.ndarray) -> np.ndarray | SparseArray:
    """An int64 args column as stored in the event table: sparse (``Sparse[int64, NULL]``) when at most one row in
    :data:`SPARSE_SHARE` has a value, else as it is. Either reads back with ``.to_numpy()`` as int64 with NULL."""
    present = np.flatnonzero(values != NULL)
    if len(present) * SPARSE_SHARE > len(values) or len(values) >= 1 << 31:
        return values
    return sparse_column(values, NULL, present)


def sparse_column(values: np.ndarray, fill: int, present: np.ndarray | None = None) -> SparseArray:
    """``values`` as a sparse column of ``fill`` (``present``: the rows that hold something else, when known)."""
    if present is None:
        present = np.flatnonzero(values != fill)
    if _FROM_INDICES is not None:
        return _FROM_INDICES(values[present], present.astype(np.int32), length=len(values), fill_value=fill)
    return SparseArray(values, fill_value=fill, kind="integer")  # the same array, made from the dense column


class EventTableBuilder:
    """Accumulate decoded chunks into one columnar table."""

    def __init__(self, expected_rows: int = 0) -> None:
        self.expected_rows = expected_rows  # capacity to start with (an estimate from the input's size)
        self.names = Interner()
        self.texts = {column: Interner() for column in TEXT_ARG_COLUMNS}
        self.cats = Interner()
        self.phs = Interner()
        self.pid_labels: dict[int, str] = {}
        self.tid_labels: dict[int, str] = {}
        self.columns: dict[str, np.ndarray] = {}  # preallocated, ``capacity`` rows, the first ``rows`` filled
        self.capacity = 0
        self.rows = 0
        self.seen: set[str] = set()  # args columns with a value so far
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.position = 0  # events appended so far, the rows dropped while appending included
        # rows dropped while appending (no ts, absurd times): counted here, never stored
        self.dropped = {"dropped_missing_ts": 0, "dropped_absurd_time": 0, "negative_dur": 0}
        self.kind_counts = {"ops": 0, "python": 0, "gpu": 0}  # events appended, by what the memory estimate counts

    def tally(self) -> Tally:
        """The events appended so far and their distinct strings, for the memory estimate."""
        interners = [self.names, self.cats, self.phs, *self.texts.values()]
        return Tally(
            events=self.position,
            strings=sum(len(i.values) for i in interners),
            chars=sum(i.chars for i in interners),
            **self.kind_counts,
        )

    def _count_kinds(self, cats: list[str], cat_code: np.ndarray) -> None:
        """Count a chunk's ops, Python functions and GPU events by their category (chunk-local codes)."""
        per_cat = np.bincount(cat_code, minlength=len(cats)).tolist()
        for cat, count in zip(cats, per_cat, strict=False):
            kind = CATEGORY_KIND.get(cat)
            key = {"cpu_op": "ops", "python_function": "python"}.get(
                kind or "", "gpu" if kind in GPU_TRACK_KINDS else ""
            )
            if key:
                self.kind_counts[key] += count

    def add(self, events: list[Event] | list[FastEvent], raw_chunk: bytes | None = None) -> None:
        """Append one decoded chunk; ``raw_chunk`` is its JSON text when it decoded without repairs."""
        if events:
            self.append(chunk_columns(events, raw_chunk))

    def append(self, chunk: ChunkColumns) -> None:
        """Append a chunk made by :func:`chunk_columns` (here or in another process)."""
        cols = chunk.cols
        self._count_kinds(chunk.cat, cols["cat_code"])
        cols["ph_code"] = self.phs.remap(chunk.ph, cols["ph_code"])
        cols["cat_code"] = self.cats.remap(chunk.cat, cols["cat_code"])
        cols["name_code"] = self.names.remap(chunk.name, cols["name_code"])
        for column, values in chunk.texts.items():
            codes = cols[column]
            present = codes != NULL
            codes[present] = self.texts[column].remap(values, codes[present])
        self.pid_labels.update(chunk.pid_labels)
        self.tid_labels.update(chunk.tid_labels)
        for event_name, pid, tid, label in chunk.metadata:
            if event_name == "process_name":
                self.process_names[pid] = label
            elif event_name == "thread_name":
                self.thread_names[(pid, tid)] = label
        n = self._drop_invalid(cols, chunk.rows)
        self.position += chunk.rows
        self._store(cols, n)

    def _drop_invalid(self, cols: dict[str, np.ndarray | None], n: int) -> int:
        """Take the rows :meth:`build` would drop (no ts and not metadata, absurd times) out of a chunk's
        columns before they are stored, counting them; the rows left.

        Stored, they cost ~55 bytes each until the end (and twice that while a column grows): a trace of ``{}``
        events took ~5x the memory estimate. Once a row has been dropped, each row stores its
        position in the array (``trace_index``), which is otherwise the row number.
        """
        # "M" (build's kind "metadata") by its code in the whole trace: the chunk's ph codes are already remapped
        metadata = self.phs.codes.get("M", -1)
        missing = cols["ts_missing"] & (cols["ph_code"] != metadata)
        invalid = missing | cols["absurd_time"]
        positions = None
        if invalid.any():
            keep = ~invalid
            self.dropped["dropped_missing_ts"] += int(missing.sum())
            self.dropped["dropped_absurd_time"] += int(cols["absurd_time"].sum())
            self.dropped["negative_dur"] += int((cols["negative_dur"] & invalid).sum())
            for key, values in cols.items():
                if values is not None:
                    cols[key] = values[keep]
            positions = np.flatnonzero(keep) + self.position
            if "trace_index" not in self.columns:  # the first gap: the rows so far are at their own positions
                column = self.columns["trace_index"] = np.empty(self.capacity, dtype=np.int64)
                column[: self.rows] = np.arange(self.rows, dtype=np.int64)
            n = len(positions)
        if "trace_index" in self.columns:
            cols["trace_index"] = positions if positions is not None else np.arange(self.position, self.position + n)
        return n

    def _store(self, cols: dict[str, np.ndarray | None], n: int) -> None:
        """Copy a chunk's columns into the preallocated ones (no list of chunks, no concatenation at the end).

        Capacity starts at ``expected_rows`` (an estimate from the input's size, so a small trace reserves little
        address space and runs under a low ``ulimit -v``) and doubles; pages the rows do not reach are never
        touched, so they take address space but no memory. An args column is written only from its first chunk
        with a value on (then the rows before are filled with NULL); one that never gets a value is never written.
        """
        end = self.rows + n
        if end > self.capacity:
            capacity = max(_INITIAL_ROWS, self.expected_rows, 2 * self.capacity, end)
            for key, old in self.columns.items():  # one column at a time: the extra memory is one column
                grown = np.empty(capacity, dtype=old.dtype)
                if key in self.seen or key not in _ARG_KEYS:  # an args column without values yet holds nothing
                    grown[: self.rows] = old[: self.rows]
                self.columns[key] = grown
                del old
            self.capacity = capacity
        for key, values in cols.items():
            column = self.columns.get(key)
            if column is None:
                dtype = np.int64 if values is None else values.dtype
                column = self.columns[key] = np.empty(self.capacity, dtype=dtype)
            if values is None:
                if key in self.seen:
                    column[self.rows : end] = NULL
            else:
                if key not in self.seen and key in _ARG_KEYS:
                    self.seen.add(key)
                    column[: self.rows] = NULL
                column[self.rows : end] = values
        self.rows = end

    def build(self) -> pd.DataFrame:
        """The event DataFrame (its columns are views of the filled rows, no copies)."""
        if not self.rows:
            frame = empty_event_frame()
            frame.attrs.update(self.dropped)
            return frame
        merged = {key: column[: self.rows] for key, column in self.columns.items()}
        self.columns = {}
        for interner in (self.names, self.cats, self.phs, *self.texts.values()):
            interner.codes = {}  # no more chunks: the categoricals hash their own (unique names: ~70 B each)
        kind = kind_codes(
            self.phs.values,
            self.cats.values,
            self.names.values,
            merged["ph_code"],
            merged["cat_code"],
            merged["name_code"],
        )
        positions = merged.pop("trace_index", None)
        columns = {
            "trace_index": np.arange(self.rows, dtype=np.int64) if positions is None else positions,
            "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
            "category": pd.Categorical.from_codes(merged.pop("cat_code"), categories=self.cats.values),
            "ph": pd.Categorical.from_codes(merged.pop("ph_code"), categories=self.phs.values),
            "name": pd.Categorical.from_codes(merged.pop("name_code"), categories=self.names.values),
            "ts_ns": merged.pop("ts_ns"),
            "dur_ns": merged.pop("dur_ns"),
            "pid": merged.pop("pid"),
            "tid": merged.pop("tid"),
        }
        for column, _ in INT_ARG_COLUMNS:
            if column in OPTIONAL_ARG_COLUMNS and column not in self.seen:
                continue
            # an args key absent from the whole trace (memory, Python ids in most traces): one NULL repeated
            # (read-only, no memory) instead of 8 bytes per row; one on few rows: sparse
            columns[column] = args_column(merged.pop(column)) if column in self.seen else _all_null(self.rows)
        for column in TEXT_ARG_COLUMNS:
            columns[column] = self._text_column(merged.pop(column, None), column)
        columns["flow_id"] = args_column(merged.pop("flow_id"))  # on flow events only: a third of a GPU trace
        frame = pd.DataFrame(columns, copy=False)
        del columns
        invalid = merged["ts_missing"] & (kind != KIND_CODE["metadata"])
        frame.attrs["dropped_missing_ts"] = int(invalid.sum()) + self.dropped["dropped_missing_ts"]
        frame.attrs["dropped_absurd_time"] = int(merged["absurd_time"].sum()) + self.dropped["dropped_absurd_time"]
        invalid |= merged["absurd_time"]
        frame.attrs["negative_dur"] = int(merged["negative_dur"].sum()) + self.dropped["negative_dur"]
        if invalid.any():
            frame = frame.loc[~invalid].reset_index(drop=True)
        return frame

    def _text_column(self, codes: np.ndarray | None, column: str) -> pd.Categorical:
        """Interned codes (``NULL`` where absent) -> a categorical of the column's strings, NaN where absent."""
        categories = self.texts[column].values
        if codes is None or column not in self.seen:
            small = np.full(self.rows, -1, dtype=np.int8)
            return pd.Categorical.from_codes(small, categories=categories)
        small = np.where(codes == NULL, -1, codes).astype(_code_dtype(len(categories)))
        return pd.Categorical.from_codes(small, categories=categories)


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
    for column in TEXT_ARG_COLUMNS:
        cols[column] = pd.Categorical([])
    cols["flow_id"] = np.array([], np.int64)
    frame = pd.DataFrame(cols)
    frame.attrs.update(dropped_missing_ts=0, negative_dur=0)
    return frame
