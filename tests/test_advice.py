"""The findings table itself: its vocabulary is documented kind by kind, steps round-trip through their text,
and on every sample and shared trace the findings are sane (savings within the step, sorted, known kinds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import profparse
from profparse.analysis.advice import COLUMNS, KINDS, Finding
from profparse.analysis.advice.finding import frame, parse_steps, steps_text

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"


def test_every_kind_has_a_paragraph_in_the_docs_and_no_other() -> None:
    doc = (REPO / "docs" / "advice.md").read_text()
    documented = re.findall(r"^### ([a-z0-9_]+)$", doc, flags=re.M)
    assert sorted(documented) == sorted(KINDS)


@pytest.mark.parametrize("steps", [[1], [1, 2, 3, 5], [2, 4, 6], [1, 2, 3, 4, 7, 8], [10, 11, 12, 100]])
def test_steps_round_trip(steps: list[int]) -> None:
    assert parse_steps(steps_text(steps)) == steps


def test_steps_text_is_compact() -> None:
    assert steps_text([5, 1, 2, 3]) == "1-3,5"


def test_unknown_kind_or_confidence_is_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        Finding("faster_please", "forward", [1], 1.0, 10.0, "high", "x")
    with pytest.raises(ValueError, match="confidence"):
        Finding("data_loading", "other", [1], 1.0, 10.0, "sure", "x")


def test_frame_sorts_by_saving_and_fills_the_fix() -> None:
    small = Finding("between_steps", "other", [1, 2], 1e6, 1e8, "medium", "small")
    big = Finding("data_loading", "other", [1, 2], 5e6, 1e8, "high", "big", {"top_events": []})
    table = frame([small, big])
    assert list(table.columns) == list(COLUMNS)
    assert table["kind"].tolist() == ["data_loading", "between_steps"]
    assert table["saving_share"].tolist() == [0.05, 0.01]
    assert table["fix"].tolist() == [KINDS["data_loading"].fix, KINDS["between_steps"].fix]
    assert json.loads(table["evidence"].iloc[0]) == {"top_events": []}


def _traces() -> list[Path]:
    found = sorted((REPO / "sample_traces").rglob("*.json.gz"))
    if SHARED.is_dir():
        found += sorted(SHARED.glob("*.json.gz")) + sorted((SHARED / "critical_path").glob("*.json.gz"))
    return found


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_findings_are_sane_on_real_traces(trace: Path) -> None:
    """Known kinds, each saving positive and at most its step, biggest first; the savings of findings about
    different work add up to at most the step (each counts only path time of its own events)."""
    parsed = profparse.load(trace, cache=False)
    table = parsed.findings
    assert set(table["kind"]) <= set(KINDS)
    assert (table["saving_ns_per_step"] > 0).all()
    assert (table["saving_share"] <= 1.0).all()
    assert table["saving_ns_per_step"].is_monotonic_decreasing
    assert table["saving_share"].sum() <= 1.0 + 1e-9
    for row in table.itertuples():
        assert set(parse_steps(row.steps)) <= set(parsed.steps["step"])
        assert row.step_count == len(parse_steps(row.steps))
        assert isinstance(json.loads(row.evidence), dict)
