"""Rank folders and datasets that exited 70: a rank file whose header before ``traceEvents`` nests 2,000 deep
(the header read that finds ``distributedInfo.rank`` hit Python's recursion limit) and a dataset partition named
``rank=abc``. Each runs the CLI in a fresh process (tests/adversarial.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from adversarial import REPO, assert_clean_failure, assert_success, run_cli
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


SCRIPT = """
import profparse.ranks
{call}
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["no_main_guard", "main_guard"])
def test_parse_ranks_with_jobs_in_a_script_without_a_main_guard_is_an_error_not_a_hang(tmp_path, guarded) -> None:
    """The pool's workers import the script again; unguarded, that call waited forever for the parent's lock."""
    folder = rank_folder(tmp_path / "ranks", deep=False)
    call = 'profparse.ranks.parse_ranks("ranks", "out", jobs=2)'
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(call=f"if __name__ == '__main__':\n    {call}" if guarded else call))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PROFPARSE_FORCE_JOBS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    if guarded:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "out" / "ranks").is_dir()
    else:
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("profparse.base.errors.UsageError: ") and "if __name__ == '__main__':" in last
        assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ranks", "script.py"] + (["out"] if guarded else []))
    assert folder.is_dir()
