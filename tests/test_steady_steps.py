"""The ``steady`` column of the ``steps`` table: warm-up runs up to the first step that steps the optimizer (when a
step is left after it), else it is the first of three or more steps; the findings count the steady steps only."""

from __future__ import annotations

import pandas as pd
import pytest
from tracebuilder import TraceBuilder

import profparse

STEP_US = 1000.0


def trace(tmp_path, steps: int, optimizer_in: set[int], profiler_steps: bool = True):
    """``steps`` steps of a forward op and a backward op; an optimizer step in the steps of ``optimizer_in``."""
    b = TraceBuilder()
    for step in range(steps):
        t0 = step * STEP_US
        if profiler_steps:
            b.annotation(f"ProfilerStep#{step}", t0, STEP_US - 10)
        b.op("aten::linear", t0 + 10, 100)
        b.op("aten::mm", t0 + 200, 100)
        if step in optimizer_in:
            b.annotation("Optimizer.step#SGD.step", t0 + 800, 50)
            b.op("aten::add_", t0 + 801, 20)
    return profparse.load(b.write(tmp_path / "t.json"), cache=False)


@pytest.mark.parametrize(
    "steps, optimizer_in, steady",
    [
        (4, {0, 1, 2, 3}, [False, True, True, True]),  # the optimizer's first step makes its state
        (4, {1, 3}, [False, False, True, True]),  # gradient accumulation: warm-up to the first optimizer step
        (3, {2}, [False, True, True]),  # only the last steps the optimizer: no step after it, the first of three
        (3, set(), [False, True, True]),
        (2, set(), [True, True]),  # too few steps to leave one out
        (2, {0, 1}, [False, True]),
        (1, {0}, [True]),
    ],
)
def test_warm_up_runs_to_the_first_optimizer_step(tmp_path, steps, optimizer_in, steady):
    parsed = trace(tmp_path, steps, optimizer_in)
    assert parsed.steps["step"].tolist() == list(range(steps))
    assert parsed.steps["steady"].tolist() == steady


def test_windows_between_optimizer_steps_leave_the_first_out(tmp_path):
    parsed = trace(tmp_path, 3, {0, 1, 2}, profiler_steps=False)
    assert parsed.steps["source"].unique().tolist() == ["optimizer_boundaries"]
    assert parsed.steps["steady"].tolist() == [False, True, True]


def test_the_steps_table_is_written_with_steady(tmp_path, capsys):
    from profparse.cli.main import main

    parsed = trace(tmp_path, 4, {1, 2, 3})
    assert main(["parse", str(tmp_path / "t.json"), "-o", str(tmp_path / "out"), "-q", "--no-cache"]) == 0
    written = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert written["steady"].tolist() == parsed.steps["steady"].tolist() == [False, False, True, True]


def test_the_findings_leave_the_warm_up_steps_out(tmp_path):
    """What every detector reads holds the steady steps only, and their critical path."""
    from profparse.analysis.advice.context import AdviceContext

    parsed = trace(tmp_path, 4, {1, 2, 3})
    context = AdviceContext.of(parsed)
    assert context.warm_up == [0, 1]
    assert context.steps["step"].tolist() == [2, 3]
    assert set(context.path["step"]) == {2, 3}
