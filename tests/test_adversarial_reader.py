"""Adversarial cases for the trace reader and ``annotate`` (issue 25, items 4, 5 and 11): valid documents read as
written, whatever follows the event array, and an annotated copy that is always valid JSON holding every header key.

Each input is a real document (built with :class:`tracebuilder.TraceBuilder`) with one twist; each is run through
the CLI in a fresh process and, where it says more, read in-process too.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from adversarial import REPO, assert_clean_failure, assert_success, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

from profparse.base.errors import OutOfMemoryError
from profparse.trace.budget import NEED_FIXED, NEED_PER_JSON_BYTE
from profparse.trace.decode import MAX_CHUNK_EVENTS, TraceDecoder
from profparse.trace.events import read_trace
from profparse.trace.table import EventTableBuilder

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc and rlimits (Linux)")

NO_CACHE = {"PROFPARSE_CACHE_MAX_BYTES": "0"}
BOM = b"\xef\xbb\xbf"


def _trace(steps: int = 3) -> TraceBuilder:
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        t = training_step(b, step, t)
    return b


def _events_text(b: TraceBuilder) -> bytes:
    return json.dumps(b.events, indent=1).encode()


def _document(b: TraceBuilder, after: bytes = b"", before: bytes = b'"schemaVersion": 1, ') -> bytes:
    """``{before "traceEvents": [...] after}``: ``after`` starts with ``,`` when it holds keys."""
    return b"{" + before + b'"traceEvents": ' + _events_text(b) + after + b"}"


def _samples(n: int) -> bytes:
    """A Chrome trace's ``stackFrames`` and ``samples`` (objects with ts, name, pid, tid: they look like events)."""
    frames = ",".join(f'"{i}": {{"name": "frame{i}", "category": "py"}}' for i in range(50))
    samples = ",".join(
        f'{{"ts": {1000 + i}, "name": "sample", "pid": 1, "tid": 100, "sf": "{i % 50}", "weight": 1}}' for i in range(n)
    )
    return (', "stackFrames": {' + frames + '}, "samples": [' + samples + "]").encode()


# -- item 5: the reader stops at the end of traceEvents ---------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_samples_after_the_event_array_are_not_events(tmp_path: Path, workers: int) -> None:
    """20,000 ``samples`` objects after ``traceEvents`` (more than a chunk) are header, not events; keys placed
    after the events (distributedInfo, deviceProperties) are read as header keys."""
    b = _trace()
    after = _samples(20_000) + b', "distributedInfo": {"rank": 3, "world_size": 4}, "deviceProperties": [{"id": 0}]'
    path = tmp_path / "chrome.json"
    path.write_bytes(_document(b, after))
    raw = read_trace(path, workers=workers, chunk_bytes=64 << 10)
    assert raw.report.events_read == len(b.events)
    assert len(raw.events) == len(b.events) - 0  # every event has ts (metadata is kept)
    assert raw.header["distributedInfo"] == {"rank": 3, "world_size": 4}
    assert raw.header["deviceProperties"] == [{"id": 0}]
    assert len(raw.header["samples"]) == 20_000
    assert not raw.report.dropped and not raw.report.skipped_bytes
    run = run_cli("summarize", str(path), "--format", "json", env=NO_CACHE)
    assert_success(run)
    assert "malformed" not in run.stderr


def test_two_trace_events_arrays_are_refused(tmp_path: Path) -> None:
    """JSON readers keep the last ``traceEvents``; profparse streams the first: refused, exit 4, saying why."""
    first, second = _trace(1), _trace(3)
    path = tmp_path / "twice.json"
    path.write_bytes(_document(first, b', "traceEvents": ' + _events_text(second)))
    before = snapshot(tmp_path)
    run = run_cli("summarize", str(path), env=NO_CACHE)
    assert_clean_failure(run, 4, contains="traceEvents", before=before, after=snapshot(tmp_path))


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    b = _trace()
    plain, marked = tmp_path / "plain.json", tmp_path / "bom.json"
    plain.write_bytes(_document(b))
    marked.write_bytes(BOM + _document(b))
    assert len(read_trace(marked).events) == len(read_trace(plain).events) == len(b.events)
    for path in (marked, tmp_path / "bom.json.gz"):
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(marked.read_bytes()))
        assert_success(run_cli("summarize", str(path), env=NO_CACHE))


def test_one_lone_surrogate_costs_nothing_but_is_counted(tmp_path: Path) -> None:
    """A lone ``\\ud800`` escape in one name (valid JSON, not valid UTF-16) is read as U+FFFD and counted; the
    file, and every other event, is kept (a small file: skipping the event alone was more than 1% of it)."""
    b = _trace(1)
    b.op("bad\\ud800name", 5.0, 1.0)
    b.op("low\\udc00 then pair \\ud83d\\ude00", 6.0, 1.0)
    path = tmp_path / "surrogate.json"
    path.write_bytes(_document(b).replace(b"\\\\u", b"\\u"))  # json.dumps escaped the backslash
    json.loads(path.read_bytes())  # valid JSON
    raw = read_trace(path)
    names = set(raw.events["name"].astype(str))
    assert "bad\ufffdname" in names and "low\ufffd then pair \U0001f600" in names
    assert len(raw.events) == len(b.events)
    assert raw.report.lone_surrogates == 2
    assert not raw.report.dropped and not raw.report.skipped_bytes
    result = run_cli("summarize", str(path), "--format", "json", env=NO_CACHE)
    assert_success(result)
    checks = {row["check"]: row for row in json.loads(result.stdout)["warnings"]}
    assert checks["lone_surrogates"]["count"] == 2, checks.get("lone_surrogates")


# -- item 4: annotate splices at the end of traceEvents --------------------------------------------------------


def _annotate(tmp_path: Path, name: str, data: bytes) -> tuple[dict, bytes]:
    """Write ``data``, annotate it (exit 0), return the output document and the input's bytes."""
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / (name + ".annotated.json")
    run = run_cli("annotate", str(src), "-o", str(out), env=NO_CACHE)
    assert_success(run, folders=(tmp_path,))
    assert src.read_bytes() == data
    return json.loads(out.read_bytes()), data


def _check_annotated(doc: dict, b: TraceBuilder, header: dict) -> None:
    """Every input event first, unchanged, then the stage events; every header key kept."""
    events = doc["traceEvents"]
    assert events[: len(b.events)] == json.loads(json.dumps(b.events))
    added = events[len(b.events) :]
    assert added and all(e.get("pid") == added[0]["pid"] for e in added)
    assert any(e.get("cat") == "profparse_stage" for e in added)
    for key, value in header.items():
        assert doc[key] == value, key


HEADER = {"schemaVersion": 1, "traceName": "t", "extra": [[{"a": 1}], [2, [3]]], "deviceProperties": [{"id": 0}]}


@pytest.mark.parametrize(
    "case",
    ["nested_arrays_after", "trailing_nul", "trailing_junk", "second_document", "bom", "samples_after"],
)
def test_annotate_output_is_valid_json_with_every_header_key(tmp_path: Path, case: str) -> None:
    b = _trace()
    after = b', "traceName": "t", "extra": [[{"a": 1}], [2, [3]]], "deviceProperties": [{"id": 0}]'
    header = dict(HEADER)
    data = _document(b, after)
    if case == "trailing_nul":
        data += b"\n" + b"\0" * 4096
    elif case == "trailing_junk":
        data += b"\n]] } garbage ]"
    elif case == "second_document":
        data += b"\n" + _document(_trace(1), b', "traceName": "second"')
    elif case == "bom":
        data = BOM + data
    elif case == "samples_after":
        data = _document(b, _samples(20_000) + after)
        header["samples"] = json.loads(b"{" + _samples(20_000)[1:] + b"}")["samples"]
    doc, _ = _annotate(tmp_path, f"{case}.json", data)
    _check_annotated(doc, b, header)


def test_annotate_trace_whose_last_key_is_a_long_string(tmp_path: Path) -> None:
    """A trailer of 40 MB (annotate held back 16-32 MB) is copied, not refused."""
    b = _trace()
    long = "x" * (40 << 20)
    doc, _ = _annotate(tmp_path, "long.json", _document(b, b', "note": "' + long.encode() + b'"'))
    _check_annotated(doc, b, {"schemaVersion": 1, "note": long})


def test_annotate_gzip_with_trailer_arrays(tmp_path: Path) -> None:
    b = _trace()
    data = gzip.compress(_document(b, b', "extra": [[{"a": 1}], [2, [3]]]') + b"\0\0\0")
    src = tmp_path / "t.json.gz"
    src.write_bytes(data)
    out = tmp_path / "out.json.gz"
    assert_success(run_cli("annotate", str(src), "-o", str(out), env=NO_CACHE), folders=(tmp_path,))
    _check_annotated(json.loads(gzip.decompress(out.read_bytes())), b, {"extra": [[{"a": 1}], [2, [3]]]})


# -- item 11: many tiny events, and the exit-8 message ---------------------------------------------------------


def _peak_rss_mb(path: Path) -> float:
    """Peak resident memory (VmHWM: this process only; ru_maxrss keeps the forking parent's) of reading ``path``."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from profparse.trace.events import read_trace\n"
        "read_trace(sys.argv[1], workers=1)\n"
        "hwm = [x for x in Path('/proc/self/status').read_text().splitlines() if x.startswith('VmHWM:')]\n"
        "print(int(hwm[0].split()[1]) / 1024)\n"
    )
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.split()[-1])


def test_tiny_events_take_memory_by_bytes_not_by_count(tmp_path: Path) -> None:
    """Events dropped while reading (``{}``: no ts) cost no memory once their chunk is done: tripling a file of
    them (2 -> 6 MB, 0.7 -> 2 million events) adds less than the early estimate's 1.5x per JSON byte. Before, each
    dropped event held ~60 bytes to the end (+125 MB here; 18 MB of them took 868 MB against an estimate of 155)."""
    b = _trace(1)
    peaks = []
    for count in (50_000, 700_000, 2_000_000):
        tiny = tmp_path / f"tiny{count}.json"
        tiny.write_bytes(b'{"traceEvents": [' + _events_text(b)[1:-1] + b"," + b",".join([b"{}"] * count) + b"]}")
        if count == 50_000:
            raw = read_trace(tiny, workers=1, chunk_bytes=16 << 10)
            assert len(raw.events) == len(b.events)
            assert raw.events["trace_index"].tolist() == list(range(len(b.events)))
            assert raw.report.dropped == {"event without ts": count}
        else:
            peaks.append(_peak_rss_mb(tiny))
    assert peaks[1] - peaks[0] < 1.5 * 4, f"{peaks}: MB for 2 and 6 MB of dropped events"


def test_tiny_events_are_decoded_a_bounded_number_at_a_time(tmp_path: Path) -> None:
    """1 MiB of tiny events is 50,000-350,000 of them, decoded at once before: the chunks handed out (and the
    bodies sent to workers) hold at most MAX_CHUNK_EVENTS events, and the events read are those written, a
    ``},{`` inside a name (where a chunk cannot be cut) included."""
    tiny = [{"ph": "i", "ts": i, "name": "},{" if i % 7 == 0 else "a"} if i % 3 else {} for i in range(150_000)]
    path = tmp_path / "tiny.json"
    path.write_bytes(json.dumps({"traceEvents": tiny}, separators=(",", ":")).encode())
    decoder = TraceDecoder(path)
    sizes = [len(events) for events, _ in decoder.chunks_with_text()]
    assert max(sizes) <= MAX_CHUNK_EVENTS and sum(sizes) == len(tiny), sizes
    raw = read_trace(path, workers=1)
    written = [e for e in tiny if e]
    assert raw.events["name"].astype(str).tolist() == [e["name"] for e in written]
    assert raw.events["ts_ns"].tolist() == [e["ts"] * 1000 for e in written]
    assert raw.report.dropped == {"event without ts": len(tiny) - len(written)}

    plain = tmp_path / "plain.json"  # no '},{' in a string: every body decodes where it was cut
    plain.write_bytes(json.dumps({"traceEvents": [e if e else {"ph": "i"} for e in written]}).encode())
    decoder = TraceDecoder(plain)
    sizes = [
        len(decoder.decode_body(bytes(item))[0]) if isinstance(item, memoryview) else len(item[0])
        for item in decoder.bodies()
        if item is not None
    ]
    assert max(sizes) <= MAX_CHUNK_EVENTS and sum(sizes) == len(written), sizes
    assert len(read_trace(plain, workers=2).events) == len(written)


def test_tiny_events_peak_memory_within_the_estimate(tmp_path: Path) -> None:
    """Reading 6 MB of ``{}`` (2.1 million events) peaks within the documented estimate, 1.5x the JSON + 160 MiB:
    before, the ~350,000 events of each 1 MiB chunk were decoded at once, ~230 MB above it (350 MB in all)."""
    path = tmp_path / "empty_objects.json"
    path.write_bytes(b'{"traceEvents": [' + b",".join([b"{}"] * 2_100_000) + b"]}")
    estimate_mb = (NEED_PER_JSON_BYTE * path.stat().st_size + NEED_FIXED) / (1 << 20)
    peak = _peak_rss_mb(path)
    assert peak < estimate_mb, f"{peak:.0f} MB peak, estimate {estimate_mb:.0f} MB"


def test_dropped_events_keep_trace_index(tmp_path: Path) -> None:
    """Events without ts dropped while reading leave the others' ``trace_index`` (position in the array) as it was."""
    events = [{"ph": "X", "name": f"e{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(10)]
    for i in (0, 3, 4, 9):
        del events[i]["ts"]
    path = tmp_path / "gaps.json"
    path.write_text(json.dumps({"traceEvents": events}))
    raw = read_trace(path, chunk_bytes=64)
    assert raw.events["trace_index"].tolist() == [1, 2, 5, 6, 7, 8]
    assert raw.events["name"].astype(str).tolist() == ["e1", "e2", "e5", "e6", "e7", "e8"]


def test_out_of_memory_while_reading_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(1).write(tmp_path / "t.json")

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(EventTableBuilder, "append", no_memory)
    with pytest.raises(OutOfMemoryError, match=str(path)):
        read_trace(path, workers=1)
