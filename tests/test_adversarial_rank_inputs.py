"""Rank folders and datasets that exited 70: a rank file whose header before ``traceEvents`` nests 2,000 deep
(the header read that finds ``distributedInfo.rank`` hit Python's recursion limit) and a dataset partition named
``rank=abc``. Each runs the CLI in a fresh process (tests/adversarial.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from adversarial import assert_clean_failure, assert_success, run_cli
from tracebuilder import TraceBuilder, training_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc (Linux)")

DEPTH = 2000


def rank_folder(folder: Path, deep: bool = True) -> Path:
    """Two rank files of three training steps; with ``deep``, rank1's header nests ``DEPTH`` deep inside
    ``distributedInfo``."""
    folder.mkdir()
    for rank in (0, 1):
        b = TraceBuilder()
        t = 1000.0
        for step in (1, 2, 3):
            t = training_step(b, step, t) + 10
        document = b.document()
        events = json.dumps(document.pop("traceEvents"))
        nested = "[" * DEPTH + "]" * DEPTH if rank == 1 and deep else "0"
        head = json.dumps(document)[1:-1]
        text = f'{{"distributedInfo": {{"deep": {nested}, "rank": {rank}}}, {head}, "traceEvents": {events}}}'
        (folder / f"rank{rank}.json").write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("verb", ["summarize", "parse", "report"])
def test_a_header_nested_2000_deep_is_not_an_internal_error(tmp_path: Path, verb: str) -> None:
    folder = rank_folder(tmp_path / "ranks")
    out = {"parse": ["-o", str(tmp_path / "out")], "report": ["-o", str(tmp_path / "r.html")]}.get(verb, [])
    run = run_cli(verb, str(folder), *out, "--no-cache")
    assert run.code != 70 and "internal error" not in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    if run.code == 0:
        assert_success(run, folders=(tmp_path,))
    else:
        assert_clean_failure(run, run.code, folders=(tmp_path,))
        assert run.code in (4, 7), run.stderr  # the deep file is not a readable trace, or that rank failed


@pytest.mark.parametrize("name", ["rank=abc", "rank=-1", "rank=1.5"])
def test_a_dataset_partition_not_named_by_a_rank_number_is_exit_4(tmp_path: Path, name: str) -> None:
    folder = rank_folder(tmp_path / "ranks", deep=False)
    out = tmp_path / "out"
    assert_success(run_cli("parse", str(folder), "-o", str(out), "-q", "--no-cache"))
    (out / "stage_summary" / "rank=1").rename(out / "stage_summary" / name)
    for argv in (["summarize", str(out)], ["report", str(out), "-o", str(tmp_path / "r.html")]):
        run = run_cli(*argv, "-q")
        assert_clean_failure(run, 4, contains=f"{name} is not a rank number")
