"""Findings of a folder of ranks (profparse.ranks.advice): every rank's own, with its rank, and a ``late_rank``
finding per stage where the others wait at the collectives for one rank, its saving the wait per step."""

from __future__ import annotations

import json

import pytest
import test_ranks_late as late_traces  # the hand-built rank folders (a module: its tests are not collected here)
from test_ranks_late import gloo_ddp_folder  # noqa: F401 - the shared capture (rank 1 sleeps in backward)

import profparse
from profparse import ranks
from profparse.analysis.advice import detectors
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding
from profparse.cli.main import main

DELAYS_US = [300.0, 120.0, 180.0]  # the late rank's delay before its backward allreduce in each step
STEADY = [1, 2]  # every step runs the optimizer: the first is warm-up (the ``steady`` column of ``steps``)


def one_per_rank(ctx) -> list[Finding]:
    """A planted finding on every rank: 5% of its mean step, in the optimizer, on every step."""
    steps = ctx.parsed.steps
    window = float((steps["end_ns"] - steps["start_ns"]).mean())
    return [Finding("grad_zeroing", "optimizer", [int(s) for s in steps["step"]], 0.05 * window, window, "low", "x")]


def plant(monkeypatch, found=(one_per_rank,)) -> None:
    monkeypatch.setattr(detectors, "registered", lambda: tuple(found))


def advise_json(capsys, *argv: str) -> list[dict]:
    assert main(["advise", *argv, "-q", "-j", "1", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["findings"]


@pytest.mark.parametrize("n, late_rank", [(2, 1), (4, 2)])
def test_the_late_rank_finding_is_the_wait_per_step(tmp_path, capsys, monkeypatch, n, late_rank):
    plant(monkeypatch)
    folder = late_traces.ranks_folder(tmp_path, n, late_rank, DELAYS_US)
    findings = advise_json(capsys, str(folder))
    late = [f for f in findings if f["kind"] == "late_rank"]
    assert len(late) == 1
    f = late[0]
    assert (f["rank"], f["stage"], f["steps"]) == (late_rank, "backward", STEADY)
    steady_delays = [DELAYS_US[s] for s in STEADY]
    assert f["saving_ns_per_step"] == sum(steady_delays) * 1000 / len(STEADY)  # ground truth: the delays, per step
    window_ns = (late_traces.STEP_US - 10) * 1000  # the ProfilerStep windows
    assert f["saving_share"] == pytest.approx(f["saving_ns_per_step"] / window_ns)
    assert f["confidence"] == "high" and f["evidence"]["times_last"] == f["evidence"]["collectives"] == len(DELAYS_US)
    assert sorted(d["delay_ns"] for d in f["evidence"]["delays"]) == sorted(int(d * 1000) for d in steady_delays)
    assert [e["name"] for e in f["evidence"]["top_events"]][:1] == ["slow_kernel"]  # what it did more
    own = [x for x in findings if x["kind"] == "grad_zeroing"]
    assert sorted(x["rank"] for x in own) == list(range(n))  # each rank's own findings, with its rank
    savings = [x["saving_ns_per_step"] for x in findings]
    assert savings == sorted(savings, reverse=True) and findings[0]["kind"] == "late_rank"
    # summarize DIR: the same findings, and the first of them on top of its text
    assert main(["summarize", str(folder), "-q", "-j", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == findings
    assert main(["summarize", str(folder), "-q", "-j", "1"]) == 0
    text = capsys.readouterr().out
    assert text.index(f"1. rank {late_rank} · late_rank · backward · steps 1-2") < text.index("Stragglers")


@pytest.mark.parametrize("optimizer_from", [0, 2])
def test_the_late_rank_counts_the_steady_steps_as_each_ranks_findings_do(tmp_path, capsys, monkeypatch, optimizer_from):
    """With gradient accumulation (no optimizer step before step 2), warm-up runs to step 2: the late rank's saving
    is over steps 3-4, as the rank's own detectors count them, from the traces and from a written dataset."""
    delays = [300.0, 120.0, 180.0, 240.0, 60.0]
    folder = late_traces.ranks_folder(tmp_path, 2, 1, delays, optimizer_from=optimizer_from)
    steady = list(range(optimizer_from + 1, len(delays)))
    parsed = profparse.load(folder / "rank1.json.gz", cache=False)
    assert parsed.steps.loc[parsed.steps["steady"], "step"].tolist() == steady
    assert AdviceContext.of(parsed).warm_up == list(range(optimizer_from + 1))
    plant(monkeypatch, ())
    late = [f for f in advise_json(capsys, str(folder)) if f["kind"] == "late_rank"]
    assert [(f["rank"], f["steps"]) for f in late] == [(1, steady)]
    assert late[0]["saving_ns_per_step"] == sum(delays[s] for s in steady) * 1000 / len(steady)
    assert main(["parse", str(folder), "-o", str(tmp_path / "out"), "-q", "-j", "1"]) == 0
    assert [f for f in advise_json(capsys, str(tmp_path / "out")) if f["kind"] == "late_rank"] == late


def test_a_written_dataset_gives_the_same_findings(tmp_path, capsys, monkeypatch):
    plant(monkeypatch)
    folder = late_traces.ranks_folder(tmp_path, 2, 1, DELAYS_US)
    parsed_now = advise_json(capsys, str(folder))
    assert main(["parse", str(folder), "-o", str(tmp_path / "out"), "-q", "-j", "1"]) == 0
    plant(monkeypatch, ())  # read back from the dataset's findings table, not computed again
    assert advise_json(capsys, str(tmp_path / "out")) == parsed_now


def test_no_late_rank_and_no_findings(tmp_path, capsys, monkeypatch):
    plant(monkeypatch, ())
    folder = late_traces.ranks_folder(tmp_path, 2, 1, [0.0, 0.0])
    assert advise_json(capsys, str(folder)) == []
    assert main(["advise", str(folder), "-q", "-j", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("No finding saves 1% of a step or more.")


def test_a_failed_rank_is_exit_7_and_the_others_are_advised(tmp_path, capsys, monkeypatch):
    plant(monkeypatch)
    folder = late_traces.ranks_folder(tmp_path, 2, 1, DELAYS_US)
    (folder / "rank2.json").write_bytes(b"{not json")
    assert main(["advise", str(folder), "-q", "-j", "1", "--format", "json"]) == 7
    out, err = capsys.readouterr()
    assert "rank 2" in err and {f["rank"] for f in json.loads(out)["findings"]} == {0, 1}
    assert main(["advise", str(folder), "-q", "-j", "1", "--keep-going"]) == 0


# -- a real gloo DDP capture: rank 1 sleeps 400 ms in backward (test_ranks_late's capture) --------------------------


def test_gloo_capture_late_rank_finding_names_rank_1_backward_and_the_sleep(gloo_ddp_folder, capsys):  # noqa: F811
    findings = advise_json(capsys, str(gloo_ddp_folder))
    late = [f for f in findings if f["kind"] == "late_rank"]
    slept = [f for f in late if f["stage"] == late_traces.LATE_STAGE]
    assert len(slept) == 1, late
    f = slept[0]
    injected = late_traces.SLEEP_S * 1e9
    assert f["rank"] == late_traces.LATE_RANK
    assert abs(f["saving_ns_per_step"] - injected) <= 0.3 * injected, f["saving_ns_per_step"]
    assert f == max(late, key=lambda x: x["saving_ns_per_step"])  # the biggest wait of all late ranks
    run = ranks.parse_ranks(gloo_ddp_folder, None, jobs=1)
    assert (
        f["evidence"]["collectives"]
        == f["evidence"]["times_last"]
        == len(run.matches[(run.matches["match_stage"] == late_traces.LATE_STAGE)].drop_duplicates("match"))
    )
