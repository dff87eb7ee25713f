"""``profparse.on_trace_ready``: a real ``torch.profiler`` loop on a tiny model (CPU), one cycle set per rank under
gloo, and the files it writes opened by every verb."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from importlib.util import find_spec
from pathlib import Path

import pytest

pytest.importorskip("torch")

import profparse  # noqa: E402
from profparse.cli.main import main  # noqa: E402
from profparse.integrations.torch_profiler import TRACE_SUFFIX, CycleFiles, run_cycle  # noqa: E402

ACTIVE = 3  # profiled steps per cycle
CYCLES = 2

# wait 1, warmup 1, active 3, twice: the cycles end at profiler steps 5 and 10
LOOP = textwrap.dedent(
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    def train(handler, steps=10):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler,
                     schedule=schedule(wait=1, warmup=1, active=3, repeat=2)) as prof:
            for _ in range(steps):
                loss = model(torch.randn(32, 64)).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                prof.step()
    """
)


def train(handler: object) -> None:
    namespace: dict = {}
    exec(LOOP, namespace)  # the same loop the gloo ranks run
    namespace["train"](handler)


@pytest.fixture(scope="module")
def background_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, profparse.integrations.TraceHandler]:
    out = tmp_path_factory.mktemp("prof")
    handler = profparse.on_trace_ready(out, report=True)
    train(handler)
    assert handler.wait(timeout=300) == 0  # no cycle failed
    return out, handler


def total_rows(trace: str) -> dict[str, int]:
    frame = profparse.load(trace).stage_summary
    totals = frame[frame["scope"] == "total"]
    return dict(zip(totals["stage"], totals["host_wall_ns"].astype("int64"), strict=True))


def steady_rows(trace: str) -> dict[str, int]:
    """Per stage, its host wall in the trace's steady steps (the ``steps`` table's ``steady`` column)."""
    parsed = profparse.load(trace)
    frame = parsed.stage_summary
    steady = parsed.steps.loc[parsed.steps["steady"], "step"]
    rows = frame[(frame["scope"] == "step") & frame["step"].isin(steady)]
    return rows.groupby("stage", observed=True)["host_wall_ns"].sum().astype("int64").to_dict()


def test_each_cycle_writes_its_trace_summary_and_report(background_run) -> None:
    out, handler = background_run
    assert [Path(c.folder).name for c in handler.cycles] == ["step-5", "step-10"]
    for files in handler.cycles:
        folder = Path(files.folder)
        names = sorted(p.name for p in folder.iterdir())
        stem = Path(files.trace).name[: -len(TRACE_SUFFIX)]
        assert names == sorted([f"{stem}{TRACE_SUFFIX}", f"{stem}.summary.txt", f"{stem}.report.html"])  # no temp
        with gzip.open(files.trace, "rb") as f:
            assert json.load(f)["traceEvents"]
        assert Path(files.summary).read_text(encoding="utf-8") == profparse.summarize(files.trace)
        assert Path(files.report).read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
        assert len(profparse.load(files.trace).steps) == ACTIVE  # the cycle's steps, not the whole run's


def test_each_cycle_is_calibrated_by_steps_timed_without_the_profiler(background_run) -> None:
    """The loop's one wait step after the first cycle is timed and stored in both cycles' traces (the second ends
    with the loop: it takes the latest block timed); their step without the profiler rests on it."""
    from profparse.analysis.profiler_cost import CALIBRATION_KEY, without_profiler

    _, handler = background_run
    assert len(handler.timed_steps) == 1 and len(handler.timed_steps[0]) == 1  # wait=1: one unprofiled step
    for files in handler.cycles:
        parsed = profparse.load(files.trace)
        calibration = parsed.header[CALIBRATION_KEY]
        assert calibration == {"unprofiled_step_ns": handler.timed_steps[0], "source": "profparse.on_trace_ready"}
        found = without_profiler(parsed)
        assert found["basis"] == "calibrated" and found["unprofiled_step_ns"] == handler.timed_steps[0][0]
        assert "profiler_cost_uncalibrated" not in set(parsed.warnings["check"])
        assert "calibrated at capture" in Path(files.summary).read_text(encoding="utf-8")


def test_calibrate_false_leaves_the_trace_as_exported(tmp_path) -> None:
    from profparse.analysis.profiler_cost import CALIBRATION_KEY, without_profiler

    handler = profparse.on_trace_ready(tmp_path, background=False, quiet=True, calibrate=False)
    train(handler)
    assert handler.timed_steps == [] and [c.status for c in handler.cycles] == ["written"] * CYCLES
    parsed = profparse.load(handler.cycles[0].trace)
    assert CALIBRATION_KEY not in parsed.header and without_profiler(parsed)["basis"] == "default"


def test_steps_after_a_cycle_are_timed_from_the_second(tmp_path) -> None:
    """A loop that runs on after its one cycle: four steps are timed, the first (which pays for the profiler's
    teardown) kept apart; the cycle waits for them, in the training process too (``background=False``)."""
    handler = profparse.on_trace_ready(tmp_path, background=False, quiet=True)
    namespace: dict = {}
    exec(LOOP.replace("repeat=2", "repeat=1"), namespace)
    namespace["train"](handler, steps=12)
    (block,) = handler.timed_steps
    assert len(block) == 4 and all(ns > 0 for ns in block)
    parsed = profparse.load(handler.cycles[0].trace)
    calibration = parsed.header["profparse_calibration"]
    assert calibration["unprofiled_step_ns"] == block[1:] and calibration["first_step_after_recording_ns"] == block[0]
    from profparse.analysis.profiler_cost import without_profiler

    found = without_profiler(parsed)
    assert found["basis"] == "calibrated" and found["unprofiled_step_ns"] == round(sum(block[1:]) / 3)


def test_the_printed_line_names_the_files_and_the_biggest_stage(tmp_path, capfd) -> None:
    handler = profparse.on_trace_ready(tmp_path, background=False)
    train(handler)
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("profparse: ")]
    assert len(lines) == CYCLES == len(handler.cycles) == len(handler.export_seconds)
    for line, files in zip(lines, handler.cycles, strict=True):
        stem = files.trace[: -len(TRACE_SUFFIX)]
        assert line.startswith(f"profparse: {stem}.* (trace, summary.txt): step time ")
        # each cycle's first step holds its first optimizer step: warm-up, left out of the line's figures
        assert f"median of {ACTIVE - 1} steady steps" in line
        host_wall = steady_rows(files.trace)
        assert f"biggest stage {max(host_wall, key=host_wall.get)}:" in line
        assert files.report is None and not list(Path(files.folder).glob("*.html"))


@pytest.mark.parametrize(
    "verb",
    [
        ["summarize", "{trace}"],
        ["summarize", "{folder}"],
        ["summarize", "{folder}", "--format", "json"],
        ["parse", "{trace}", "-o", "{out}/tables"],
        ["parse", "{folder}", "-o", "{out}/rank_tables"],
        ["report", "{folder}", "-o", "{out}/ranks.html"],
        ["plot", "{trace}", "-o", "{out}/plots", "--kind", "stages"],
        ["annotate", "{trace}", "-o", "{out}/annotated.json.gz"],
        ["diff", "{trace}", "{other}"],
        ["hta", "{trace}"],
    ],
    ids=lambda v: " ".join(v[:2]),
)
def test_every_verb_opens_the_files(background_run, tmp_path, verb: list[str]) -> None:
    if verb[0] == "hta" and find_spec("hta") is None:
        pytest.skip("the hta extra is not installed")
    _, handler = background_run
    first, second = handler.cycles
    values = {"trace": first.trace, "folder": first.folder, "out": str(tmp_path), "other": second.trace}
    assert main([part.format(**values) for part in verb] + ["-q"]) == 0


class GarbageProfiler:
    """A profiler whose export is not a trace: the handler must say so and let training go on."""

    step_num = 7

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text("this is not JSON", encoding="utf-8")


@pytest.mark.parametrize("background", [False, True])
def test_a_trace_that_cannot_be_read_is_one_line_not_an_exception(tmp_path, capfd, background: bool) -> None:
    handler = profparse.on_trace_ready(tmp_path, background=background)
    handler(GarbageProfiler())
    assert handler.wait(timeout=120) == 1  # the one cycle failed
    err = capfd.readouterr().err
    assert f"profparse: {handler.cycles[0].trace}: not analysed: " in err
    assert "Traceback" not in err


def test_run_cycle_reports_failure_in_its_exit_code(tmp_path) -> None:
    folder = tmp_path / "step-1"
    folder.mkdir()
    files = CycleFiles(str(folder), str(folder / f"x{TRACE_SUFFIX}"), str(folder / "x.summary.txt"), None)
    assert run_cycle(str(tmp_path / "missing.json"), files, quiet=True) == 1


def test_importing_the_handler_imports_no_torch() -> None:
    code = "import sys, profparse, profparse.integrations; profparse.on_trace_ready; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


RANK_SCRIPT = LOOP + textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    import profparse

    dist.init_process_group("gloo")
    handler = profparse.on_trace_ready(sys.argv[1], background=False, quiet=True)
    _train = train

    def train_ddp(handler):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler,
                     schedule=schedule(wait=1, warmup=1, active=3)) as prof:
            for _ in range(6):
                model(torch.randn(8, 32)).sum().backward()
                prof.step()

    train_ddp(handler)
    dist.destroy_process_group()
    """
)


def test_two_gloo_ranks_write_one_file_set_each_and_summarize_reads_them(tmp_path, capsys) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT, encoding="utf-8")
    out = tmp_path / "prof"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(out)], env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    folder = out / "step-5"
    assert sorted(p.name for p in folder.iterdir()) == [
        f"rank{r}{suffix}" for r in range(2) for suffix in (TRACE_SUFFIX, ".summary.txt")
    ]
    for r in range(2):  # the name's rank is the one torch wrote into the trace
        with gzip.open(folder / f"rank{r}{TRACE_SUFFIX}", "rb") as f:
            assert json.load(f)["distributedInfo"]["rank"] == r
    assert main(["summarize", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(r["rank"] for r in data["ranks"] if r["status"] == "ok") == [0, 1]


def test_a_cycle_never_writes_over_a_file_it_did_not_make(tmp_path: Path) -> None:
    """A file (or a dangling link) of one of the cycle's names in step-N/ moves the cycle to step-N-2/ and stays."""
    from profparse.base.errors import ProfparseError
    from profparse.integrations.torch_profiler import cycle_files, write_text

    first = tmp_path / "step-3"
    first.mkdir()
    (first / "rank0.summary.txt").write_text("the user's notes")
    (first / "rank0.report.html").symlink_to(tmp_path / "nowhere")
    files = cycle_files(tmp_path, 3, "rank0", report=True)
    assert Path(files.folder) == tmp_path / "step-3-2" and Path(files.folder).is_dir()
    write_text(Path(files.summary), "summary")
    assert (first / "rank0.summary.txt").read_text() == "the user's notes"
    assert (first / "rank0.report.html").is_symlink() and not (tmp_path / "nowhere").exists()
    assert Path(files.summary).read_text() == "summary"
    with pytest.raises(ProfparseError):  # and a second write of the same name is refused, not overwritten
        write_text(Path(files.summary), "again")
    assert Path(files.summary).read_text() == "summary"
