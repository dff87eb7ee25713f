"""The read phase's column building (events.chunk_columns) on the cases its fast paths branch on: events with and
without ``args``, fields present in some chunks only, an integer beyond int64, text ``args`` on a few rows, and
pid/tid as ints, numeric strings and labels. Every row is checked against the file's own values."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from profparse.trace.events import read_trace
from profparse.trace.kinds import INT_ARG_COLUMNS, NULL, OPTIONAL_ARG_COLUMNS, TEXT_ARG_COLUMNS
from profparse.trace.schema import Args
from profparse.trace.timestamps import _exact_ts_uniform

KEY_OF = dict(zip(Args.__struct_fields__, Args.__struct_encode_fields__, strict=True))
INT_KEYS = {KEY_OF[attr]: column for column, attr in INT_ARG_COLUMNS}
TEXT_KEYS = {KEY_OF[column]: column for column in TEXT_ARG_COLUMNS}
TIDS = [7, "8", "stream 7", " 9 ", "stream 7", "-9223372036854775808", "9223372036854775808", 7]


def events() -> list[dict]:
    """60 events: every third without args, ints and text args on some rows only, one int beyond int64."""
    out = []
    for i in range(60):
        event = {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i % 4}",
            "pid": 1 if i % 5 else "main",
            "ts": 10.0 + i,
            "dur": 0.5,
            "tid": TIDS[i % len(TIDS)],
        }
        if i % 3:
            args: dict = {"External id": i, "Sequence number": i * 10 if i % 2 else None}
            if 20 <= i < 30:
                args["correlation"] = 2**70 if i == 25 else -i  # one past int64: NULL in that row only
            if i % 7 == 0:
                args["Input Dims"] = [[i % 2], [3, 4]]
            if i % 11 == 0:  # newer Kineto's cuda_sync args, on a few rows: their optional columns exist
                args["wait_on_stream"] = 7
                args["wait_on_cuda_event_record_corr_id"] = i
                args["Process Group Ranks"] = "[0, 1]"
            if i >= 40:
                args = {}  # args without any known key
            event["args"] = args
        out.append(event)
    return out


def expected_id(value) -> int | str:
    """pid/tid as the table should hold it: the number, or the label (its id is checked separately)."""
    text = str(value)
    try:
        number = int(text)
    except ValueError:
        return text
    return number if -(2**63) <= number < 2**63 else text


@pytest.mark.parametrize("chunk_bytes", [400, 3000, 1 << 20])
def test_columns_equal_the_file_row_by_row(tmp_path, chunk_bytes):
    doc = events()
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    raw = read_trace(path, chunk_bytes=chunk_bytes, workers=1)
    table = raw.events
    assert table["trace_index"].tolist() == list(range(len(doc)))
    for column, _ in INT_ARG_COLUMNS:  # int64, or sparse int64 of NULL (a column set on few rows)
        assert str(table[column].dtype) in ("int64", f"Sparse[int64, {NULL}]")
        assert table[column].to_numpy().dtype == np.int64
    compared = 0
    for row, event in enumerate(doc):
        args = event.get("args") or {}
        for key, column in INT_KEYS.items():
            value = args.get(key)
            want = value if value is not None and -(2**63) < value < 2**63 else NULL
            assert int(table[column].iat[row]) == want, (row, column)
            compared += want != NULL
        for key, column in TEXT_KEYS.items():
            got = table[column].iat[row]
            if key in args:
                assert got == (args[key] if isinstance(args[key], str) else json.dumps(args[key]))  # as written
                compared += 1
            else:
                assert pd.isna(got), (row, column)
        for column, labels in (("pid", raw.pid_labels), ("tid", raw.tid_labels)):
            want = expected_id(event[column])
            got = int(table[column].iat[row])
            if isinstance(want, int):
                assert got == want, (row, column)
            else:
                assert got < 0 and labels[got] == want, (row, column)
    assert compared > 40  # the checks above saw values, not only NULLs
    ids = {expected_id(t): int(table["tid"].iat[i]) for i, t in enumerate(e["tid"] for e in doc)}
    assert ids["stream 7"] != ids["9223372036854775808"]  # two labels, two ids


STRING_INTS = ["0x0", "7", " 12 ", "-3", "1.5", "stream", "99999999999999999999", 5, None]


@pytest.mark.parametrize("chunk_bytes", [400, 1 << 20])
def test_string_integer_args_take_the_fast_path(tmp_path, chunk_bytes):
    """An integer args key written as a string (ROCm: a runtime call's ``"stream": "0x0"``) is the int it spells
    (``int()``'s rules: " 12 " is 12) or NULL ("0x0", "1.5", a word, beyond int64), as the per-event repair
    gives; the chunk is decoded in one pass (FastChunk), not event by event."""
    from profparse.trace.decode import TraceDecoder
    from profparse.trace.schema import FastChunk

    doc = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "hipLaunchKernel",
            "pid": 1,
            "tid": 2,
            "ts": 10.0 + i,
            "dur": 0.5,
            "args": {"stream": STRING_INTS[i % len(STRING_INTS)], "correlation": i},
        }
        for i in range(45)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    body = json.dumps(doc).encode()[1:-1]  # the events, as the reader hands them to the decoder
    events, text = TraceDecoder("").decode_body(body)
    assert isinstance(events, FastChunk) and text is not None
    table = read_trace(path, chunk_bytes=chunk_bytes, workers=1).events
    want = {
        "0x0": NULL,
        "7": 7,
        " 12 ": 12,
        "-3": -3,
        "1.5": NULL,
        "stream": NULL,
        "99999999999999999999": NULL,
        5: 5,
        None: NULL,
    }
    assert table["stream"].tolist() == [want[e["args"]["stream"]] for e in doc]
    assert table["correlation"].tolist() == list(range(45))


def test_chunk_without_any_args(tmp_path):
    doc = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": "x", "ts": 1.0 + i, "dur": 1.0} for i in range(5)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    table = read_trace(path, workers=1).events
    for column, _ in INT_ARG_COLUMNS:  # the optional ones are left out when no row has them
        if column in OPTIONAL_ARG_COLUMNS:
            assert column not in table.columns
        else:
            assert (table[column] == NULL).all()
    for column in TEXT_ARG_COLUMNS:
        assert table[column].isna().all()
    assert table["tid"].nunique() == 1 and int(table["tid"].iat[0]) < 0


@pytest.mark.parametrize("mixed", [False, True])
def test_timestamps_exact_with_and_without_ints(tmp_path, mixed):
    """ts as written (decimals with nanosecond digits, or whole microseconds mixed in) -> exact int64 ns."""
    base = 1712195495519689
    written = [f"{base + i}.{250 + 7 * i:03d}" for i in range(40)]  # float64 keeps only quarters here
    if mixed:
        written[::3] = [str(base + i) for i in range(0, 40, 3)]
    body = ",".join(
        f'{{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":{ts},"dur":{i % 2 and 1.5 or 2}}}'
        for i, ts in enumerate(written)
    )
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[' + body + "]}")
    table = read_trace(path, workers=1).events
    want = [int(Decimal(ts) * 1000) for ts in written]
    assert table["ts_ns"].tolist() == want
    assert table["dur_ns"].tolist() == [1500 if i % 2 else 2000 for i in range(40)]


def test_timestamps_exact_where_no_float_shows_a_fraction(tmp_path):
    """Epoch microseconds round to quarters in float64: where every fraction of a chunk rounds away (.900-.939),
    the floats look whole, yet the text has nanoseconds (they were lost: up to 125 ns per ts)."""
    written = [f"{1700000000000000 + 5 * i}.{900 + i:03d}" for i in range(40)]
    body = ",".join(f'{{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":{t},"dur":1}}' for t in written)
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[' + body + "]}")
    table = read_trace(path, workers=1).events
    assert table["ts_ns"].tolist() == [int(Decimal(t) * 1000) for t in written]


def test_missing_cat_is_the_empty_category(tmp_path):
    cats = [None, "cpu_op", "", None, "kernel"]
    for chunk in (cats, cats[1:3]):
        doc = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0 + i, "dur": 1.0} for i in range(len(chunk))]
        for event, cat in zip(doc, chunk, strict=True):
            if cat is not None:
                event["cat"] = cat
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"traceEvents": doc}))
        table = read_trace(path, workers=1).events
        assert table["category"].astype(object).tolist() == [c or "" for c in chunk]
        kinds = {None: "other", "": "other", "cpu_op": "cpu_op", "kernel": "kernel"}
        assert table["kind"].astype(str).tolist() == [kinds[c] for c in chunk]


@pytest.mark.parametrize(
    "written",
    [
        [f"{1712195495519689 + i}.{(37 * i) % 1000:03d}" for i in range(50)],  # 19 digits, Kineto's %.3f
        [f"{4458677732820 + 3 * i}.{(11 * i) % 1000:03d}" for i in range(50)],  # 16 digits
        [f"{9223372036854775 - i}.{807 - i:03d}" for i in range(50)],  # up to the last int64 nanosecond
        [f"{1712195495519689 + i}.{i % 10}" for i in range(50)],  # one decimal
        [f"{1712195495519689 + i}.{i % 100:02d}" for i in range(50)],  # two decimals, same width
        [f"{4458676917968 + i}.{(5 * i + 5) % 10000:04d}" for i in range(50)],  # four: ties round half to even
        [f"{4458676917968 + i}.{(37 * i) % 10**6:06d}" for i in range(50)],  # six, as a float's repr can have
    ],
)
def test_exact_ts_from_the_text_buffer_equals_decimal_arithmetic(written):
    """_exact_ts_uniform (digits read from Arrow's buffer) gives what Decimal gives, for every form it takes."""
    got = _exact_ts_uniform(pa.array(written, pa.string()))
    assert got is not None and got.dtype == np.int64
    assert got.tolist() == [int((Decimal(t) * 1000).to_integral_value(ROUND_HALF_EVEN)) for t in written]
    sliced = pa.array(["0.5", *written], pa.string())[1:]  # an array that starts at an offset into its buffers
    assert _exact_ts_uniform(sliced).tolist() == got.tolist()


@pytest.mark.parametrize(
    "written",
    [
        ["1712195495519689.047", "1712195495519690.5"],  # widths differ
        ["-1712195495519.047", "-1712195495520.047"],  # a sign
        ["17121954955190.470123", "17121954955190.470123"],  # 20 digits: beyond 2**64
        ["4458676918011.9734567", "4458676918012.5"],  # seven decimals: Decimal, one value at a time
        ["1.712195495519047e12", "1.712195495519048e12"],  # not only digits
        ["1712195495519689", "1712195495519690"],  # no dot
        ["9999999999999999.999", "9999999999999999.998"],  # beyond int64 nanoseconds
    ],
)
def test_exact_ts_from_the_text_buffer_declines_other_forms(tmp_path, written):
    """Text it does not take is left to the string kernels / Decimal: the table still holds exact ns."""
    assert _exact_ts_uniform(pa.array(written, pa.string())) is None
    if written[0].startswith("9999"):
        return  # beyond int64 ns: absurd, dropped (test_decode covers it)
    body = ",".join(f'{{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":{t},"dur":1}}' for t in written)
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[' + body + "]}")
    table = read_trace(path, workers=1).events
    assert table["ts_ns"].tolist() == [int(Decimal(t) * 1000) for t in written]


def test_text_args_with_the_same_count_on_other_rows(tmp_path):
    """Text fields of one chunk with equal counts on different rows (the previous field's rows are reused only
    when they hold the field), and a field on many rows (Arrow's dictionary encoding, not the dict)."""
    doc = []
    for i in range(600):
        args: dict = {"External id": i}
        if i in (1, 5):
            args["Collective name"] = "allreduce"
            args["Process Group Ranks"] = f"[{i}]"
        if i in (2, 6):
            args["dtype"] = "Float" if i == 2 else "Half"
        if i % 2:
            args["Input Dims"] = [[i % 7], [3]]
        doc.append(
            {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1.0 + i, "dur": 0.5, "args": args}
        )
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    table = read_trace(path, workers=1).events
    for key in ("Collective name", "Process Group Ranks", "dtype", "Input Dims"):
        column = TEXT_KEYS[key]
        got = table[column].astype(object).tolist()
        want = [expected_text(e["args"][key]) if key in e["args"] else None for e in doc]
        assert [None if pd.isna(g) else g for g in got] == want, key
    assert table["input_dims"].cat.categories.size == 7


def test_ts_that_is_not_a_number_reads_the_chunk_again(tmp_path):
    """null and string ``ts`` (the fast decode takes numbers only): the chunk is decoded with Event, the event
    with null ts is dropped and counted, the string is read as a number; no flow events: flow_id is NULL."""
    doc = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10.125 + i, "dur": 1} for i in range(6)
    ]
    doc[2]["ts"] = None
    doc[4]["ts"] = "14.5"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    raw = read_trace(path, workers=1)
    assert raw.events["name"].tolist() == ["op0", "op1", "op3", "op4", "op5"]
    assert raw.events["ts_ns"].tolist() == [10125, 11125, 13125, 14500, 15125]
    assert raw.report.dropped == {"event without ts": 1}
    assert (raw.events["flow_id"] == NULL).all()


def expected_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def test_args_on_few_rows_are_sparse_and_read_back_as_the_dense_column(tmp_path):
    """An args column set on at most one row in SPARSE_SHARE is stored sparse, one set on more rows dense; both read
    back (``to_numpy``) as the int64 column with NULL where the file has no value, and survive the cache's files."""
    from profparse.cache.frames import read_frame, same_frame, write_checked
    from profparse.trace.table import SPARSE_SHARE

    doc = []
    for i in range(40):
        args = {"External id": 100 + i}  # every row: dense
        if i % (2 * SPARSE_SHARE) == 0:
            args["stream"] = 7 + i  # one row in 2 * SPARSE_SHARE: sparse
        doc.append(
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0 + i, "dur": 0.5, "args": args}
        )
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    table = read_trace(path, workers=1).events
    assert isinstance(table["stream"].dtype, pd.SparseDtype)
    assert table["external_id"].dtype == np.int64
    want = [7 + i if i % (2 * SPARSE_SHARE) == 0 else NULL for i in range(40)]
    assert table["stream"].to_numpy().tolist() == want
    assert table["external_id"].to_numpy().tolist() == [100 + i for i in range(40)]
    stored = tmp_path / "events.arrow"
    assert write_checked(stored, table)
    again = read_frame(stored)
    assert same_frame(table, again) and isinstance(again["stream"].dtype, pd.SparseDtype)


def test_sparse_args_columns_are_written_as_nullable_integers(tmp_path):
    """The Parquet events table has the sparse args as int64 with nulls where the trace has no value."""
    from profparse.api import parse
    from profparse.outputs.parquet import read_parquet, write_parquet

    doc = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0 + i, "dur": 0.5, "args": {"device": 3}}
        if i == 5
        else {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1.0 + i, "dur": 0.5}
        for i in range(20)
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": doc}))
    parsed = parse(path)
    assert isinstance(parsed.raw.events["device"].dtype, pd.SparseDtype)
    events = read_parquet(write_parquet(parsed, tmp_path / "out"))["events"]
    assert events["device"].dtype == "Int64"
    assert events["device"].isna().tolist() == [i != 5 for i in range(20)] and events["device"].iloc[5] == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_metadata_events_in_a_later_chunk_are_kept_whatever_its_order_of_phases(tmp_path, workers):
    """A chunk whose phases first appear in another order than the trace's (here "M" first, where the trace saw "X"
    and "i" before it): its metadata events, which have no ts, were told apart by their chunk-local phase code
    after the codes had become the trace's, so they were dropped as "event without ts" (thread and process names
    lost). Every one is kept now, named as it was."""
    x = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 7, "dur": 2}
    events = [{**x, "ts": 10 * i} for i in range(200)]
    events.append({"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 7, "ts": 5, "s": "t"})
    later = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": t, "args": {"name": f"thread {t}"}} for t in range(40)]
    later += [{"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 7, "ts": 6, "s": "t"}]
    later += [{**x, "ts": 3000 + 10 * i} for i in range(200)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events + later}))
    raw = read_trace(path, chunk_bytes=2000, workers=workers)
    assert raw.report.dropped == {}
    assert int((raw.events["ph"].astype(str) == "M").sum()) == 40
    assert raw.thread_names[(1, 39)] == "thread 39" and len(raw.thread_names) == 40
