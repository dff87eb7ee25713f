"""Reading traces: formats, schema eras, odd values, truncation."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest
from tracebuilder import TraceBuilder, complete_events, training_step

import profparse
from profparse.base.errors import InputNotFoundError, TraceFormatError, TruncatedTraceError
from profparse.trace.events import read_trace


def small_trace() -> TraceBuilder:
    b = TraceBuilder()
    for step in range(2):
        training_step(b, step, step * 100)
    return b


def test_json_and_gzip_give_the_same_table(tmp_path):
    b = small_trace()
    a = read_trace(b.write(tmp_path / "t.json")).events
    z = read_trace(b.write(tmp_path / "t.json.gz")).events
    assert a.equals(z)
    assert list(a["trace_index"]) == list(range(len(b.events)))


def test_small_chunks_give_the_same_table(tmp_path):
    path = small_trace().write(tmp_path / "t.json")
    whole = read_trace(path).events
    chunked = read_trace(path, chunk_bytes=300).events
    assert whole.equals(chunked)


def test_times_are_integer_nanoseconds_exactly(tmp_path):
    # absolute microsecond timestamps with a fraction: a float64 cannot hold these to the nanosecond,
    # so the text is written by hand (json.dumps would already round them)
    events = [
        '{"ph": "X", "cat": "cpu_op", "name": "aten::a", "pid": 1, "tid": 1, "ts": 1712195495519695.8, "dur": 53.09}',
        '{"ph": "X", "cat": "cpu_op", "name": "aten::b", "pid": 1, "tid": 1, "ts": 1712195495519695.9, "dur": 52.9}',
    ]
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ",".join(events) + "]}")
    p = profparse.parse(path)
    ev = p.events.set_index("name")
    assert ev.loc["aten::a", "ts_ns"] == 1712195495519695800
    assert ev.loc["aten::b", "ts_ns"] == 1712195495519695900
    assert ev.loc["aten::a", "dur_ns"] == 53090
    # b ends 10 ns before a ends, so it nests inside a; float64 microseconds would break that
    assert ev.loc["aten::b", "ts_ns"] + ev.loc["aten::b", "dur_ns"] == 1712195495519748800
    assert ev.loc["aten::b", "parent_trace_index"] == ev.loc["aten::a", "trace_index"]


def test_string_pids_and_tids_and_legacy_categories(tmp_path):
    doc = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "Operator",
                "name": "aten::mm",
                "pid": 5,
                "tid": "5",
                "ts": 10,
                "dur": 5,
                "args": {"External id": 1},
            },
            {
                "ph": "X",
                "cat": "Runtime",
                "name": "cudaLaunchKernel",
                "pid": 5,
                "tid": "5",
                "ts": 11,
                "dur": 1,
                "args": {"correlation": 9},
            },
            {
                "ph": "X",
                "cat": "Kernel",
                "name": "gemm",
                "pid": 0,
                "tid": "stream 7",
                "ts": 12,
                "dur": 3,
                "args": {"correlation": 9, "stream": 7, "device": 0},
            },
            {"ph": "i", "name": "[memory]", "pid": 5, "tid": "5", "ts": 12, "s": "t", "args": {"Bytes": 64}},
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": 0,
                "dur": 100,
            },
        ]
    }
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(doc))
    p = profparse.parse(path)
    ev = p.events.set_index("name")
    assert ev.loc["aten::mm", "kind"] == "cpu_op"
    assert ev.loc["cudaLaunchKernel", "kind"] == "cuda_runtime"
    assert ev.loc["gemm", "kind"] == "kernel"
    assert ev.loc["[memory]", "kind"] == "memory"
    assert ev.loc["aten::mm", "tid"] == 5
    assert ev.loc["PyTorch Profiler (0)", "pid"] < 0  # a label gets a stable negative id
    assert p.kernels.iloc[0]["launch_op_name"] == "aten::mm"


def test_wrong_types_are_repaired_or_dropped(tmp_path):
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
            {"ph": "X", "cat": "cpu_op", "name": "string_ts", "pid": 1, "tid": 1, "ts": "20.5", "dur": "1"},
            {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 4},
            {"ph": "X", "cat": "cpu_op", "name": "list_dur", "pid": 1, "tid": 1, "ts": 30, "dur": [1]},
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "odd_args",
                "pid": 1,
                "tid": 1,
                "ts": 40,
                "dur": 1,
                "args": {"correlation": "x12", "External id": 3.0},
            },
            7,
        ]
    }
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    raw = read_trace(path)
    names = list(raw.events["name"])
    assert names == ["ok", "string_ts", "odd_args"]
    assert raw.events.set_index("name").loc["string_ts", "ts_ns"] == 20500
    assert raw.report.dropped == {
        "event without ts": 1,
        "complete event without numeric dur": 1,
        "event is not a JSON object": 1,
    }


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.77, 0.95])
def test_truncated_trace_recovers_complete_events(tmp_path, fraction):
    b = small_trace()
    text = json.dumps(b.document(), indent=1).encode()
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: int(len(text) * fraction)])
    raw = read_trace(cut)
    assert raw.report.truncated
    n = len(raw.events)
    assert 0 < n < len(b.events)
    # every event recovered is exactly the event in the full file
    full = read_trace(b.write(tmp_path / "full.json")).events
    assert raw.events["name"].astype(str).tolist() == full["name"].astype(str).tolist()[:n]
    with pytest.raises(TruncatedTraceError):
        read_trace(cut, strict=True)


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9, 0.98])
def test_truncated_gzip_stream_recovers_what_the_plain_cut_recovers(tmp_path, fraction):
    b = TraceBuilder()
    for step in range(40):
        training_step(b, step, step * 100)
    text = json.dumps(b.document(), indent=1).encode()
    data = gzip.compress(text)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: int(len(data) * fraction)])
    inflated = zlib.decompressobj(31).decompress(cut.read_bytes())  # every byte a cut .json.gz still holds
    assert 0 < len(inflated) < len(text)
    plain = tmp_path / "cut.json"
    plain.write_bytes(inflated)
    from_gz, from_plain = read_trace(cut), read_trace(plain)
    assert from_gz.report.truncated and from_plain.report.truncated
    assert from_gz.events.equals(from_plain.events)
    full = read_trace(b.write(tmp_path / "full.json")).events
    n = len(from_gz.events)
    for column in ("name", "ts_ns", "dur_ns", "correlation"):  # exactly the first n events of the full file
        assert from_gz.events[column].astype(object).tolist() == full[column].astype(object).tolist()[:n]
    assert n == sum(1 for _ in complete_events(inflated))
    with pytest.raises(TruncatedTraceError):
        read_trace(cut, strict=True)


def test_gzip_cut_inside_its_checksum_loses_no_event(tmp_path):
    b = small_trace()
    data = gzip.compress(json.dumps(b.document()).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(data[:-5])  # the JSON is complete, the 8-byte trailer (CRC, size) is not
    raw = read_trace(path)
    assert not raw.report.truncated
    assert len(raw.events) == len(b.events)


def test_corrupt_gzip_is_an_error(tmp_path):
    data = bytearray(gzip.compress(json.dumps(small_trace().document()).encode()))
    data[-6] ^= 0xFF  # the CRC at the end
    path = tmp_path / "crc.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="corrupt compressed data"):
        read_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"not json at all", "not JSON"),
        (b'{"a": 1}', "traceEvents"),
        (b"[1, 2, 3]", "bare JSON array"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X" "name"}]}', "malformed"),
    ],
)
def test_bad_input_raises_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        read_trace(path)


def test_missing_and_directory_inputs(tmp_path):
    with pytest.raises(InputNotFoundError):
        read_trace(tmp_path / "nope.json")
    with pytest.raises(InputNotFoundError):
        read_trace(tmp_path)


def test_header_and_trailer_keys_are_kept(tmp_path):
    b = small_trace()
    b.header["distributedInfo"] = {"rank": 3, "world_size": 4}
    raw = read_trace(b.write(tmp_path / "t.json"))
    assert raw.header["distributedInfo"]["rank"] == 3
    assert raw.header["traceName"] == "built-by-tests"
    assert np.issubdtype(raw.events["ts_ns"].dtype, np.integer)


@pytest.mark.parametrize("workers", [1, 2])
def test_trailer_arrays_after_the_events_are_header_not_damage(tmp_path, workers):
    """Kineto (2024) writes ``"INFO": [...]`` after the events; its ']' is not the end of the event array."""
    events = ",\n".join(
        f'{{"ph": "X", "cat": "cpu_op", "name": "op{i}", "pid": 1, "tid": 1, "ts": {10 * i}, "dur": 5}}'
        for i in range(2000)
    )
    text = (
        '{"schemaVersion": 1, "traceEvents": [\n' + events + '\n  ],\n  "INFO": ["INFO:2024 a", "INFO:2024 b]"],'
        '\n  "traceName": "x.json", "nested": [{"a": [1]}],\n  "baseTimeNanoseconds": 17\n}'
    )
    path = tmp_path / "info.json"
    path.write_text(text)
    raw = read_trace(path, workers=workers, chunk_bytes=1 << 14)
    assert raw.report.dropped == {}
    assert raw.report.skipped_bytes == 0
    assert len(raw.events) == 2000
    assert raw.header["INFO"] == ["INFO:2024 a", "INFO:2024 b]"]
    assert raw.header["baseTimeNanoseconds"] == 17
    assert raw.header["nested"] == [{"a": [1]}]


def test_absurd_times_are_dropped_and_negative_durations_clamped(tmp_path):
    path = tmp_path / "absurd.json"
    path.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 10, "dur": 5},'
        '{"ph": "X", "cat": "cpu_op", "name": "huge_ts", "pid": 1, "tid": 1, "ts": 1e300, "dur": 5},'
        '{"ph": "X", "cat": "cpu_op", "name": "huge_dur", "pid": 1, "tid": 1, "ts": 20, "dur": 1e17},'
        '{"ph": "X", "cat": "cpu_op", "name": "neg", "pid": 1, "tid": 1, "ts": 30, "dur": -4}]}'
    )
    p = profparse.parse(path)
    assert list(p.events["name"]) == ["ok", "neg"]
    assert p.events.set_index("name").loc["neg", "dur_ns"] == 0
    checks = set(p.warnings["check"])
    assert {"dropped_events", "negative_duration"} <= checks


def test_pid_beyond_int64_becomes_a_label(tmp_path):
    path = tmp_path / "bigpid.json"
    path.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
        '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 100000000000000000000000, "tid": 1, "ts": 2, "dur": 1}]}'
    )
    raw = read_trace(path)
    assert list(raw.events["name"]) == ["a", "b"]
    assert raw.events["pid"].iloc[1] < 0
    assert raw.pid_labels[int(raw.events["pid"].iloc[1])] == "100000000000000000000000"


@pytest.mark.parametrize("events", [6, 400])
def test_lone_surrogate_escape_in_the_last_event_is_read_as_a_replacement_character(tmp_path, events):
    """msgspec reports a lone ``\\ud800`` at the end of the input as "truncated": the reader once retried the same
    region until Python's recursion limit ("JSON nested too deeply"), then skipped the event (and refused a small
    file: one event of six is over 1% of it); it is read as U+FFFD and counted (issue 25)."""
    event = {"ph": "X", "name": "a", "pid": 1, "tid": 1, "dur": 1.0}
    rows = [{**event, "ts": i + 1.0, "cat": "cpu_op"} for i in range(events)]  # the escape ends the last event
    text = json.dumps({"traceEvents": rows})
    text = text[: text.rindex('"cpu_op"')] + '"\\ud800"' + text[text.rindex('"cpu_op"') + len('"cpu_op"') :]
    path = tmp_path / "t.json"
    path.write_text(text)
    raw = read_trace(path, workers=1)
    assert len(raw.events) == events
    assert raw.events["category"].astype(str).iloc[-1] == "\ufffd"
    assert raw.report.lone_surrogates == 1 and not raw.report.dropped
