"""The shape of a Kineto trace's events as profparse decodes them: msgspec structs with only the fields it uses,
the repair of events with odd field types, and the decoder's report."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

Num = int | float
ABSENT = -(2**63)  # an integer ``args`` key not in the event (see :class:`Args`); == kinds.NULL


class Args(
    msgspec.Struct,
    gc=False,
    rename={
        "external_id": "External id",
        "sequence_number": "Sequence number",
        "fwd_thread_id": "Fwd thread id",
        "mem_bytes": "Bytes",
        "total_allocated": "Total Allocated",
        "total_reserved": "Total Reserved",
        "device_type": "Device Type",
        "device_id": "Device Id",
        "addr": "Addr",
        "python_id": "Python id",
        "python_parent_id": "Python parent id",
        "comm_in_nelems": "In msg nelems",
        "comm_out_nelems": "Out msg nelems",
        "comm_group_size": "Group size",
        "comm_seq": "Seq",
        "input_dims": "Input Dims",
        "input_types": "Input type",
        "concrete_inputs": "Concrete Inputs",
        "collective": "Collective name",
        "comm_dtype": "dtype",
        "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description",
        "pg_ranks": "Process Group Ranks",
        "wait_on_event_correlation": "wait_on_cuda_event_record_corr_id",
    },
):
    """The ``args`` keys profparse reads; all others are skipped without being materialised.

    An integer key that is absent decodes as :data:`ABSENT` (one shared int, the event table's NULL), not None:
    a column of a chunk is then a tuple of ints that numpy converts in C, and one without any value is found by
    ``tuple.count(ABSENT)`` (an identity check per item). None is left for an explicit JSON ``null``. A string is
    accepted too (ROCm traces write a runtime call's ``stream`` as ``"0x0"``) and turned into an int, or NULL, as
    :func:`coerce_event` does, by :func:`profparse.trace.columns.chunk_columns`: a chunk with one such event used to
    fail the fast decoding and be decoded event by event (see profparse.trace.columns).
    """

    correlation: int | str | None = ABSENT
    external_id: int | str | None = ABSENT
    sequence_number: int | str | None = ABSENT
    fwd_thread_id: int | str | None = ABSENT
    stream: int | str | None = ABSENT
    device: int | str | None = ABSENT
    bytes: int | str | None = ABSENT
    mem_bytes: int | str | None = ABSENT
    total_allocated: int | str | None = ABSENT
    total_reserved: int | str | None = ABSENT
    device_type: int | str | None = ABSENT
    device_id: int | str | None = ABSENT
    addr: int | str | None = ABSENT
    python_id: int | str | None = ABSENT
    python_parent_id: int | str | None = ABSENT
    comm_in_nelems: int | str | None = ABSENT
    comm_out_nelems: int | str | None = ABSENT
    comm_group_size: int | str | None = ABSENT
    comm_seq: int | str | None = ABSENT
    wait_on_stream: int | str | None = ABSENT  # cuda_sync Event Sync / Stream Wait Event (newer Kineto)
    wait_on_event_correlation: int | str | None = ABSENT
    name: str | None = None
    # kept as the JSON text as written (msgspec.Raw: a slice of the input, no Python objects built), None when
    # absent; turned into categorical string columns by columns.chunk_columns (shapes repeat: few distinct values)
    input_dims: msgspec.Raw = None  # type: ignore[assignment]
    input_types: msgspec.Raw = None  # type: ignore[assignment]
    concrete_inputs: msgspec.Raw = None  # type: ignore[assignment]
    collective: msgspec.Raw = None  # type: ignore[assignment]
    comm_dtype: msgspec.Raw = None  # type: ignore[assignment]
    pg_name: msgspec.Raw = None  # type: ignore[assignment]
    pg_desc: msgspec.Raw = None  # type: ignore[assignment]
    pg_ranks: msgspec.Raw = None  # type: ignore[assignment]


TEXT_ARG_FIELDS = (
    "input_dims",
    "input_types",
    "concrete_inputs",
    "collective",
    "comm_dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
)


class Event(msgspec.Struct, gc=False):
    """One entry of ``traceEvents`` with the fields profparse uses."""

    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: Num | None = None
    dur: Num | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None


NO_TS = msgspec.Raw(b"")  # FastEvent.ts of an event without ``ts``


class FastEvent(msgspec.Struct, gc=False):
    """:class:`Event` with ``ts`` kept as the JSON text (msgspec.Raw: a view into the decoded text; :data:`NO_TS`
    when absent).

    The text keeps nanosecond digits that a float64 of microseconds loses, so one decoding pass serves both the
    float and the exact timestamp paths. A chunk where a ``ts`` is not a number (null, a string) is decoded again
    with :class:`Event` and repaired event by event. Raw instead of a ``float_hook`` that made a str per float:
    msgspec no longer calls back into Python per event (decoding alone ~15% faster), and the column is built from
    one ``bytes.join`` (:class:`FastChunk`) instead of an Arrow conversion of the str objects. Where ``ts`` are
    whole microseconds (legacy traces: ints, no hook before) decoding is ~10% slower and the columns ~8% faster:
    the same worker CPU.
    """

    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: msgspec.Raw = NO_TS
    dur: Num | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None


class FastChunk(list):
    """A decoded chunk of :class:`FastEvent` with its ``ts`` values as one text column: ``ts_data`` (every value's
    text, one after another) and ``ts_offsets`` (int32, one more than the events; an empty value: no ``ts``)."""

    __slots__ = ("ts_data", "ts_offsets")

    ts_data: bytes
    ts_offsets: np.ndarray


def fast_chunk(fast: list[FastEvent]) -> FastChunk | None:
    """``fast`` with its ``ts`` column, or None when a ``ts`` is not a number (its text does not start with a
    digit or ``-``: null, a string, an object; msgspec checked the syntax, so one that does is a JSON number)."""
    values = list(map(_GET_TS, fast))
    lengths = np.fromiter(map(len, values), dtype=np.int32, count=len(values))
    data = b"".join(values)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    first = np.frombuffer(data, dtype=np.uint8)[offsets[:-1][lengths > 0]]
    if not (((first >= 48) & (first <= 57)) | (first == 45)).all():
        return None
    chunk = FastChunk(fast)
    chunk.ts_data, chunk.ts_offsets = data, offsets
    return chunk


class LooseEvent(msgspec.Struct):
    """Fallback shape for events whose fields have unexpected types; cleaned by :func:`coerce_event`."""

    ph: Any = ""
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    args: Any = None


_GET_TS = attrgetter("ts")
_ARGS = msgspec.json.Decoder(Args)

Decoded = tuple[list[Event] | list[FastEvent], bytes | None]


@dataclass
class DecodeReport:
    """What the decoder noticed while reading: counts and where the file ended."""

    path: str
    bytes_read: int = 0
    events_read: int = 0
    truncated: bool = False
    truncated_at_byte: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    malformed_at_byte: int | None = None  # the first malformed event skipped
    skipped_bytes: int = 0  # bytes of malformed events skipped
    nonfinite_values: int = 0  # NaN / Infinity tokens, read as non-finite floats
    trailing_bytes: int = 0  # bytes after the end of the JSON document, ignored
    lone_surrogates: int = 0  # surrogate escapes (\ud800) without their pair, read as U+FFFD
    events_end_byte: int | None = None  # offset of the ']' that closes traceEvents (in the uncompressed text)
    document_end_byte: int | None = None  # offset just after the '}' that closes the document

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def integer_value(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


_GET_TEXT_ARGS = attrgetter(*TEXT_ARG_FIELDS)
_NO_TEXT = (None,) * len(TEXT_ARG_FIELDS)


def own_text_args(events: list[Any]) -> None:
    """Replace each text ``args`` field and :class:`FastEvent` ``ts`` (a msgspec.Raw: a view into the chunk's
    buffer, which is reused or released after decoding) by its own bytes. Only a retry after a decode error gets
    here (a first decode reads a copy of the text)."""
    if isinstance(events, FastChunk):
        for event in events:
            event.ts = msgspec.Raw(bytes(event.ts))
    for event in events:
        args = event.args
        if args is None or _GET_TEXT_ARGS(args) == _NO_TEXT:
            continue
        for field_name in TEXT_ARG_FIELDS:
            value = getattr(args, field_name)
            if value is not None:
                setattr(args, field_name, bytes(value))


def _raw_json(value: Any) -> msgspec.Raw | None:
    """A loosely decoded value as JSON text again (a text ``args`` field), or None when it cannot be encoded."""
    try:
        return msgspec.Raw(msgspec.json.encode(value))
    except (TypeError, ValueError, OverflowError):
        return None


def coerce_event(loose: LooseEvent, report: DecodeReport) -> Event | None:
    """Repair an event with odd field types, or drop it (counted in ``report``) when it cannot be used."""
    ph = loose.ph if isinstance(loose.ph, str) else ""
    ts = _number(loose.ts)
    if ph in ("X", "i", "I", "s", "f", "t", "B", "E") and ts is None:
        report.drop("missing or non-numeric ts")
        return None
    dur = _number(loose.dur)
    if ph == "X" and dur is None:
        report.drop("complete event without numeric dur")
        return None
    args: Args | None = None
    if isinstance(loose.args, dict):
        clean: dict[str, Any] = {}
        for field_name in Args.__struct_fields__:
            key = Args.__struct_encode_fields__[Args.__struct_fields__.index(field_name)]
            if key in loose.args:
                raw = loose.args[key]
                if field_name in TEXT_ARG_FIELDS:
                    clean[field_name] = _raw_json(raw)
                elif field_name == "name":
                    clean[field_name] = raw if isinstance(raw, str) else None
                else:
                    clean[field_name] = integer_value(raw)
        args = Args(**clean)
    pid = loose.pid if isinstance(loose.pid, int | str) and not isinstance(loose.pid, bool) else None
    tid = loose.tid if isinstance(loose.tid, int | str) and not isinstance(loose.tid, bool) else None
    flow_id = loose.id if isinstance(loose.id, int | str) and not isinstance(loose.id, bool) else None
    return Event(
        ph=ph,
        name=loose.name if isinstance(loose.name, str) else str(loose.name),
        cat=loose.cat if isinstance(loose.cat, str) else None,
        ts=ts,
        dur=dur,
        pid=pid,
        tid=tid,
        id=flow_id,
        args=args,
    )


def decode_args(raw: bytes) -> Args:
    """Decode one ``args`` object (used by tests and tools that build events by hand)."""
    return _ARGS.decode(raw)
