"""The ``steady`` column of the ``steps`` table: warm-up runs up to the first step that steps the optimizer (when a
step is left after it), else it is the first of three or more steps; the findings count the steady steps only."""

from __future__ import annotations

import pandas as pd
import pytest
from tracebuilder import TraceBuilder

import profparse

STEP_US = 1000.0


def trace(tmp_path, steps: int, optimizer_in: set[int], profiler_steps: bool = True, cut_us: float | None = None):
    """``steps`` steps of a forward op and a backward op; an optimizer step in the steps of ``optimizer_in``;
    with ``cut_us``, one more ``ProfilerStep`` that long after them, holding one op (the profiler stopped in it)."""
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
    if cut_us is not None:
        t0 = steps * STEP_US
        b.annotation(f"ProfilerStep#{steps}", t0, cut_us)
        b.op("aten::empty", t0 + cut_us / 4, cut_us / 2)
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


@pytest.mark.parametrize(
    "steps, optimizer_in, cut_us, steady",
    [
        (3, {0, 1, 2}, 50.0, [False, True, True, False]),
        (1, {0}, 50.0, [True, False]),  # the one complete step is the steady one (as in a trace of one step)
        (2, {0, 1}, 200.0, [False, True, False]),  # 200 us < a quarter of the 990 us steps
        (3, set(), 50.0, [False, True, True, False]),  # no optimizer step: the first of three complete ones
        (2, set(), 50.0, [True, True, False]),  # two complete steps: too few to leave one out
    ],
)
def test_a_last_step_the_profiler_stopped_inside_is_not_steady(tmp_path, steps, optimizer_in, cut_us, steady):
    parsed = trace(tmp_path, steps, optimizer_in, cut_us=cut_us)
    assert parsed.steps["steady"].tolist() == steady
    checks = parsed.warnings.set_index("check")
    assert checks.loc["cut_short_step", "severity"] == "info"
    message = checks.loc["cut_short_step", "message"]
    assert f"step {steps} left out of the steady steps: {cut_us / 1000:.2f} ms" in message


@pytest.mark.parametrize(
    "optimizer_in, cut_us",
    [
        ({0, 1, 2, 3}, 50.0),  # the short last step runs an optimizer step: a step of its own, however short
        ({0, 1, 2}, 300.0),  # over a quarter of the steps before it
    ],
)
def test_a_short_last_step_that_is_a_step_stays_steady(tmp_path, optimizer_in, cut_us):
    b = TraceBuilder()
    for step in range(4):
        t0, length = step * STEP_US, (cut_us if step == 3 else STEP_US - 10)
        b.annotation(f"ProfilerStep#{step}", t0, length)
        b.op("aten::linear", t0 + 1, length / 4)
        if step in optimizer_in:
            b.annotation("Optimizer.step#SGD.step", t0 + length / 2, length / 4)
    parsed = profparse.load(b.write(tmp_path / "t.json"), cache=False)
    assert parsed.steps["steady"].tolist() == [False, True, True, True]
    assert "cut_short_step" not in set(parsed.warnings["check"])


def test_the_mi250_trace_s_empty_last_step_leaves_its_one_step_steady(tmp_path):
    """The MI250 trace ends in ``ProfilerStep#2`` of 0.05 ms (nothing but the profiler's end): its headline was
    "0.0 ms per step" from that step. Its one complete step is the steady one now, in every view."""
    import json

    from conftest import SHARED_TRACES

    from profparse.outputs.summary import render_summary

    path = SHARED_TRACES / "mi250_minitoy.json.gz"
    if not path.exists():
        pytest.skip("no mi250_minitoy.json.gz")
    parsed = profparse.parse(path)
    steps = parsed.steps
    assert steps["steady"].tolist() == [True, False]
    window = int(steps["end_ns"].iloc[0] - steps["start_ns"].iloc[0])
    data = json.loads(render_summary(parsed, fmt="json"))
    replayed = data["without_profiler"]["profiled_step_ns"]
    assert 0.9 * window < replayed < 1.1 * window  # the replayed complete step, not the 0.05 ms one
    assert [s["step"] for s in data["step_totals"] if s.get("steady")] == [int(steps["step"].iloc[0])]


@pytest.mark.parametrize(
    "steps, optimizer_in, cut_us, warned",
    [
        (1, {0}, None, True),  # one training step: it ran the optimizer's first step
        (1, {0}, 50.0, True),  # and a last step the profiler stopped inside: still the one complete step
        (3, {2}, None, True),  # only the last step steps the optimizer: steps 1-2 are steady, none after it
        (2, {0, 1}, None, False),  # a step after the first optimizer step: that one is steady
        (4, {1, 2, 3}, None, False),
        (1, set(), None, False),  # no optimizer step: nothing says warm-up
        (3, set(), None, False),
    ],
)
def test_steady_steps_with_no_step_after_the_first_optimizer_step_are_flagged(
    tmp_path, steps, optimizer_in, cut_us, warned
):
    """Where no complete step follows the trace's first optimizer step, the steady steps are the only ones there
    are, and may be warm-up: a warning says so, naming them."""
    parsed = trace(tmp_path, steps, optimizer_in, cut_us=cut_us)
    checks = parsed.warnings.set_index("check")
    assert ("warm_up_only" in checks.index) == warned
    if warned:
        steady = parsed.steps.loc[parsed.steps["steady"], "step"].tolist()
        message = checks.loc["warm_up_only", "message"]
        assert checks.loc["warm_up_only", "severity"] == "warning"
        assert f"({', '.join(str(s) for s in steady)}) may be warm-up" in message


def test_findings_measured_in_warm_up_alone_have_low_confidence(tmp_path):
    """One training step with 5 ms of untraced time: between_steps fires, at low confidence, saying why; the same
    step followed by two more keeps its kind's confidence."""
    from test_advice import _gap_steps

    def between(gaps: list[float]) -> pd.Series:
        found = profparse.load(_gap_steps(tmp_path, gaps), cache=False).findings.set_index("kind")
        assert "between_steps" in found.index
        return found.loc["between_steps"]

    alone = between([5_000])
    assert alone["confidence"] == "low" and "warm-up only" in alone["evidence"]
    assert between([5_000] * 3)["confidence"] != "low"


def test_the_mi250_trace_s_one_step_is_flagged_as_maybe_warm_up():
    """The MI250 trace's one complete step is its first optimizer step; its launch_bound backward (84% of the
    step) comes from one 6.5 ms first launch: every finding is low confidence and the warning says why."""
    from conftest import REPO_GPU_TRACES

    parsed = profparse.parse(REPO_GPU_TRACES / "mi250_minitoy.json.gz")
    assert "warm_up_only" in set(parsed.warnings["check"])
    assert len(parsed.findings) and set(parsed.findings["confidence"]) == {"low"}


def test_the_findings_say_where_they_were_measured_in_warm_up(tmp_path, capsys):
    """summarize (text and markdown) and advise say under the findings' heading that they were measured in steps
    that may be warm-up; a trace with steps after its first optimizer step says nothing of it."""
    from test_advice import _gap_steps

    from profparse.cli.main import main
    from profparse.outputs.summary.findings import WARM_UP_NOTE

    outputs = {}
    for gaps in ([5_000], [5_000] * 3):
        trace, texts = _gap_steps(tmp_path, gaps), []
        for args in (["summarize"], ["summarize", "--format", "markdown"], ["advise"]):
            assert main([*args, str(trace), "--no-cache", "-q"]) == 0
            texts.append(capsys.readouterr().out)
        outputs[len(gaps)] = texts
    summary, markdown, advise = outputs[1]
    assert f"  ({WARM_UP_NOTE})\n  1. between_steps" in summary
    assert "## Findings\n\nMeasured in steps that may be warm-up" in markdown
    assert f"per step\n  ({WARM_UP_NOTE})\n" in advise
    assert not any("may be warm-up" in text for text in outputs[3])
