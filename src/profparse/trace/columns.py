"""One decoded chunk as columns: strings as codes into chunk-local lists, integers as int64 with ``NULL``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import astuple

from profparse.trace.kinds import INT_ARG_COLUMNS, NULL, TEXT_ARG_COLUMNS
from profparse.trace.schema import ABSENT, TEXT_ARG_FIELDS, Args, Event, FastEvent, integer_value
from profparse.trace.timestamps import time_columns

_EVENT_FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "id", "args")
assert Event.__struct_fields__ == FastEvent.__struct_fields__ == _EVENT_FIELDS  # chunk_columns unpacks by position
_INT_ARG_NAMES = tuple(column for column, _ in INT_ARG_COLUMNS)
_INT_ARG_OF = {attr: column for column, attr in INT_ARG_COLUMNS}  # Args field -> column
_TEXT_ARG_SET = frozenset(TEXT_ARG_FIELDS)


class Interner:
    """Map strings to stable small integer codes across chunks (codes in order of first appearance)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []
        self.chars = 0  # of all values: for the memory estimate

    def _code(self, s: str) -> int:
        c = self.codes.get(s)
        if c is None:
            c = self.codes[s] = len(self.values)
            self.values.append(s)
            self.chars += len(s)
        return c

    def encode(self, items: list[str]) -> np.ndarray:
        distinct, codes = _local_codes(items)
        return self.remap(distinct, codes)

    def remap(self, distinct: list[str], codes: np.ndarray) -> np.ndarray:
        """Chunk-local codes into ``distinct`` (in order of first appearance) -> codes of this interner."""
        local = np.fromiter((self._code(s) for s in distinct), dtype=np.int32, count=len(distinct))
        return local[codes]


def _local_codes(items: Any) -> tuple[list[str], np.ndarray]:
    """Strings or None (counted as ``""``; ``cat`` may be absent) -> (distinct strings in order of first
    appearance, int32 code per item). None is filled in by Arrow, not by a list comprehension first: a quarter
    less time for ``cat``, which most events carry."""
    try:  # Arrow finds the distinct strings in C
        arr = pa.array(items, pa.string())
        encoded = (pc.fill_null(arr, "") if arr.null_count else arr).dictionary_encode()
    except (pa.ArrowException, UnicodeError):  # e.g. lone surrogates from \ud800 escapes
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(s or "", len(index)) for s in items), dtype=np.int32, count=len(items))
        return list(index), codes
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy()


def _int_array(values: list[Any]) -> np.ndarray:
    """Python ints/None -> int64 numpy array with ``NULL`` for missing (pyarrow does the loop in C)."""
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = pa.array([v if isinstance(v, int) and -(2**63) < v < 2**63 else None for v in values], pa.int64())
    return pc.fill_null(arr, NULL).to_numpy()


def _flow_ids(values: tuple[Any, ...]) -> np.ndarray:
    """Flow ``id`` values -> int64 with ``NULL`` where missing or not an integer (string ids)."""
    if values.count(None) == len(values):  # no flow event in the chunk: one identity check per row
        return np.full(len(values), NULL, dtype=np.int64)
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _int_array([v if isinstance(v, int) else None for v in values])
    return pc.fill_null(arr, NULL).to_numpy()


def _ids(values: Any, labels: dict[int, str]) -> np.ndarray:
    """pid/tid values (ints, numeric strings, labels) -> int64; a label gets a stable negative id.

    Not all ints (legacy traces write every tid as a string): each distinct value is converted once and the rows
    are mapped through a dict in C: ~5x faster than a per-row Python loop.
    """
    try:
        return np.array(values, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        pass
    known = dict.fromkeys(values)  # values are int, str or None: hashable, and equal only when the same
    for v in known:
        known[v] = _id_of(v, labels)
    return np.fromiter(map(known.__getitem__, values), dtype=np.int64, count=len(values))


def _id_of(v: Any, labels: dict[int, str]) -> int:
    """One pid/tid value -> int64 (see :func:`_ids`)."""
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) < v < 2**63:
        return v
    text = "" if v is None else str(v)
    try:
        number = int(text)
        if -(2**63) <= number < 2**63:
            return number
    except ValueError:  # a label, or a number beyond int64: keep it as a label
        pass
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=5).digest()
    key = -(1 + int.from_bytes(digest, "little"))
    labels[key] = text
    return key


def _json_text(raw: Any) -> str:
    """A text ``args`` value (msgspec.Raw) as a string: a JSON string unquoted, anything else as written."""
    data = bytes(raw)
    if data[:1] == b'"':
        try:
            value = msgspec.json.decode(data)
        except msgspec.DecodeError:
            value = None
        if isinstance(value, str):
            return value
    return data.decode("utf-8", "replace")


def _arg_columns(args: tuple[Any, ...]) -> tuple[dict[str, np.ndarray | None], dict[str, tuple[list[str], np.ndarray]]]:
    """The ``args`` columns of a chunk: integer columns (``NULL`` where missing; None where all are missing) and,
    per text field present, (distinct strings, int64 code per row, ``NULL`` where absent).

    One transposition of the events that have ``args`` (``astuple`` + ``zip``, in C) serves every field; a field
    absent from the chunk (most of them in most chunks) costs one ``tuple.count`` (identity checks). An integer
    field is a tuple of ints (absent keys decode as the shared ``ABSENT`` == ``NULL``, see schema.Args) that
    numpy converts in C; Arrow only where that fails (an explicit null, an int beyond int64). Rows are selected
    with ``itertools.compress`` / ``filter(None, ...)`` (structs and Raw values are truthy, None is not): C loops
    with no mask array. Each present text field is dictionary-encoded by Arrow (shapes repeat: few distinct texts
    reach Python). Against Arrow for every integer field, numpy masks from ``is_not`` and one Arrow call per text
    field, this takes about a third less CPU where a few events of every chunk carry a collective's text fields,
    and ~10% less where many events carry input shapes.
    """
    n = len(args)
    ints: dict[str, np.ndarray | None] = dict.fromkeys(_INT_ARG_NAMES)
    texts: dict[str, tuple[list[str], np.ndarray]] = {}
    present = list(filter(None, args))
    m = len(present)
    if not m:
        return ints, texts
    rows = None if m == n else np.fromiter(compress(range(n), args), dtype=np.int64, count=m)  # None: all rows
    hits = None  # rows (of ``present``) of the last text field
    for attr, values in zip(Args.__struct_fields__, zip(*map(astuple, present), strict=True), strict=True):
        column = _INT_ARG_OF.get(attr)
        if column is not None:
            if values.count(ABSENT) == m:
                continue
            try:
                found = np.fromiter(values, dtype=np.int64, count=m)  # ~25% less than np.array (no shape search)
            except (TypeError, OverflowError, ValueError):  # an explicit null, an int beyond int64, a string
                found = _int_array([integer_value(v) if isinstance(v, str) else v for v in values])
            ints[column] = _scatter(found, rows, n)
        elif attr in _TEXT_ARG_SET:
            k = m - values.count(None)
            if not k:
                continue
            # text fields come in groups on the same events (a collective's name, dtype, process group): the rows
            # of the previous field are checked (k items) instead of found again (m items)
            if hits is None or len(hits) != k or None in _take(values, hits):
                hits = np.fromiter(compress(range(m), values), dtype=np.int64, count=k)
            codes = np.full(n, NULL, dtype=np.int64)
            distinct, local = _text_codes(list(map(bytes, filter(None, values))))
            codes[hits if rows is None else rows[hits]] = local
            texts[attr] = ([_json_text(b) for b in distinct], codes)
    return ints, texts


def _take(values: tuple[Any, ...], index: np.ndarray) -> tuple[Any, ...]:
    """``values[i] for i in index`` as a tuple, the loop in C (itemgetter)."""
    return (values[int(index[0])],) if len(index) == 1 else itemgetter(*index.tolist())(values)


def _text_codes(items: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """Distinct byte strings in order of first appearance and a code per item: Arrow's ``dictionary_encode``, or
    a dict for a few items (Arrow costs ~0.1 ms per call, a dict ~0.1 us per item: with an Arrow call each, the
    text fields of a few collectives were a tenth of a chunk's time)."""
    if len(items) < 256:
        index: dict[bytes, int] = {}
        codes = [index.setdefault(b, len(index)) for b in items]
        return list(index), np.array(codes, dtype=np.int64)
    encoded = pa.array(items, pa.binary()).dictionary_encode()
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy()


def _scatter(values: np.ndarray, rows: np.ndarray | None, n: int) -> np.ndarray:
    """``values`` of the rows ``rows`` (None: all rows) into a column of ``n`` rows, ``NULL`` elsewhere."""
    if rows is None:
        return values
    out = np.full(n, NULL, dtype=np.int64)
    out[rows] = values
    return out


@dataclass
class ChunkColumns:
    """One decoded chunk as columns; strings as codes into chunk-local lists (see :func:`chunk_columns`)."""

    rows: int
    cols: dict[str, np.ndarray | None]  # None: an int64 column where every value is NULL
    ph: list[str]
    cat: list[str]
    name: list[str]
    pid_labels: dict[int, str]
    tid_labels: dict[int, str]
    metadata: list[tuple[str, int, int, str]]  # (event name, pid, tid, args.name) of "M" events with a name
    texts: dict[str, list[str]] = field(default_factory=dict)  # text args column -> its chunk-local values


def chunk_columns(events: list[Event] | list[FastEvent], raw_chunk: bytes | None = None) -> ChunkColumns:
    """Turn one decoded chunk into columns; ``raw_chunk`` is its JSON text when it decoded without repairs."""
    n = len(events)
    ph, name, cat, ts_values, dur_values, pid, tid, flow, args = zip(*map(astuple, events), strict=True)
    cols: dict[str, np.ndarray | None] = {}
    ph_values, cols["ph_code"] = _local_codes(ph)
    cat_values, cols["cat_code"] = _local_codes(cat)
    name_values, cols["name_code"] = _local_codes(name)
    del ph, cat
    cols.update(time_columns(events, ts_values, dur_values, raw_chunk))
    del ts_values, dur_values
    pid_labels: dict[int, str] = {}
    tid_labels: dict[int, str] = {}
    cols["pid"] = _ids(pid, pid_labels)
    cols["tid"] = _ids(tid, tid_labels)
    del pid, tid
    int_args, found = _arg_columns(args)
    cols.update(int_args)
    texts = {}
    for column in TEXT_ARG_COLUMNS:  # every key, None where absent (like the int args: NULL-filled when stored)
        values, cols[column] = found.get(column, ([], None))
        if cols[column] is not None:
            texts[column] = values
    cols["flow_id"] = _flow_ids(flow)
    metadata = []
    if "M" in ph_values:
        for i in np.flatnonzero(cols["ph_code"] == ph_values.index("M")).tolist():
            a = args[i]
            if a is not None and a.name is not None:
                metadata.append((name[i], int(cols["pid"][i]), int(cols["tid"][i]), a.name))
    return ChunkColumns(n, cols, ph_values, cat_values, name_values, pid_labels, tid_labels, metadata, texts)
