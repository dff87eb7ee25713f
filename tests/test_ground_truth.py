"""Ground truth for stage attribution: marked captures of training patterns, stripped of their marks, must be
attributed like the marks say (>= 99.5% of CPU op self time), and the agreement measure itself is exact.

The captures need torch and transformers (the ``capture`` extra). Each runs once per session, on first use, into
a temporary folder; all 16 take about 30-80 s on an idle 2-core machine. The compiled pattern runs with
``backend="aot_eager"`` (inductor compiles for minutes on two cores).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder

import profparse
from profparse.analysis.agreement import agreement
from profparse.base import marks
from profparse.capture.patterns import PATTERNS, capture_pattern, rank_path, strip_marks, trace_name

TARGET = 0.995
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "patterns.py"


# -- the measure on hand-built traces ----------------------------------------------------------------------------


def _handbuilt(path: Path) -> Path:
    """One step: forward op (30 us, kernel 10 us), backward node (30 us), optimizer op inside Optimizer.step (30 us),
    all inside their marks, and an unmarked copy (30 us, kernel 30 us) inside an ``nn.Module`` call, which the rules
    call forward (``forward.module``) while its truth, outside every mark, is other."""
    b = TraceBuilder(autograd_thread=False)
    b.annotation("ProfilerStep#1", 0, 200)
    b.annotation(marks.stage_mark("forward"), 1, 40)
    b.annotation("nn.Module: Linear", 1.5, 32)  # the forward evidence without marks
    b.op("aten::mm", 2, 31)  # its 1 us launch call is not its self time
    b.launch(3, 50, 10, name="gemm")
    b.annotation(marks.stage_mark("backward"), 45, 40)
    b.op("autograd::engine::evaluate_function: MmBackward0", 46, 30)
    b.annotation(marks.stage_mark("optimizer"), 90, 40)
    b.annotation("Optimizer.step#AdamW.step", 91, 35)
    b.op("aten::add_", 92, 30)
    b.annotation("nn.Module: Head", 139, 33)
    b.op("aten::copy_", 140, 31)
    b.launch(141, 175, 30, name="copy_kernel")
    return b.write(path)


@pytest.fixture(scope="module")
def handbuilt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("handbuilt")
    marked = _handbuilt(folder / "marked.json.gz")
    stripped = folder / "stripped.json.gz"
    assert strip_marks(marked, stripped) == 3
    return marked, stripped


def test_agreement_handbuilt_known_shares(handbuilt: tuple[Path, Path]) -> None:
    marked, stripped = handbuilt
    result = agreement(profparse.parse(marked, include_marks=True), profparse.parse(stripped))
    summary = result.summary
    assert summary.loc["cpu_op", "total_ns"] == 120_000
    assert summary.loc["cpu_op", "agree_ns"] == 90_000
    assert result.share("cpu_op") == 0.75
    assert result.share("gpu") == 0.25  # the gemm agrees (10 us), the copy kernel follows its op (30 us)
    confusion = result.confusion("cpu_op")
    assert confusion.loc["forward", "forward"] == 30_000
    assert confusion.loc["backward", "backward"] == 30_000
    assert confusion.loc["optimizer", "optimizer"] == 30_000
    assert confusion.loc["other", "forward"] == 30_000
    assert int(confusion.to_numpy().sum()) == summary.loc["cpu_op", "total_ns"]  # the cells add up to the whole
    gpu = result.confusion("gpu")
    assert gpu.loc["forward", "forward"] == 10_000 and gpu.loc["other", "forward"] == 30_000
    assert int(gpu.to_numpy().sum()) == summary.loc["gpu", "total_ns"] == 40_000
    wrong = result.disagreements("cpu_op")
    assert wrong[["name", "truth", "stage", "stage_rule", "ns", "events"]].values.tolist() == [
        ["aten::copy_", "other", "forward", "forward.module", 30_000, 1]
    ]
    assert wrong.loc[0, "share"] == 0.25


def test_agreement_handbuilt_marks_kept_agree_fully(handbuilt: tuple[Path, Path]) -> None:
    marked, _ = handbuilt
    parsed = profparse.parse(marked, include_marks=True)
    result = agreement(parsed, parsed)
    assert result.share("cpu_op") == 0.75  # the truth of the unmarked copy is other, whatever the rules say


def test_agreement_refuses_unmarked_truth_and_other_traces(handbuilt: tuple[Path, Path], tmp_path: Path) -> None:
    marked, stripped = handbuilt
    with pytest.raises(ValueError, match="include_marks=True"):
        agreement(profparse.parse(marked, include_marks=False), profparse.parse(stripped))
    b = TraceBuilder(autograd_thread=False)
    b.annotation("ProfilerStep#1", 0, 50)
    b.op("aten::mm", 2, 30)
    other = b.write(tmp_path / "other.json.gz")
    with pytest.raises(ValueError, match="different CPU op events"):
        agreement(profparse.parse(marked, include_marks=True), profparse.parse(other))


def test_script_measures_existing_traces(handbuilt: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("patterns_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    marked, _ = handbuilt
    (tmp_path / trace_name("grad_accum", True)).write_bytes(marked.read_bytes())
    assert script.main(["--out", str(tmp_path), "--pattern", "grad_accum", "--no-capture"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["grad_accum_stack.json.gz", "cpu_op", "75.000%"]
    assert lines[1].split() == ["25.000%", "aten::copy_", "other", "->", "forward", "forward.module"]
    assert lines[2].split() == ["grad_accum_nostack.json.gz", "missing"]
    assert (tmp_path / "stripped" / "grad_accum_stack.json.gz").is_file()


def test_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import profparse.capture.patterns as p, profparse.analysis.agreement\n"
        "try:\n    p.capture_pattern('nope', 'x.json.gz', True)\nexcept ValueError as e:\n    print(e)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("unknown pattern 'nope'")


def _events_as_text(path: Path) -> list[dict]:
    """Events with every number kept as its text, so a rewrite that changes a digit shows."""
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=str, parse_int=str)["traceEvents"]


def test_strip_marks_removes_marks_only(handbuilt: tuple[Path, Path], tmp_path: Path) -> None:
    marked, stripped = handbuilt
    before, after = _events_as_text(marked), _events_as_text(stripped)
    assert after == [e for e in before if not str(e.get("name", "")).startswith(marks.STAGE_MARK_PREFIX)]
    assert len(before) - len(after) == 3
    # ns digits beyond double precision survive (a json round trip through floats would round them)
    b = TraceBuilder(autograd_thread=False)
    b.annotation(marks.stage_mark("forward"), 0, 10)
    b.op("aten::mm", 1, 5)
    path = b.write(tmp_path / "t.json")
    text = path.read_text().replace('"ts": 1,', '"ts": 1764582319123456.789,').replace('"ts": 0,', '"ts": 1,')
    path.write_text(text)
    out = tmp_path / "t.stripped.json"
    strip_marks(path, out)
    assert "1764582319123456.789" in out.read_text()
    assert marks.STAGE_MARK_PREFIX not in out.read_text()


# -- the captured patterns --------------------------------------------------------------------------------------

# Before the step phase model (main at fda993f) 11 of the 16 cases were below the target: 78.4-99.6% without
# stacks, 89.3-98.9% with (weight init load->forward by forward.step, clipping optimizer->forward, DDP
# construction's collectives load->other). Every case now passes; XFAIL lists a case that is known to fail, with
# the measured figure, should one regress on purpose.
XFAIL: dict[tuple[str, bool], str] = {}


def _cases() -> list:
    out = []
    for name in PATTERNS:
        for with_stack in (True, False):
            case_marks = []
            if (name, with_stack) in XFAIL:
                case_marks.append(pytest.mark.xfail(strict=False, reason=XFAIL[(name, with_stack)]))
            out.append(pytest.param(name, with_stack, marks=case_marks, id=trace_name(name, with_stack)[:-8]))
    return out


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory):
    """``capture(name, with_stack)``: the marked trace of a pattern, captured once per session."""
    pytest.importorskip("torch", reason="the pattern captures need torch (the 'capture' extra)")
    pytest.importorskip("transformers", reason="the pattern captures need transformers (the 'capture' extra)")
    folder = tmp_path_factory.mktemp("patterns")
    done: dict[tuple[str, bool], Path] = {}
    old_backend = os.environ.get("PROFPARSE_COMPILE_BACKEND")
    os.environ.setdefault("PROFPARSE_COMPILE_BACKEND", "aot_eager")  # inductor compiles for minutes on 2 cores

    def capture(name: str, with_stack: bool) -> Path:
        key = (name, with_stack)
        if key not in done:
            done[key] = capture_pattern(name, folder / trace_name(name, with_stack), with_stack)
        return done[key]

    yield capture
    if old_backend is None:
        os.environ.pop("PROFPARSE_COMPILE_BACKEND", None)


def _measure(marked: Path):
    stripped = marked.with_name("stripped-" + marked.name)
    assert strip_marks(marked, stripped) > 0
    truth = profparse.parse(marked, include_marks=True)
    result = agreement(truth, profparse.parse(stripped))
    confusion = result.confusion("cpu_op")
    assert int(confusion.to_numpy().sum()) == result.summary.loc["cpu_op", "total_ns"] > 0  # parts add up
    assert result.summary.loc["cpu_op", "events"] == len(truth.ops)
    return result


@pytest.mark.parametrize(("name", "with_stack"), _cases())
def test_pattern_agreement(captures, name: str, with_stack: bool) -> None:
    path = captures(name, with_stack)
    paths = [path, rank_path(path, 1)] if name == "ddp" else [path]
    for marked in paths:
        result = _measure(marked)
        share = result.share("cpu_op")
        wrong = result.disagreements("cpu_op", top=3)
        detail = "; ".join(
            f"{r.name} {r.truth}->{r.stage} ({r.stage_rule}) {100 * r.share:.2f}%" for r in wrong.itertuples()
        )
        assert share >= TARGET, f"{marked.name}: {100 * share:.3f}% of cpu_op self time agrees: {detail}"
