"""``ts`` and ``dur`` of a decoded chunk as int64 nanoseconds: exact from the JSON text where a float64 of
microseconds cannot hold whole nanoseconds, absurd values (non-finite, beyond int64 ns, over 11 days) flagged."""

from __future__ import annotations

import decimal
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from profparse.trace.schema import Event, FastChunk, FastEvent

_EXACT_TS_LIMIT_US = float(2**42)  # beyond this a float64 of microseconds cannot hold whole nanoseconds
_MAX_ABS_TS_US = 9.2e15  # int64 nanoseconds end near 9.22e18
_MAX_DUR_US = 1e12  # 11.6 days
_NOT_WHOLE = np.zeros(256, dtype=bool)  # bytes of a JSON number's text that a whole number has not
_NOT_WHOLE[list(b".eE")] = True


class _TsText(msgspec.Struct):
    ts: Any = None


_TS_TEXT = msgspec.json.Decoder(list[_TsText], float_hook=str)


def _float_column(values: Any, missing: float, text: pa.Array | None = None) -> np.ndarray:
    """ts/dur values (float, int, the text of a float or None) -> float64, ``missing`` for None.

    Text is parsed by Arrow, correctly rounded like msgspec and ``float()``; the result equals decoding floats.
    ``text``: the values as an Arrow string array, when the caller has it already.
    Arrow is tried first and refuses what it cannot take exactly (text, ints beyond 2**53): no scan of the values'
    types first (with :func:`_text_column`; scanning cost ts + dur about a third more time).
    """
    try:
        if text is not None:
            arr = text.cast(pa.float64())
        else:
            try:
                arr = pa.array(values, pa.float64())  # ints, floats and None
            except pa.ArrowInvalid:  # text (anything else fails here too)
                arr = pa.array(values, pa.string()).cast(pa.float64())
        if arr.null_count:
            arr = pc.fill_null(arr, missing)
        return arr.to_numpy(zero_copy_only=False).copy()
    except (pa.ArrowException, TypeError, OverflowError, UnicodeError):
        if text is not None:  # e.g. 1e400, which Arrow refuses and float() makes infinite
            values = text.to_pylist()
        return np.array([missing if v is None else float(v) for v in values], dtype=np.float64)


def _fast_ts_text(chunk: FastChunk) -> pa.Array:
    """A :class:`FastChunk`'s ``ts`` column as an Arrow string array (null where absent), from its buffers: no
    Python object per value. The text is ASCII (every value is a JSON number)."""
    offsets = chunk.ts_offsets
    n = len(offsets) - 1
    present = offsets[1:] != offsets[:-1]
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(chunk.ts_data)])


def _text_column(values: Any) -> pa.Array | None:
    """``ts`` values as an Arrow string array when all are text (or None, not all), else None.

    Arrow refuses ints and floats (``ts`` of :class:`Event`); the text of :class:`FastEvent` is taken by
    :func:`_fast_ts_text` instead.
    """
    try:
        text = pa.array(values, pa.string())
    except (pa.ArrowException, UnicodeError):
        return None
    return None if text.null_count == len(text) else text


_POW10 = 10 ** np.arange(19, dtype=np.int64)
_INT64_MAX = np.iinfo(np.int64).max


def _digits_to_ns(digits: np.ndarray, decimals: int | np.ndarray) -> np.ndarray | None:
    """Decimal text read as an integer with its dot dropped (``digits``, int64 or uint64, with ``decimals``
    places) -> int64 nanoseconds, rounded half to even beyond three decimals as :func:`_exact_ts_ns` rounds.
    None when a value is beyond int64 nanoseconds."""
    decimals = np.asarray(decimals)
    if int(decimals.max()) <= 3:  # Kineto's %.3f: whole nanoseconds, a multiplication
        scale = _POW10[3 - decimals]
        limit = _INT64_MAX // scale
        if digits.dtype == np.uint64:
            if int(digits.max()) > int(np.min(limit)):
                return None
            return digits.astype(np.int64) * scale
        if ((digits > limit) | (digits < -limit)).any():
            return None
        return digits * scale
    if digits.dtype == np.uint64:
        if int(digits.max()) > _INT64_MAX:
            return None
        digits = digits.astype(np.int64)
    scale = _POW10[np.clip(3 - decimals, 0, None)]
    divisor = _POW10[np.clip(decimals - 3, 0, None)]
    magnitude = np.abs(digits)  # int64's lowest value stays negative: caught by the limit below
    whole, rest = np.divmod(magnitude, divisor)
    half = divisor // 2
    whole += (divisor > 1) & ((rest > half) | ((rest == half) & (whole % 2 == 1)))
    limit = _INT64_MAX // scale
    if ((magnitude < 0) | (whole > limit)).any():
        return None
    return np.where(digits < 0, -whole, whole) * scale


def _exact_ts_fast(text: pa.Array | None) -> np.ndarray | None:
    """:func:`_exact_ts_ns` for plain decimal text with 1 to 18 decimals (``1712195495519689.047``): drop the
    dot, parse the digits as an integer, scale to nanoseconds. None when any value is not of that form."""
    if text is None or text.null_count or len(text) == 0:
        return None
    uniform = _exact_ts_uniform(text)
    if uniform is not None:
        return uniform
    dot = pc.find_substring(text, ".").to_numpy()
    decimals = pc.binary_length(text).to_numpy() - dot - 1
    if (dot < 1).any() or (decimals < 1).any() or (decimals > 18).any():
        return None
    try:
        digits = pc.replace_substring(text, ".", "", max_replacements=1).cast(pa.int64()).to_numpy()
    except pa.ArrowException:  # an exponent, a sign Arrow does not take, too many digits
        return None
    return _digits_to_ns(digits, decimals)


def _exact_ts_uniform(text: pa.Array) -> np.ndarray | None:
    """:func:`_exact_ts_fast` where every value has the same width, digits and one dot at the same place (Kineto
    writes ``%.3f`` of 16-digit microseconds): the digits are read from Arrow's data buffer as an (n, width)
    byte matrix by numpy, no string kernels: about twice as fast as the kernels.
    None when the values are not of that form (then the string kernels decide)."""
    n = len(text)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * text.offset)
    width = int(offsets[1] - offsets[0])
    if not 3 <= width <= 20 or (np.diff(offsets) != width).any():  # at most 19 digits: < 2**64
        return None
    data = np.frombuffer(text.buffers()[2], dtype=np.uint8, count=n * width, offset=int(offsets[0]))
    data = data.reshape(n, width)
    dot = int(np.argmax(data[0] == 46))  # '.'
    decimals = width - dot - 1
    if data[0, dot] != 46 or dot < 1 or decimals < 1 or (data[:, dot] != 46).any():
        return None
    numbers = (np.delete(data, dot, axis=1) - np.uint8(48)).T.copy()  # wraps below '0': each digit must be <= 9
    if (numbers > 9).any():
        return None
    digits = numbers[0].astype(np.uint64)
    for column in numbers[1:]:  # Horner, one column of digits at a time (an integer matmul is 5x slower)
        digits *= np.uint64(10)
        digits += column
    return _digits_to_ns(digits, decimals)


def _us_to_ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (float64) -> int64 nanoseconds, rounding to the nearest nanosecond."""
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000).astype(np.int64)


def _exact_ts_ns(texts: list[Any]) -> np.ndarray:
    """Timestamps as decoded text (floats) or ints (whole microseconds) -> exact int64 nanoseconds, rounded half
    to even."""
    as_text = [v if isinstance(v, str) else ("0" if v is None else str(v)) for v in texts]
    try:
        dec = pa.array(as_text, pa.string()).cast(pa.decimal128(30, 6))
    except pa.ArrowInvalid:  # more than six decimals (or a form Arrow does not take): one value at a time
        return np.array([_decimal_ns(v) for v in as_text], dtype=np.int64)
    scaled = pc.multiply(dec, pa.scalar(1000, pa.decimal128(4, 0)))
    return pc.round(scaled, 0).cast(pa.int64()).to_numpy()


def _decimal_ns(text: str) -> int:
    """One timestamp's text -> nanoseconds, rounded half to even (0 for text that is not a finite number)."""
    try:
        value = (decimal.Decimal(text) * 1000).to_integral_value(decimal.ROUND_HALF_EVEN)
    except decimal.InvalidOperation:
        return 0
    return int(value) if value.is_finite() and abs(value) <= _INT64_MAX else 0


def _fraction_lost(events: list[Event] | list[FastEvent], ts: np.ndarray) -> bool:
    """Whether the chunk's float64 microseconds may have lost nanoseconds of its ``ts`` text: a value at or beyond
    :data:`_EXACT_TS_LIMIT_US` and one with a fraction. The text tells where the chunk has it (every value a
    number, the way Kineto writes them): from 2**50 us (epoch microseconds) a float64 rounds to 0.25 us, so
    ``1700000000000085.896`` reads as a whole number and a test of the floats' fractions missed a chunk whose every
    fraction rounded away. Otherwise the floats' fractions decide."""
    big = np.abs(ts).max(initial=0.0)
    if big < _EXACT_TS_LIMIT_US:
        return False
    if isinstance(events, FastChunk):
        return bool(_NOT_WHOLE[np.frombuffer(events.ts_data, dtype=np.uint8)].any())
    return bool((ts % 1).any())


def time_columns(
    events: list[Event] | list[FastEvent],
    ts_values: tuple[Any, ...],
    dur_values: tuple[Any, ...],
    raw_chunk: bytes | None,
) -> dict[str, np.ndarray]:
    """``ts_ns``, ``ts_missing``, ``absurd_time``, ``dur_ns`` and ``negative_dur`` of a chunk; ``raw_chunk`` is
    its JSON text when it decoded without repairs."""
    cols: dict[str, np.ndarray] = {}
    if isinstance(events, FastChunk):  # ts as JSON text (numbers, or empty where absent)
        text = _fast_ts_text(events)
        ts = _float_column(None, np.nan, text)
    else:
        text = _text_column(ts_values)
        ts = _float_column(ts_values, np.nan, text)
    dur = _float_column(dur_values, 0.0)
    missing_ts = np.isnan(ts)
    # absurd values (overflow int64 ns, infinities, durations over 11 days) would poison every sum: drop them
    absurd = ~missing_ts & ((np.abs(ts) > _MAX_ABS_TS_US) | ~np.isfinite(ts))
    absurd |= ~np.isfinite(dur) | (np.abs(dur) > _MAX_DUR_US)
    ts[missing_ts | absurd] = 0.0
    dur[absurd] = 0.0
    if raw_chunk is not None and _fraction_lost(events, ts):
        if not isinstance(events, FastChunk):  # floats were parsed: read the timestamps' text again
            ts_values = [t.ts for t in _TS_TEXT.decode(raw_chunk)]
            text = None
        exact = _exact_ts_fast(text)
        if exact is None and text is not None:
            ts_values = text.to_pylist()
        cols["ts_ns"] = exact if exact is not None else _exact_ts_ns(ts_values)
    else:
        cols["ts_ns"] = _us_to_ns(ts)
    del ts_values, ts, text
    cols["ts_missing"] = missing_ts
    cols["absurd_time"] = absurd
    cols["dur_ns"] = np.maximum(_us_to_ns(dur), 0)
    cols["negative_dur"] = dur < 0
    return cols
