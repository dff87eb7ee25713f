"""Adversarial steps and ranks: repeated or huge step numbers, rank folders with odd entries and headers, the
worker pool's temporaries and its size, and a dataset that keeps what its ranks ran on.

Each case runs the CLI in a fresh process (tests/adversarial.py) and asserts the exit code, the message, and that
nothing is left behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from adversarial import assert_success, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc, FIFOs and /dev (Linux)")


def steps_trace(path: Path, numbers: list[int | str], *, duplicate_first: bool = False) -> Path:
    """One training step per entry of ``numbers`` (``ProfilerStep#<n>``), 10 us apart; optionally the first
    ProfilerStep event twice (same ts and dur, as a writer that flushed it twice)."""
    b = TraceBuilder()
    t = 1000.0
    for number in numbers:
        t = training_step(b, number, t) + 10  # type: ignore[arg-type]
    if duplicate_first:
        first = next(e for e in b.events if str(e.get("name", "")).startswith("ProfilerStep#"))
        b.events.append(dict(first))
    return b.write(path)


# -- item 6: repeated and huge step numbers -----------------------------------------------------------------------


STEP_CASES = {
    "restarted": ([1, 2, 3, 1, 2, 3], [1, 2, 3, 4, 5, 6], "renumbered"),
    "beyond_int64": ([1, 2, 10**25], [1, 2, 3], "too large"),
    "five_thousand_digits": ([1, "9" * 5000, 2], [1, 3, 2], "too large"),
    "duplicated_event": ([1, 2, 3], [1, 2, 3], "duplicated ProfilerStep event ignored"),
}


def summary_json(run) -> dict:
    assert_success(run)
    return json.loads(run.stdout)


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_repeated_step_numbers_are_kept_apart(tmp_path, case):
    """A restarted ``ProfilerStep#N`` counter, a duplicated step event or a number beyond int64 exited 70 in
    summarize, parse and report ("cannot reindex on an axis with duplicate labels", OverflowError): now every
    step window gets its own number, a warning says which were renumbered, and every step adds up as before."""
    numbers, expected, said = STEP_CASES[case]
    trace = steps_trace(tmp_path / "t.json", numbers, duplicate_first=case == "duplicated_event")
    plain = steps_trace(tmp_path / "plain.json", [1])
    before = snapshot(trace)
    data = summary_json(run_cli("summarize", str(trace), "--format", "json", "--no-cache"))
    assert said in json.dumps(data["warnings"]), data["warnings"]
    assert data["steps"]["numbers"] == expected
    one = summary_json(run_cli("summarize", str(plain), "--format", "json", "--no-cache", "-q"))["step_totals"][0]
    # every step is the same step of training_step: its figures are those of a trace with one step
    assert [{**s, "step": 0} for s in data["step_totals"]] == [{**one, "step": 0}] * len(expected)
    for total in data["step_totals"]:  # the stages of each step add up to its totals
        rows = [r for r in data["per_step"] if r["step"] == total["step"]]
        assert sum(r["host_wall_ns"] for r in rows) == total["host_wall_ns"] > 0
        assert sum(r["gpu_busy_ns"] for r in rows) == total["gpu_busy_ns"] > 0
    parse = run_cli("parse", str(trace), "-o", str(tmp_path / "out"), "--no-cache")
    assert_success(parse, folders=(tmp_path,))
    assert said in parse.stderr
    steps = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert steps["step"].tolist() == expected
    warnings = pd.read_parquet(tmp_path / "out" / "warnings.parquet")
    assert "repeated_steps" in set(warnings["check"])
    report = run_cli("report", str(trace), "-o", str(tmp_path / "r.html"), "--no-cache")
    assert_success(report, folders=(tmp_path,))
    assert (tmp_path / "r.html").stat().st_size > 0
    assert snapshot(trace) == before
