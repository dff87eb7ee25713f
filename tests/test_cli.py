"""The command line as a user runs it: outputs, exit codes, one-line errors, nothing lost."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, training_step

from profparse.cli.main import main

REPO = Path(__file__).parents[1]


@pytest.fixture
def trace(tmp_path) -> Path:
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    return b.write(tmp_path / "trace.json.gz")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_prints_every_stage(capsys, trace):
    code, out, err = run(capsys, "summarize", str(trace))
    assert code == 0
    for stage in ("load", "forward", "backward", "optimizer", "other"):
        assert stage in out
    assert "Top kernels" in out


def test_parse_writes_tables_and_refuses_to_overwrite(capsys, trace, tmp_path):
    out_dir = tmp_path / "tables"
    code, _, _ = run(capsys, "parse", str(trace), "-o", str(out_dir), "--quiet")
    assert code == 0
    names = {p.name for p in out_dir.iterdir()}
    assert {"events.parquet", "kernels.parquet", "ops.parquet", "stage_summary.parquet"} <= names
    before = {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()}
    code, _, err = run(capsys, "parse", str(trace), "-o", str(out_dir))
    assert code == 6 and err.count("\n") == 1 and "--force" in err
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()} == before
    code, _, _ = run(capsys, "parse", str(trace), "-o", str(out_dir), "--force", "--quiet")
    assert code == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tables")]  # no temporary leftovers


@pytest.mark.parametrize(
    ("content", "code"),
    [(None, 3), (b"", 4), (b"{not json", 4), (b'{"x": 1}', 4), (b"\x1f\x8b\x08garbage", 4), (b"\xff\xfe\x00", 4)],
)
def test_bad_inputs_give_one_line_and_exit_code(capsys, tmp_path, content, code):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    got, out, err = run(capsys, "summarize", str(path))
    assert got == code
    assert err.startswith("profparse: error: ") and err.count("\n") == 1
    assert "Traceback" not in err and out == ""


def test_missing_file_in_existing_folder(capsys, tmp_path):
    (tmp_path / "sub").mkdir()
    code, out, err = run(capsys, "summarize", str(tmp_path / "sub" / "missing.json"))
    assert (code, out) == (3, "")
    assert err.startswith("profparse: error: ") and err.count("\n") == 1 and "no such file" in err


@pytest.mark.parametrize("verb", ["plot", "annotate"])
def test_directory_as_trace(capsys, tmp_path, verb):
    """A folder where a trace file is expected (these verbs take one trace, not a folder of ranks)."""
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a trace")
    code, out, err = run(capsys, verb, str(folder), "-o", str(tmp_path / "out"))
    assert (code, out) == (3, "")
    assert err.startswith("profparse: error: ") and err.count("\n") == 1 and "is a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]  # no output, no lock, no temporary


def test_folder_without_traces(capsys, tmp_path):
    (tmp_path / "sub").mkdir()
    code, out, err = run(capsys, "summarize", str(tmp_path / "sub"))
    assert (code, out) == (3, "")
    assert err.count("\n") == 1 and "no trace files" in err


def test_truncated_trace_warns_or_fails_with_strict(capsys, tmp_path, trace):
    text = gzip.decompress(trace.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) * 2 // 3])
    code, out, err = run(capsys, "summarize", str(cut))
    assert code == 0 and "truncated" in err and "forward" in out
    code, out, err = run(capsys, "summarize", str(cut), "--strict")
    assert code == 5 and err.count("\n") == 1


def test_input_is_never_modified(capsys, trace, tmp_path):
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    code, _, err = run(capsys, "parse", str(trace), "-o", str(tmp_path / "o"), "--quiet")
    assert (code, err) == (0, "")
    code, out, _ = run(capsys, "summarize", str(trace), "--format", "json")
    assert code == 0 and json.loads(out)["steps"]["count"] == 3
    code, _, _ = run(capsys, "annotate", str(trace), "-o", str(tmp_path / "a.json.gz"), "--quiet")
    assert code == 0
    for force in ([], ["--force"]):  # the input as the output, or its folder: refused, exit 9
        code, _, err = run(capsys, "annotate", str(trace), "-o", str(trace), "--quiet", *force)
        assert code == 9 and "is the input" in err
        code, _, err = run(capsys, "parse", str(trace), "-o", str(trace.parent), "--quiet", *force)
        assert code == 9 and "holds the input" in err
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_formats(capsys, trace, fmt):
    code, out, _ = run(capsys, "summarize", str(trace), "--format", fmt)
    assert code == 0
    if fmt == "json":
        assert json.loads(out)["steps"]["count"] == 3
    elif fmt == "csv":
        assert out.splitlines()[0].startswith("step,stage,")
    else:
        assert out.startswith("# profparse summary")


def test_console_script_and_pandas_example(tmp_path, trace):
    out_dir = tmp_path / "t"
    subprocess.run(
        [sys.executable, "-m", "profparse.cli.main", "parse", str(trace), "-o", str(out_dir), "-q"], check=True
    )
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pandas_example.py"), str(out_dir)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert "Share of host op time" in result.stdout
    assert "optimizer" in result.stdout
