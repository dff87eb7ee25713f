"""A folder given as the input (cli/rank_folder.py): a capture's run folder is its one trace; any other folder
stays a folder of ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, training_step

from profparse.cli.main import main


def _run_folder(folder: Path, manifest: dict | None = None, extra_trace: bool = False) -> Path:
    """A hand-built trace written as ``profparse capture`` lays out a run: trace.json.gz + manifest.json."""
    folder.mkdir()
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    b.write(folder / "trace.json.gz")
    if extra_trace:
        b.write(folder / "trace2.json.gz")
    if manifest is None:
        manifest = {"format": 1, "kind": "profparse.capture", "trace": {"file": "trace.json.gz"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_on_a_capture_run_folder_is_its_trace(capsys, tmp_path):
    folder = _run_folder(tmp_path / "run")
    code, folder_out, _ = _cli(capsys, "summarize", str(folder), "--format", "json")
    assert code == 0
    code, trace_out, _ = _cli(capsys, "summarize", str(folder / "trace.json.gz"), "--format", "json")
    assert code == 0
    assert folder_out == trace_out
    data = json.loads(folder_out)
    assert data["trace"] == str(folder / "trace.json.gz") and "stragglers" not in data
    code, text, _ = _cli(capsys, "summarize", str(folder))
    assert code == 0 and "straggler" not in text.lower() and "forward" in text


@pytest.mark.parametrize(
    ("manifest", "extra_trace"),
    [({"kind": "something else", "trace": {"file": "trace.json.gz"}}, False), (None, True)],
    ids=["foreign-manifest", "two-traces"],
)
def test_other_folders_stay_folders_of_ranks(capsys, tmp_path, manifest, extra_trace):
    folder = _run_folder(tmp_path / "run", manifest, extra_trace)
    code, folder_out, _ = _cli(capsys, "summarize", str(folder), "--format", "json")
    _, trace_out, _ = _cli(capsys, "summarize", str(folder / "trace.json.gz"), "--format", "json")
    assert code == 0 and folder_out != trace_out
    assert "stragglers" in json.loads(folder_out)  # the folder-of-ranks table


def test_parse_on_a_capture_run_folder_writes_one_trace_tables(capsys, tmp_path):
    folder = _run_folder(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, _, _ = _cli(capsys, "parse", str(folder), "-o", str(tmp_path / "tables"), "--quiet")
    assert code == 0
    assert (tmp_path / "tables" / "events.parquet").is_file()
    assert not list((tmp_path / "tables").glob("*/rank=*"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_note_every_rank_gives_is_printed_once_with_its_ranks(capsys, tmp_path):
    """Three single-step ranks all warn that their one step may be warm-up: one line names ranks 0-2 (a 64-rank job
    printed the same warning 64 times); a message only some ranks give names those."""
    from types import SimpleNamespace

    from test_ranks_late import ranks_folder

    from profparse.cli.rank_folder import rank_notes

    folder = ranks_folder(tmp_path, 3, 1, [100.0])
    assert main(["summarize", str(folder), "--no-cache", "-j", "1"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "may be warm-up" in line]
    assert len(lines) == 1 and lines[0].startswith("profparse: ranks 0-2: warning: no complete step"), lines
    results = [SimpleNamespace(rank=r, notes=notes) for r, notes in ((2, ["a", "b"]), (0, ["a"]), (1, ["a"]))]
    assert rank_notes(results) == [("a", "ranks 0-2"), ("b", "rank 2")]
