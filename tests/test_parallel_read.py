"""The parallel reader (chunks decoded in forked processes) gives exactly what the sequential one gives."""

from __future__ import annotations

import gzip
import json
import random
import sys
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pytest
from conftest import shared_traces
from tracebuilder import TraceBuilder, training_step

from profparse.base.errors import ProfparseError
from profparse.trace.events import read_trace
from profparse.trace.workers import worker_count

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parallel reader forks (Linux only)")


def outcome(path, workers: int, chunk_bytes: int, strict: bool = False):
    try:
        raw = read_trace(path, workers=workers, chunk_bytes=chunk_bytes, strict=strict)
    except ProfparseError as exc:  # a user-facing error: compared below; anything else is a bug and fails here
        return ("error", type(exc).__name__, str(exc))
    return ("ok", raw)


def assert_same(path, chunk_bytes: int, strict: bool = False, expect: str | None = "ok") -> None:
    """Both readers give ``expect`` ("ok", or the name of the ProfparseError raised; None: either) and the same
    result."""
    seq = outcome(path, 1, chunk_bytes, strict)
    par = outcome(path, 2, chunk_bytes, strict)
    assert seq[0] == par[0], (seq, par)
    if expect is not None:
        assert (seq[0] if seq[0] == "ok" else seq[1]) == expect, seq
    if seq[0] == "error":
        assert seq == par
        return
    a, b = seq[1], par[1]
    assert a.events.equals(b.events)
    assert a.events.attrs == b.events.attrs
    assert list(a.events.columns) == list(b.events.columns)
    assert [a.events[c].dtype for c in a.events] == [b.events[c].dtype for c in b.events]
    assert vars(a.report) == vars(b.report)
    assert a.header == b.header
    assert (a.process_names, a.thread_names, a.pid_labels, a.tid_labels) == (
        b.process_names,
        b.thread_names,
        b.pid_labels,
        b.tid_labels,
    )


def document() -> dict:
    b = TraceBuilder()
    for step in range(6):
        training_step(b, step, step * 100)
    b.memory(3, 4096, 4096)
    doc = b.document()
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": 'odd "},{" name', "pid": 1, "tid": 100, "ts": 1})
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "x", "pid": "labelled", "tid": 5, "ts": 2})
    return doc


@pytest.mark.parametrize("chunk_bytes", [200, 700, 4000])
def test_same_table_as_sequential(tmp_path, chunk_bytes):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document(), indent=1))
    assert_same(path, chunk_bytes)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert_same(gz, chunk_bytes)


def test_nanosecond_text_timestamps(tmp_path):
    events = [
        f'{{"ph": "X", "cat": "cpu_op", "name": "op{i % 7}", "pid": 1, "tid": 1, '
        f'"ts": 1712195495519{i:03d}.{i % 1000:03d}, "dur": 1.25}}'
        for i in range(400)
    ]
    path = tmp_path / "ns.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(events) + '\n], "traceName": "x"}')
    assert_same(path, 1000)


def test_truncated_and_corrupt_files(tmp_path):
    text = json.dumps(document(), indent=1).encode()
    path = tmp_path / "cut.json"
    events_start = text.index(b'"traceEvents": [') + 16
    for cut in range(1, len(text), max(1, len(text) // 16)):
        path.write_bytes(text[:cut])
        before_events = cut < events_start
        assert_same(path, 500, expect="TraceFormatError" if before_events else "ok")
        assert_same(path, 500, strict=True, expect="TraceFormatError" if before_events else "TruncatedTraceError")
    rng = random.Random(7)
    first, last = events_start + 1, text.rindex(b"]")
    for _ in range(16):
        broken = bytearray(text)
        broken[rng.randrange(first, last)] = rng.choice(b'{}[]",:0a\\\x00\xff')
        path.write_bytes(bytes(broken))
        try:
            json.loads(bytes(broken))
        except ValueError:  # skipped (or refused when over 1% of the file), the same way; with --strict refused
            assert_same(path, 500, expect=None)
            assert_same(path, 500, strict=True, expect="TraceFormatError")
        else:
            assert_same(path, 500)


def test_type_changes(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "types.json"
    for _ in range(15):
        doc = document()
        event = rng.choice(doc["traceEvents"])
        event[rng.choice(["ts", "dur", "pid", "tid", "id", "name", "cat", "ph"])] = rng.choice(
            [None, True, "12.5", "abc", 2**70, [1], {"a": 1}, 3.5]
        )
        path.write_text(json.dumps(doc))
        assert_same(path, 600)


@pytest.mark.parametrize("trace", shared_traces(), ids=lambda p: p.name)
def test_shared_traces(trace):
    assert_same(trace, 1 << 20)


def test_worker_count(tmp_path, monkeypatch):
    small = tmp_path / "s.json"
    small.write_text('{"traceEvents": []}')
    monkeypatch.delenv("PROFPARSE_WORKERS", raising=False)
    assert worker_count(small) == 1  # small files are read here
    assert worker_count(small, 3) == 3
    monkeypatch.setenv("PROFPARSE_WORKERS", "1")
    assert worker_count(small) == 1
    monkeypatch.setenv("PROFPARSE_WORKERS", "2")
    assert worker_count(small) == 2


def test_exact_timestamp_fast_path_equals_decimal_path():
    import pyarrow as pa

    from profparse.trace.timestamps import _exact_ts_fast, _exact_ts_ns

    rng = random.Random(11)
    texts = ["1712195495519689.047", "-0.500", "0.1", "12.34", "4458676388068.751", "7.000", "1e3", "1.5e3", "7.1234"]
    texts += [f"{rng.randrange(9 * 10**15)}.{rng.randrange(1000):03d}"[: rng.choice([-2, -1, 20])] for _ in range(300)]
    for sample in [texts[:1], texts[:4], texts[4:6], texts[6:], texts[9:], ["-5.25", "3.5"]]:
        fast = _exact_ts_fast(pa.array(sample, pa.string()))
        slow = _exact_ts_ns(sample)
        if fast is not None:
            assert fast.tolist() == slow.tolist(), sample
    assert _exact_ts_fast(pa.array(texts[9:], pa.string())) is not None
    assert _exact_ts_fast(pa.array(["1e3", "1.0"], pa.string())) is None
    # more decimals than whole nanoseconds (a float's repr after arithmetic, hand-written text): rounded half to
    # even, on both paths, ties included; beyond six decimals the slow path takes one value at a time
    ties = [f"{rng.randrange(-10**9, 9 * 10**11)}.{rng.randrange(1000):03d}{tail}" for tail in ("5", "50", "5000")
            for _ in range(40)]  # fmt: skip
    many = [f"{rng.randrange(9 * 10**11)}.{rng.randrange(10**d):0{d}d}" for d in (4, 5, 6, 7) for _ in range(40)]
    for sample in [ties, many, ties + many + texts[9:]]:
        fast = _exact_ts_fast(pa.array(sample, pa.string()))
        slow = _exact_ts_ns(sample)
        exact = [int((Decimal(t) * 1000).to_integral_value(ROUND_HALF_EVEN)) for t in sample]
        assert fast is not None and fast.tolist() == exact and slow.tolist() == exact


def test_growing_columns_and_args_seen_late(tmp_path, monkeypatch):
    import profparse.trace.table as table_module

    doc = document()
    late = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 100, "ts": 900, "s": "t"}
    doc["traceEvents"].append({**late, "args": {"Bytes": 64, "Total Allocated": 128, "Addr": 7, "Python id": 3}})
    path = tmp_path / "late.json"
    path.write_text(json.dumps(doc, indent=1))
    whole = read_trace(path, workers=1)
    monkeypatch.setattr(table_module, "_INITIAL_ROWS", 7)
    small = read_trace(path, workers=1, chunk_bytes=300)
    assert whole.events.equals(small.events)
    assert small.events["mem_bytes"].iloc[-1] == 64 and small.events["python_id"].iloc[-1] == 3
    assert not small.events["python_parent_id"].to_numpy().flags.writeable  # absent everywhere: no memory


def test_columns_left_in_shared_memory_whole_or_in_part(tmp_path, monkeypatch):
    """Workers hand a chunk's columns back in shared memory as far as they fit, the rest through the pipe: the
    table is the sequential reader's either way."""
    import profparse.trace.workers as workers

    doc = document()
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=1))
    room = {}
    original = workers._Slots.result_view

    def small_view(self, slot):
        return original(self, slot)[: room["bytes"]]

    monkeypatch.setattr(workers._Slots, "result_view", small_view)
    for room["bytes"] in (0, 200, 1000, 1 << 20):  # none fits, some, all
        assert_same(path, 700)

    events, raw = workers.ChunkDecoder("").decode_body(json.dumps(doc["traceEvents"])[1:-1].encode())
    made = workers.chunk_columns(events, raw)
    expected = {key: None if values is None else values.copy() for key, values in made.cols.items()}
    buffer = memoryview(bytearray(600))
    workers._columns_out(made, buffer)
    placed = [key for key, values in made.cols.items() if isinstance(values, workers._InSlot)]
    assert placed and len(placed) < sum(v is not None for v in expected.values())  # the rest stayed arrays
    workers._columns_in(made, buffer)
    for key, values in expected.items():
        got = made.cols[key]
        assert (got is None) if values is None else (got.dtype == values.dtype and np.array_equal(got, values)), key
