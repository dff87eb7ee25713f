"""The torch handler and the Trainer callback never break training: a killed worker, a removed working folder, an
output path that is a file, a read-only or full output folder are warnings and failed cycles, and the loop runs to
its last step. ``handler.wait()`` returns only when every cycle is final and says which failed."""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import profparse  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "qwen2_tiny_cpu_nostack_syncload.json.gz"

# a real torch.profiler loop (tiny model, CPU): cycles end at steps 5 and 10; FAULT is injected after the first
LOOP = textwrap.dedent(
    """
    import json, os, shutil, signal, sys, warnings
    from pathlib import Path
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    import profparse

    fault, out, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir()
    os.chdir(work)
    if fault == "step_file":
        out.mkdir()
        (out / "step-10").write_text("the user's file")
    if fault == "dir_file":
        out.write_text("not a folder")
    handler = profparse.on_trace_ready(out if fault != "relative" else os.path.relpath(out), quiet=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, killed = 0, False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler,
                     schedule=schedule(wait=1, warmup=1, active=3, repeat=2)) as prof:
            for _ in range(12):
                model(torch.randn(8, 16)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                prof.step()
                steps += 1
                if len(handler.cycles) == 1 and fault == "kill" and not killed:
                    worker = getattr(handler._worker, "process", handler._worker)
                    os.kill(worker.pid, signal.SIGKILL)
                    worker.wait()
                    killed = True
                if len(handler.cycles) == 1 and fault in ("remove_cwd", "relative") and work.exists():
                    if fault == "relative":
                        handler.wait()  # the first cycle's worker still needs the folder its paths are relative to
                    shutil.rmtree(work)
        failed = handler.wait(timeout=300)
    cycles = [[Path(c.folder).name, c.status, c.error] for c in handler.cycles]
    profparse_warnings = [str(w.message) for w in caught if "profparse" in str(w.message)]
    print(json.dumps({"steps": steps, "failed": failed, "cycles": cycles, "warnings": profparse_warnings}))
    """
)


def run_loop(tmp_path: Path, fault: str) -> dict:
    """Run the loop in its own process (a handler that raises there can take the process down) and read its end."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(script), fault, str(tmp_path / "prof"), str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_killed_worker_fails_its_cycle_and_a_new_one_takes_the_next(tmp_path: Path) -> None:
    result = run_loop(tmp_path, "kill")
    assert result["steps"] == 12
    (first, status0, error0), (second, status1, _) = result["cycles"]
    assert (first, status0, second, status1) == ("step-5", "failed", "step-10", "written")
    assert "worker ended (exit -9)" in error0
    assert result["failed"] == 1
    assert any("worker ended" in w and "steps: 5" in w for w in result["warnings"])
    folder = tmp_path / "prof" / "step-10"
    assert profparse.summarize(str(next(folder.glob("*.pt.trace.json.gz"))))  # the second cycle's files are whole


def test_a_removed_working_folder_does_not_stop_an_absolute_output(tmp_path: Path) -> None:
    result = run_loop(tmp_path, "remove_cwd")
    assert result["steps"] == 12 and result["failed"] == 0
    assert [c[:2] for c in result["cycles"]] == [["step-5", "written"], ["step-10", "written"]]


def test_the_worker_starts_even_when_the_loop_folder_goes_while_it_starts(tmp_path: Path, monkeypatch) -> None:
    """A starting Python (3.11 and later) makes each PYTHONPATH entry absolute and dies ("failed to make path
    absolute") on an empty or relative one in a removed folder: the worker's PYTHONPATH has only absolute entries."""
    from profparse.integrations.torch_profiler import worker_pythonpath

    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, subprocess, sys\n"
        "os.chdir(sys.argv[1]); os.rmdir(sys.argv[1])\n"
        "env = {**os.environ, 'PYTHONPATH': sys.argv[2]}\n"
        "done = subprocess.run([sys.executable, '-c', 'pass'], env=env, capture_output=True, text=True)\n"
        "print(done.returncode)\n"
    )
    raw = str(REPO / "src") + os.pathsep + os.pathsep + "relative"
    monkeypatch.chdir(tmp_path)
    starts = []
    for pythonpath in (raw, worker_pythonpath(raw)):
        gone.mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, "-c", script, str(gone), pythonpath], capture_output=True, text=True)
        starts.append(done.stdout.strip())
    # the loop's own PYTHONPATH kills a Python (3.11 and later) started there; the worker's does not
    assert starts == ["1" if sys.version_info >= (3, 11) else "0", "0"]
    assert all(Path(entry).is_absolute() for entry in worker_pythonpath(raw).split(os.pathsep))


def test_a_removed_working_folder_with_a_relative_output_is_a_warning(tmp_path: Path) -> None:
    result = run_loop(tmp_path, "relative")
    assert result["steps"] == 12 and result["failed"] == 1
    assert [c[:2] for c in result["cycles"]] == [["step-5", "written"], ["step-10", "failed"]]
    assert "working folder was removed" in result["cycles"][1][2]
    assert any("step 10 was not analysed" in w for w in result["warnings"])


def test_a_step_folder_name_held_by_a_file_moves_the_cycle_beside_it(tmp_path: Path) -> None:
    result = run_loop(tmp_path, "step_file")
    assert result["steps"] == 12 and result["failed"] == 0
    assert [c[:2] for c in result["cycles"]] == [["step-5", "written"], ["step-10-2", "written"]]
    assert (tmp_path / "prof" / "step-10").read_text() == "the user's file"


def test_an_output_folder_that_is_a_file_fails_every_cycle_with_a_warning(tmp_path: Path) -> None:
    result = run_loop(tmp_path, "dir_file")
    assert result["steps"] == 12 and result["failed"] == 2
    assert [c[1] for c in result["cycles"]] == ["failed", "failed"]
    assert all("Error" in c[2] for c in result["cycles"])  # FileExistsError / NotADirectoryError, named
    assert len(result["warnings"]) == 2
    assert (tmp_path / "prof").read_text() == "not a folder"


class SampleProfiler:
    """Exports a real trace (the sample, or ``text`` when given) as a profiler's ``export_chrome_trace`` does."""

    def __init__(self, step: int, text: str | None = None) -> None:
        self.step_num, self.text = step, text

    def export_chrome_trace(self, path: str) -> None:
        if self.text is not None:
            Path(path).write_text(self.text, encoding="utf-8")
            return
        with gzip.open(SAMPLE, "rb") as src:
            Path(path).write_bytes(src.read())


@pytest.mark.skipif(not SAMPLE.exists(), reason="no sample_traces/")
def test_wait_after_a_timeout_still_waits_for_the_worker(tmp_path: Path) -> None:
    handler = profparse.on_trace_ready(tmp_path, quiet=True)
    handler(SampleProfiler(3))
    with pytest.raises(subprocess.TimeoutExpired):
        handler.wait(timeout=0.01)  # the worker is still importing
    assert handler.wait(timeout=300) == 0
    files = handler.cycles[0]
    assert files.status == "written" and Path(files.summary).read_text().startswith("profparse summary:")
    handler(SampleProfiler(6))  # the handler stays usable: a new worker takes the next cycle
    assert handler.wait(timeout=300) == 0 and Path(handler.cycles[1].summary).exists()


@pytest.mark.skipif(not SAMPLE.exists(), reason="no sample_traces/")
def test_wait_says_which_cycle_failed_and_why(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    handler = profparse.on_trace_ready(tmp_path, quiet=True)
    handler(SampleProfiler(3, text="this is not JSON"))
    handler(SampleProfiler(6))
    assert handler.wait(timeout=300) == 1
    assert [c.status for c in handler.cycles] == ["failed", "written"]
    assert handler.cycles[0].error and "JSON" in handler.cycles[0].error
    assert Path(handler.cycles[1].summary).exists()
    assert handler.wait(timeout=300) == 0  # counted once
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_killed_while_waiting_is_a_failed_cycle_not_a_hang(tmp_path: Path) -> None:
    handler = profparse.on_trace_ready(tmp_path, quiet=True)
    handler(SampleProfiler(3, text="{}"))
    os.kill(handler._worker.process.pid, signal.SIGKILL)
    assert handler.wait(timeout=60) == 1
    assert handler.cycles[0].status == "failed" and "exit -9" in handler.cycles[0].error


def trainer_run(tmp_path: Path, prof: Path) -> tuple[SimpleNamespace, list[str]]:
    """The tiny Trainer run of tests/test_integrations_trainer.py into ``prof``; its profparse warnings."""
    for module in ("transformers", "accelerate"):
        pytest.importorskip(module, reason=f"the Trainer needs {module}")
    from test_integrations_trainer import _tiny_run

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _tiny_run(tmp_path, prof)
    return run, [str(w.message) for w in caught if str(w.message).startswith("profparse: ProfileCallback")]


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_a_trainer_whose_out_dir_is_a_file_trains_to_the_end(tmp_path: Path, where: str) -> None:
    (tmp_path / "taken").write_text("the user's file")
    prof = tmp_path / "taken" if where == "file" else tmp_path / "taken" / "prof"
    run, caught = trainer_run(tmp_path, prof)
    assert run.trainer.state.global_step == 5  # every step ran
    assert len(caught) == 1 and "no trace written" in caught[0] and "training goes on" in caught[0]
    assert run.callback.error and run.callback.files == [] and run.callback.trace_path is None
    assert (tmp_path / "taken").read_text() == "the user's file"


@pytest.mark.parametrize("stage", ["trace", "summary"])
def test_a_trainer_whose_out_dir_is_full_trains_to_the_end(tmp_path: Path, monkeypatch, stage: str) -> None:
    """A full disk (ENOSPC from the write) at the trace or at the summary: a warning, no half file, training on."""
    import profparse.integrations.transformers as module

    real = module.atomic_file
    calls = []

    def full(path, *args, **kwargs):  # the first atomic write is the trace's, the second the summary's
        calls.append(path)
        if len(calls) == (1 if stage == "trace" else 2):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, "atomic_file", full)
    prof = tmp_path / "prof"
    run, caught = trainer_run(tmp_path, prof)
    assert run.trainer.state.global_step == 5
    assert len(caught) == 1 and "No space left" in caught[0]
    left = sorted(p.name for p in prof.iterdir())
    assert left == ([] if stage == "trace" else ["trainer_steps_1-3.json.gz"])  # no temporary, no half file
