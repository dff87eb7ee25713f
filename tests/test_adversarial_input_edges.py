"""Inputs that cost far more than their answer (issue 33 item 10): a large sparse file of NUL bytes read 256 MB
(22-46 s and 621 MB on a 10 GB file) before its exit 4; it is decided at the first block."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from adversarial import assert_clean_failure, assert_success, run_cli

from profparse.base.errors import TraceFormatError
from profparse.trace.decode import CHUNK_BYTES, TraceDecoder

NUL_BYTES = 300 << 20  # sparse: no disk space; large enough that reading it all would show


def nul_file(path: Path, size: int = NUL_BYTES) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.parametrize("head", [b"", b"  \n", b"\xef\xbb\xbf"], ids=["nul", "blank_then_nul", "bom_then_nul"])
def test_a_file_of_nul_bytes_stops_at_the_first_block(tmp_path: Path, head: bytes) -> None:
    path = nul_file(tmp_path / "zeros.json")
    with open(path, "r+b") as f:
        f.write(head)
    decoder = TraceDecoder(path)
    with pytest.raises(TraceFormatError, match=r"not JSON \(starts with b'\\x00"):
        for _ in decoder.chunks():
            pass
    assert decoder.report.bytes_read <= 2 * CHUNK_BYTES  # not the 256 MB of a header search


def test_a_gzip_of_nul_bytes_stops_at_the_first_block(tmp_path: Path) -> None:
    path = tmp_path / "zeros.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(64):
            f.write(bytes(1 << 20))
    decoder = TraceDecoder(path)
    with pytest.raises(TraceFormatError, match="not JSON"):
        for _ in decoder.chunks():
            pass
    assert decoder.report.bytes_read <= 2 * CHUNK_BYTES


def test_the_cli_says_not_json_with_exit_4(tmp_path: Path) -> None:
    path = nul_file(tmp_path / "zeros.json")
    assert_clean_failure(run_cli("summarize", str(path), "--no-cache"), 4, contains="not JSON")
    assert os.stat(path).st_blocks == 0  # still sparse: nothing written to the input


def small_trace_text() -> bytes:
    from tracebuilder import TraceBuilder, training_step

    b = TraceBuilder()
    t = 1000.0
    for step in (1, 2, 3):
        t = training_step(b, step, t) + 10
    return json.dumps(b.document()).encode()


def test_trailing_junk_is_not_counted_as_json_to_hold(tmp_path: Path) -> None:
    """200 MB of junk after a complete document, under a 300 MiB budget: the size projection counted the junk
    (exit 8); it is counted, not held, so the trace is read with a trailing_data warning (exit 0)."""
    path = tmp_path / "junk.json"
    path.write_bytes(small_trace_text() + b"\nJUNK")
    with open(path, "r+b") as f:
        f.truncate(200 << 20)  # sparse NULs after it
    run = run_cli("summarize", str(path), "--no-cache", "--format", "json", env={"PROFPARSE_MEMORY_LIMIT": "300M"})
    assert_success(run)
    warnings = {w["check"]: w for w in json.loads(run.stdout)["warnings"]}
    assert warnings["trailing_data"]["severity"] == "warning"
    assert warnings["trailing_data"]["count"] == (200 << 20) - len(small_trace_text()) - 1  # the junk, blanks aside


def test_a_complete_document_over_the_budget_is_still_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    text = small_trace_text()
    path.write_bytes(text[:-1] + b" " * (8 << 20) + b"}")  # 8 MB of blanks inside the document
    run = run_cli("summarize", str(path), "--no-cache", env={"PROFPARSE_MEMORY_LIMIT": "130M"})
    assert_clean_failure(run, 8, contains="needs about")


def test_a_gzip_trace_with_repeated_events_is_read_again_for_the_duplicate_check(tmp_path: Path) -> None:
    """The duplicate-events check reads the file again with ``read()``: the gzip reader needed a size (exit 70)."""
    from tracebuilder import TraceBuilder, training_step

    b = TraceBuilder()
    t = 1000.0
    for step in (1, 2, 3):
        t = training_step(b, step, t) + 10
    b.events.append(dict(b.events[-1]))  # one event twice, as a writer that flushed it twice
    path = tmp_path / "twice.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(json.dumps(b.document()).encode())
    run = run_cli("summarize", str(path), "--no-cache", "--format", "json")
    assert_success(run)
    warnings = {w["check"]: w for w in json.loads(run.stdout)["warnings"]}
    assert warnings["duplicate_events"]["count"] == 1
