"""``profparse advise`` and the findings on top of ``summarize``: planted findings (known kinds, savings, steps and
evidence, sized from the trace's own step windows) come out in every output, in order, with the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, training_step

from profparse.analysis.advice import detectors
from profparse.analysis.advice.finding import Finding
from profparse.analysis.advice.kinds import KINDS
from profparse.base.formats import ms_text, share_text
from profparse.cli.main import main
from profparse.outputs.summary.findings import NONE_LINE, SUMMARY_FINDINGS

STEPS = 3
#: planted findings: (kind, stage, share of the mean step saved, confidence); the last is under 1%: dropped
PLANTED = [
    ("grad_zeroing", "optimizer", 0.10, "medium"),
    ("data_loading", "load", 0.30, "high"),
    ("launch_bound", "forward", 0.004, "low"),
]
TOP_EVENT = {"name": "aten::zero_", "total_ns": 123_456, "count": 4}
FRAME = {"file": "train.py", "line": 42, "name": "<module>"}


def mean_window(parsed) -> float:
    steps = parsed.steps
    return float((steps["end_ns"] - steps["start_ns"]).mean())


def planted(ctx) -> list[Finding]:
    """The PLANTED findings, their savings a share of this trace's mean step window."""
    window = mean_window(ctx.parsed)
    numbers = [int(s) for s in ctx.parsed.steps["step"]]
    evidence = {"grad_zeroing": {"top_events": [TOP_EVENT], "zeroed_bytes": 4096}, "data_loading": {"frames": [FRAME]}}
    return [
        Finding(
            kind,
            stage,
            numbers if kind != "data_loading" else numbers[1:],
            share * window,
            window,
            conf,
            f"planted {kind}",
            evidence.get(kind, {}),
        )  # fmt: skip
        for kind, stage, share, conf in PLANTED
    ]


def plant(monkeypatch, found=(planted,)) -> None:
    monkeypatch.setattr(detectors, "registered", lambda: tuple(found))


@pytest.fixture
def trace(tmp_path) -> Path:
    b = TraceBuilder()
    t = 0.0
    for step in range(STEPS):
        t = training_step(b, step, t) + 20.0 * step  # windows of 100 us, 20 us apart more each step
    return b.write(tmp_path / "t.json.gz")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_text_lists_the_findings_biggest_saving_first_with_fix_and_evidence(trace, capsys, monkeypatch):
    plant(monkeypatch)
    code, out, _ = run(capsys, "advise", str(trace), "-q")
    assert code == 0
    from profparse.api import load

    window = mean_window(load(trace, cache=False))
    first, second = out.index("1. data_loading"), out.index("2. grad_zeroing")
    assert first < second and "launch_bound" not in out  # under 1% of a step: not a finding
    assert f"saves {ms_text(round(0.30 * window))} ms per step ({share_text(0.30)}), confidence high" in out
    assert "data_loading · load · steps 1-2" in out and f"grad_zeroing · optimizer · steps 0-{STEPS - 1}" in out
    for kind in ("data_loading", "grad_zeroing"):
        assert KINDS[kind].fix.split(":")[0] in out and f"planted {kind}" in out
    block = out[second:]
    assert "top events:" in block and f"{ms_text(TOP_EVENT['total_ns'])} ms  aten::zero_  (x4)" in block
    assert "train.py(42): <module>" in out[first:second]


def test_json_is_the_findings_table(trace, capsys, monkeypatch):
    plant(monkeypatch)
    code, out, _ = run(capsys, "advise", str(trace), "-q", "--format", "json")
    assert code == 0
    findings = json.loads(out)["findings"]
    from profparse.api import load

    parsed = load(trace)  # the same cache entry: the findings table it stored
    table = parsed.findings
    assert [f["kind"] for f in findings] == list(table["kind"]) == ["data_loading", "grad_zeroing"]
    assert [f["saving_ns_per_step"] for f in findings] == [int(x) for x in table["saving_ns_per_step"]]
    assert findings[0]["saving_share"] == pytest.approx(0.30) and findings[1]["saving_share"] == pytest.approx(0.10)
    assert findings[0]["steps"] == list(range(1, STEPS)) and findings[1]["steps"] == list(range(STEPS))
    assert findings[1]["evidence"] == {"top_events": [TOP_EVENT], "zeroed_bytes": 4096}
    assert findings[0]["evidence"] == {"frames": [FRAME]}
    keys = {"kind", "stage", "steps", "saving_ns_per_step", "saving_share", "confidence", "message", "fix", "evidence"}
    assert all(set(f) == keys for f in findings)
    savings = [f["saving_ns_per_step"] for f in findings]
    assert savings == sorted(savings, reverse=True)


def test_summarize_json_has_the_same_findings_and_the_text_shows_them_on_top(trace, capsys, monkeypatch):
    many = [("sync_in_step", "forward", 0.02 * (i + 1), "low") for i in range(4)]
    plant(monkeypatch, (planted, _more(many)))
    _, advised, _ = run(capsys, "advise", str(trace), "-q", "--format", "json")
    code, out, _ = run(capsys, "summarize", str(trace), "-q", "--format", "json")
    assert code == 0 and json.loads(out)["findings"] == json.loads(advised)["findings"]
    assert len(json.loads(out)["findings"]) == 6
    _, text, _ = run(capsys, "summarize", str(trace), "-q")
    assert text.index("Findings (6,") < text.index("Stage totals")
    numbered = [line.strip()[:3] for line in text.splitlines() if line.startswith("  ") and line.strip()[1:3] == ". "]
    shown = [n for n in numbered if n[0].isdigit()]
    assert len(shown) == SUMMARY_FINDINGS and "6. " not in text
    pointer = f"(1 more, and the evidence: profparse advise {trace})"
    assert (pointer if len(pointer) <= 98 else pointer.replace(str(trace), "TRACE")) in text  # the path if it fits
    assert max(len(line) for line in text.splitlines()[1:]) <= 100
    assert "top events:" not in text  # the evidence is advise's


def _more(rows):
    def detect(ctx) -> list[Finding]:
        window = mean_window(ctx.parsed)
        steps = [int(s) for s in ctx.parsed.steps["step"]]
        return [Finding(k, s, steps, share * window, window, c, f"planted {k} {share}") for k, s, share, c in rows]

    return detect


def test_no_findings_is_one_line(trace, capsys, monkeypatch):
    plant(monkeypatch, ())
    code, out, _ = run(capsys, "advise", str(trace), "-q")
    assert code == 0 and out.rstrip().endswith(NONE_LINE) and out.count("\n") == 3
    assert json.loads(run(capsys, "advise", str(trace), "-q", "--format", "json")[1]) == {"findings": []}
    _, text, _ = run(capsys, "summarize", str(trace), "-q")
    assert text.count(NONE_LINE) == 1 and "Findings (" not in text


def test_the_second_run_replays_the_stored_text(trace, capsys, monkeypatch):
    plant(monkeypatch)
    first = run(capsys, "advise", str(trace), "-q")
    plant(monkeypatch, ())  # a replay does not run the detectors again
    assert run(capsys, "advise", str(trace), "-q") == first
    assert run(capsys, "advise", str(trace), "-q", "--no-cache")[1].rstrip().endswith(NONE_LINE)


@pytest.mark.parametrize(
    "content, argv, code",
    [
        (None, [], 3),  # no such file
        (b"", [], 4),  # empty: not a trace
        (b"{not json", [], 4),
        (b'{"traceEvents": []}', ["--format", "xml"], 2),
    ],
)
def test_bad_input_is_one_line_and_its_exit_code(tmp_path, capsys, content, argv, code):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    got, out, err = run(capsys, "advise", str(path), *argv)
    assert got == code and out == "" and len(err.strip().splitlines()) == 1 and "error" in err


def test_findings_csv_and_markdown_sections(trace, capsys, monkeypatch):
    plant(monkeypatch)
    _, csv_text, _ = run(capsys, "summarize", str(trace), "-q", "--format", "csv")
    rows = [line.split(",") for line in csv_text.splitlines() if line.split(",")[2:3] == ["Findings"]]
    savings = {r[3]: r[5] for r in rows if r[4] == "saving_ns_per_step"}
    values = json.loads(run(capsys, "advise", str(trace), "-q", "--format", "json")[1])["findings"]
    assert savings == {f"{i}. {f['kind']}": str(f["saving_ns_per_step"]) for i, f in enumerate(values, 1)}
    _, md, _ = run(capsys, "summarize", str(trace), "-q", "--format", "markdown")
    assert md.index("## Findings") < md.index("## Stage totals")
    assert all(f"{i}. {f['kind']}" in md for i, f in enumerate(values, 1))


def test_a_long_step_list_is_shortened_in_the_heading() -> None:
    from profparse.outputs.summary.findings import STEPS_SHOWN, heading, steps_label

    steps = [s for base in range(0, 40_000, 1000) for s in (base + 4, base + 5, base + 6)]
    label = steps_label(steps)
    assert label == f"steps 4-6,1004-1006,...,39004-39006 ({len(steps)} steps)"
    assert len(label) < STEPS_SHOWN + 30
    assert steps_label([1, 2, 3, 5]) == "steps 1-3,5" and steps_label([7]) == "step 7"
    assert steps_label([]) == "all steps"
    assert steps_label([1, 3, 5, 7, 9, 11]) == "steps 1,3,5,7,9,11"  # short: whole
    finding = {"kind": "launch_bound", "stage": "forward", "steps": steps, "saving_ns_per_step": 1e6,
               "saving_share": 0.5, "confidence": "medium"}  # fmt: skip
    assert label in heading(1, finding)
