"""Text ``args`` (op shapes, dtypes, collective args) reach the event table exactly as the file holds them."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from tracebuilder import TraceBuilder, training_step

from profparse.trace.events import read_trace
from profparse.trace.kinds import NULL, TEXT_ARG_COLUMNS
from profparse.trace.schema import Args

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"
KEYS = {encoded: name for name, encoded in zip(Args.__struct_fields__, Args.__struct_encode_fields__, strict=True)}
TEXT_KEYS = {key: name for key, name in KEYS.items() if name in TEXT_ARG_COLUMNS}
INT_KEYS = {
    "In msg nelems": "comm_in_nelems",
    "Out msg nelems": "comm_out_nelems",
    "Group size": "comm_group_size",
    "Seq": "comm_seq",
}


def expected_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def check_against_file(raw, doc_events: list[dict]) -> int:
    """Every text/int args column equals the file's value, row by row; returns how many values were compared."""
    events = raw.events
    index = events["trace_index"].to_numpy()
    compared = 0
    for column in TEXT_ARG_COLUMNS:
        assert isinstance(events[column].dtype, pd.CategoricalDtype)
    # each column as a Python list once: a pandas scalar lookup per value took a minute on the sample capture
    values = {column: events[column].to_numpy().tolist() for column in (*TEXT_KEYS.values(), *INT_KEYS.values())}
    for row, i in enumerate(index.tolist()):
        args = doc_events[i].get("args") or {}
        for key, column in TEXT_KEYS.items():
            got = values[column][row]
            if key in args:
                assert json.loads(got) == args[key] if not isinstance(args[key], str) else got == args[key]
                compared += 1
            else:
                assert pd.isna(got), (i, column, got)
        for key, column in INT_KEYS.items():
            got = int(values[column][row])
            assert got == (args[key] if key in args else NULL)
    return compared


def document() -> dict:
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    doc = b.document()
    extra = [
        {
            "Input Dims": [[64], [128, 64], [64, 64], [], []],
            "Input type": ["float", "float", "float", "Scalar", ""],
            "Concrete Inputs": ["", "", "", "1", "1"],
        },
        {
            "Collective name": "allreduce",
            "In msg nelems": 2049000,
            "Out msg nelems": 2049000,
            "Group size": 2,
            "dtype": "Float",
            "Process Group Name": "0",
            "Process Group Description": 'pg "quoted" \\ é',
            "Process Group Ranks": "[0, 1]",
            "Seq": 7,
        },
        {"Process Group Ranks": [0, 1, 2, 3], "dtype": 5, "Input Dims": [[[2, 3], [4]]]},  # odd but valid JSON
    ]
    for n, args in enumerate(extra * 4):
        doc["traceEvents"].append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"op{n}",
                "pid": 1,
                "tid": 100,
                "ts": 5000 + 10 * n,
                "dur": 5,
                "args": dict(args),
            }
        )
    return doc


@pytest.mark.parametrize("chunk_bytes", [300, 5000, 1 << 20])
def test_text_args_equal_the_file(tmp_path, chunk_bytes):
    doc = document()
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    raw = read_trace(path, workers=1, chunk_bytes=chunk_bytes)
    assert check_against_file(raw, doc["traceEvents"]) == 4 * (3 + 5 + 3)
    assert raw.events["collective"].dropna().unique().tolist() == ["allreduce"]


@pytest.mark.skipif(sys.platform != "linux", reason="the parallel reader forks (Linux only)")
def test_parallel_reader_gives_the_same_text_columns(tmp_path):
    doc = document()
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=1))
    seq = read_trace(path, workers=1, chunk_bytes=400)
    par = read_trace(path, workers=2, chunk_bytes=400)
    for column in TEXT_ARG_COLUMNS:
        assert seq.events[column].astype(object).equals(par.events[column].astype(object)), column


def test_events_with_odd_types_keep_their_text_args(tmp_path):
    """An event repaired by the loose decoder (a numeric string ts) keeps its shapes and collective args."""
    doc = document()
    for event in doc["traceEvents"]:
        if event.get("args", {}).get("Collective name"):
            event["ts"] = str(event["ts"])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    raw = read_trace(path, workers=1)
    assert check_against_file(raw, doc["traceEvents"]) == 4 * (3 + 5 + 3)


def test_capture_shapes_equal_the_file():
    doc = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    raw = read_trace(SAMPLE, workers=1)
    compared = check_against_file(raw, doc["traceEvents"])
    with_dims = sum("Input Dims" in (e.get("args") or {}) for e in doc["traceEvents"])
    assert with_dims > 1000
    assert compared == 3 * with_dims  # Input Dims, Input type and Concrete Inputs on every shaped op
