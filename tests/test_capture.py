"""End-to-end tests of the capture (scripts/capture.py over profparse.capture), on CPU with the tiny model.

The model is built once per session into a temporary cache; each capture is 1 step of a short sequence.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profparse.base import marks
from profparse.base.files import MARKER, read_marker

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "capture.py"
SMALL = {"steps": 1, "batch": 1, "seq_len": 16}


def _needs_capture_extra() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profparse-cache")


@pytest.fixture(scope="module")
def marked_run(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    _needs_capture_extra()
    from profparse.capture import CaptureOptions, run_capture

    out = tmp_path_factory.mktemp("run-marked")
    return run_capture(CaptureOptions(out=str(out), cache_dir=str(cache_dir), quiet=True, **SMALL))


def _events(trace_path: Path) -> list[dict]:
    with gzip.open(trace_path, "rt") as f:
        doc = json.load(f)
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    return doc["traceEvents"]


def _names(events: list[dict], cat: str) -> list[str]:
    return [e["name"] for e in events if e.get("cat") == cat]


def _load_script():
    spec = importlib.util.spec_from_file_location("capture_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_marked_capture_trace(marked_run) -> None:
    assert marked_run.trace_path == marked_run.run_dir / "trace.json.gz"
    events = _events(marked_run.trace_path)
    annotations = _names(events, "user_annotation")
    steps = sorted(n for n in annotations if n.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1"]  # load, then the one training step
    for stage in marks.TRAINING_STAGES:
        assert annotations.count(marks.stage_mark(stage)) == 1
    assert marks.load_mark("from_pretrained") in annotations
    assert marks.load_mark("to_device") in annotations
    assert any(n.startswith("Optimizer.step#AdamW") for n in annotations)
    assert _names(events, "python_function"), "with_stack is on by default"
    assert _names(events, "cpu_op")

    # Each stage range lies inside the ProfilerStep that the layout promises.
    spans = {e["name"]: e for e in events if e.get("cat") == "user_annotation"}

    def inside(inner: str, outer: str) -> bool:
        a, b = spans[inner], spans[outer]
        return b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"]

    assert inside(marks.stage_mark("load"), "ProfilerStep#0")
    assert inside(marks.load_mark("from_pretrained"), marks.stage_mark("load"))
    assert inside(marks.load_mark("to_device"), marks.stage_mark("load"))
    for stage in ("forward", "backward", "optimizer"):
        assert inside(marks.stage_mark(stage), "ProfilerStep#1")


def test_marked_capture_manifest(marked_run) -> None:
    manifest = json.loads(marked_run.manifest_path.read_text())
    assert manifest == json.loads(json.dumps(marked_run.manifest))
    for key in ("python", "torch", "transformers"):
        assert manifest["versions"][key]
    assert manifest["platform"]["platform"]
    assert manifest["device"]["type"] == "cpu" and manifest["device"]["name"]
    assert manifest["dtype"] == "fp32"
    model = manifest["model"]
    assert model["source"] == "default" and model["built_now"] is True
    assert model["config"]["model_type"] == "qwen2" and model["config"]["num_hidden_layers"] == 2
    assert manifest["options"]["steps"] == 1 and manifest["options"]["stage_marks"] is True
    wall = manifest["wall_s"]
    for key in ("load", "from_pretrained", "to_device", "export", "total"):
        assert wall[key] >= 0
    assert len(wall["steps"]) == 1 and set(wall["steps"][0]) >= {"forward", "backward", "optimizer"}
    assert len(manifest["losses"]) == 1
    assert manifest["trace"]["bytes"] == marked_run.trace_path.stat().st_size
    hidden = [p.name for p in marked_run.run_dir.iterdir() if p.name.startswith(".")]
    assert hidden == [MARKER], "temp files left"
    assert read_marker(marked_run.run_dir)["verb"] == "capture"
    siblings = [p.name for p in marked_run.run_dir.parent.iterdir() if p.name.startswith(f".{marked_run.run_dir.name}")]
    assert not siblings  # no lock file, no temporary folder


def test_script_without_marks_or_stack(marked_run, cache_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PROFPARSE_CACHE_DIR", str(cache_dir))
    script = _load_script()
    out = tmp_path / "run"
    argv = ["--out", str(out), "--steps", "1", "--batch", "1", "--seq-len", "16"]
    monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD", raising=False)
    rc = script.main([*argv, "--no-stage-marks", "--no-stack", "--no-memory", "--sync-load", "--quiet"])
    assert rc == 0
    captured = capsys.readouterr()
    # The stage summary (or the note that profparse.summarize is not there yet); the parser is written
    # concurrently, so a failing summary is reported on stderr without failing the capture.
    assert captured.out.strip() or "the summary failed" in captured.err
    assert "[capture]" not in captured.err  # --quiet

    events = _events(out / "trace.json.gz")
    annotations = _names(events, "user_annotation")
    assert sorted(n for n in annotations if n.startswith("ProfilerStep#")) == [
        "ProfilerStep#0",
        "ProfilerStep#1",
    ]
    assert not [e for e in events if str(e.get("name", "")).startswith(("profparse.stage:", "profparse.load:"))]
    assert not _names(events, "python_function")
    assert not _names(events, "cpu_instant_event")  # no [memory] events
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["built_now"] is False  # reused the cached model
    assert manifest["stage_marks"] is None
    assert manifest["layout"]["sync_load"] is True
    assert "HF_DEACTIVATE_ASYNC_LOAD" not in os.environ  # set for the loads only


def test_model_rebuilt_when_record_differs(marked_run, cache_dir: Path, tmp_path: Path) -> None:
    import shutil

    from profparse.capture import DEFAULT_MODEL_NAME, ensure_model

    cached = cache_dir / "models" / DEFAULT_MODEL_NAME
    path, built = ensure_model(cache_dir=cache_dir)
    assert (path, built) == (cached, False)

    other = tmp_path / "cache"
    shutil.copytree(cached, other / "models" / DEFAULT_MODEL_NAME)
    record = other / "models" / DEFAULT_MODEL_NAME / "profparse_model.json"
    stale = json.loads(record.read_text())
    stale["config"]["hidden_size"] = 32
    record.write_text(json.dumps(stale))
    path, built = ensure_model(cache_dir=other)
    assert built is True
    assert json.loads(record.read_text())["config"]["hidden_size"] == 64
    assert sorted(p.name for p in (other / "models").iterdir()) == [DEFAULT_MODEL_NAME]  # no temp folders


def test_import_does_not_import_torch() -> None:
    code = "import sys, profparse, profparse.capture; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_missing_extra_message(tmp_path: Path) -> None:
    code = (
        "import sys, runpy; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
        f"sys.argv = ['capture.py', '--out', {str(tmp_path / 'run')!r}]; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 2
    hint = "pip install -e '.[capture]' (from a checkout) or pip install 'profparse[capture]'"
    assert proc.stderr.strip() == f"capture: needs the 'capture' extra: {hint}"
    assert not (tmp_path / "run").exists()


def _script(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def _one_line_error(proc: subprocess.CompletedProcess, code: int, contains: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capture: error: ") and contains in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_model_folder_is_exit_3_and_creates_nothing(tmp_path: Path) -> None:
    proc = _script("--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "run"), "--quiet")
    _one_line_error(proc, 3, "no such model folder")
    (tmp_path / "not-a-model").mkdir()
    proc = _script("--model", str(tmp_path / "not-a-model"), "--out", str(tmp_path / "run"), "--quiet")
    _one_line_error(proc, 3, "no config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-model"]  # no run folder, no lock, no tmp


def test_cuda_without_cuda_is_a_usage_error(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for device in ("cuda", "cuda:0"):
        proc = _script("--device", device, "--out", str(tmp_path / "run"), "--quiet")
        _one_line_error(proc, 2, "CUDA is not available")
    _one_line_error(_script("--device", "tpu9", "--out", str(tmp_path / "run"), "--quiet"), 2, "not a device name")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("option", "value"), [("--steps", "0"), ("--batch", "-1"), ("--seq-len", "x"), ("--seed", "-2")]
)
def test_numeric_options_checked_by_the_parser(tmp_path: Path, option: str, value: str) -> None:
    proc = _script(option, value, "--out", str(tmp_path / "run"))
    _one_line_error(proc, 2, option)
    assert not list(tmp_path.iterdir())


def test_out_on_existing_run_needs_force(marked_run, cache_dir: Path, tmp_path: Path) -> None:
    """--out on a finished run: exit 6 without --force (the run untouched); with --force it is replaced."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(marked_run.run_dir, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    small = ["--steps", "1", "--batch", "1", "--seq-len", "16", "--quiet"]
    env_cache = {"PROFPARSE_CACHE_DIR": str(cache_dir)}
    os.environ.update(env_cache)
    try:
        proc = _script("--out", str(run), *small)
        _one_line_error(proc, 6, "--force")
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
        proc = _script("--out", str(run), "--force", *small)
        assert proc.returncode == 0, proc.stderr
    finally:
        for key in env_cache:
            os.environ.pop(key, None)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["created"] and (run / "trace.json.gz").read_bytes() != before["trace.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no lock, no temporary folder


def test_out_on_a_folder_capture_did_not_write_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ([], ["--force"]):
        proc = _script("--out", str(mine), "--quiet", *extra)
        _one_line_error(proc, 9, "did not write")
        assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


NO_GPU_DRIVER = "ERROR:2026-12-07 07:12:59 28679:28679 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35"


def test_kineto_log_lines_are_kept_off_stderr() -> None:
    """Kineto's C++ ``USDT:`` lines (profiler_start / profiler_stop) do not reach the user, nor, on a CPU capture,
    the line a CUDA build of torch without a GPU driver prints as the profiler stops; other output does."""
    code = (
        "import os, sys, torch\n"
        "from profparse.capture.quiet import kineto_lines_dropped\n"
        "with kineto_lines_dropped(no_gpu=True):\n"
        "    print('mine before', file=sys.stderr)\n"
        "    with torch.profiler.profile():\n"
        "        torch.ones(3) + 1\n"
        "    os.write(2, b'USDT:2026-01-01 00:00:00 1:1 X.cpp:1] profiler_stop\\nfrom C\\n')\n"
        f"    os.write(2, b'{NO_GPU_DRIVER}\\n')\n"
        "    print('mine after', file=sys.stderr)\n"
        "print('outside', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["mine before", "from C", "mine after", "outside"]


def test_a_missing_gpu_driver_is_kept_on_a_gpu_capture() -> None:
    """Only a CPU capture drops Kineto's no-driver line: on a GPU capture it says what went wrong."""
    code = (
        "import os\n"
        "from profparse.capture.quiet import kineto_lines_dropped\n"
        "with kineto_lines_dropped():\n"
        f"    os.write(2, b'USDT:2026-01-01 00:00:00 1:1 X.cpp:1] profiler_start\\n{NO_GPU_DRIVER}\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [NO_GPU_DRIVER]


def test_capture_calibrates_the_profilers_cost(marked_run) -> None:
    """A real CPU capture measures the profiler's cost per op (a micro-loop with and without it) and times three
    steps unprofiled; the trace carries them, and its step without the profiler says ``calibrated``."""
    import profparse
    from profparse.analysis.profiler_cost import CALIBRATION_KEY, without_profiler
    from profparse.capture import calibrate

    assert calibrate.CALIBRATION_KEY == CALIBRATION_KEY
    with gzip.open(marked_run.trace_path, "rt") as f:
        found = json.load(f)[CALIBRATION_KEY]
    assert found == marked_run.manifest["calibration"]
    loop = found["micro_loop_ns_per_op"]["cpu"]
    assert 0 < loop["plain"] < loop["profiled"] <= loop["shapes"] * 1.5  # recording costs; shapes cost more
    costs = found["per_event_ns"]
    assert costs["op"] == pytest.approx(loop["profiled"] - loop["plain"], abs=0.1) and costs["op_shapes"] > 0
    assert len(found["unprofiled_step_ns"]) == 3 and min(found["unprofiled_step_ns"]) > 0
    p = profparse.parse(marked_run.trace_path)
    assert without_profiler(p)["basis"] == "calibrated"
    assert "profiler_cost_uncalibrated" not in set(p.warnings["check"])


def test_calibration_is_added_over_the_closing_brace(tmp_path: Path) -> None:
    from profparse.capture import calibrate

    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "}"}]}\n\n')
    calibrate.add_to_trace(path, {"per_event_ns": {"op": 1.5}})
    assert json.loads(path.read_text()) == {
        "traceEvents": [{"ph": "X", "name": "}"}],
        calibrate.CALIBRATION_KEY: {"per_event_ns": {"op": 1.5}},
    }
