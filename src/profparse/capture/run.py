"""One profiled session: load a Hugging Face causal LM, then train it a few steps, under ``torch.profiler``.

Layout of the trace (see docs/capture.md): the profiler starts, ``ProfilerStep#0`` covers loading
(``from_pretrained`` + ``.to(device)``, then the optimizer's creation), and ``ProfilerStep#1..N`` are the N
training steps. With stage marks on, ``record_function`` ranges named by :mod:`profparse.base.marks` wrap each
stage.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from profparse.base import marks
from profparse.base.errors import InputNotFoundError, UsageError, from_oserror, install_hint
from profparse.base.files import atomic_dir, check_target
from profparse.capture import calibrate
from profparse.capture.model import ensure_model
from profparse.capture.options import CaptureOptions, CaptureResult
from profparse.capture.quiet import kineto_lines_dropped

MANIFEST_FORMAT = 1
EXTRA_HINT = install_hint("capture")
SYNC_LOAD_ENV = "HF_DEACTIVATE_ASYNC_LOAD"
CALIBRATION_STEPS = 3  # training steps timed without the profiler after the capture


class CaptureDependencyError(ImportError):
    """torch or transformers (the ``capture`` extra) is not installed."""


def _import_deps() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise CaptureDependencyError(f"capture needs the 'capture' extra: {EXTRA_HINT} ({exc})") from exc
    return torch, transformers


def _logger(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(f"[capture] {msg}", file=sys.stderr, flush=True)

    return log


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def gzip_atomic(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(src, "rb") as fin, gzip.open(tmp, "wb", compresslevel=6) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def export_gzipped(prof: Any, dest: Path) -> Path:
    """``prof``'s Chrome trace at ``dest`` (.json.gz): exported to a temporary .json beside it, gzipped into place."""
    tmp_json = dest.with_name(f".{dest.name}.{os.getpid()}.json.tmp")
    try:
        prof.export_chrome_trace(str(tmp_json))
        gzip_atomic(tmp_json, dest)
    finally:
        tmp_json.unlink(missing_ok=True)
    return dest


def resolve_device(torch: Any, device: str) -> str:
    """``auto`` -> cuda or cpu; a device this machine does not have is a usage error (exit 2)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device!r}: not a device name (expected auto, cpu, cuda or cuda:N)") from None
    if kind.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}: capture runs on cpu or cuda only")
    if kind.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device!r}: CUDA is not available here (torch.cuda.is_available() is False)")
        if kind.index is not None and kind.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def dtype_keyword(transformers: Any) -> str:
    """``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    try:
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def from_pretrained_with_dtype(auto_cls: Any, path: Path, dtype: Any, kwarg: str) -> Any:
    try:
        return auto_cls.from_pretrained(str(path), **{kwarg: dtype})
    except TypeError:
        if kwarg != "dtype":
            raise
        return auto_cls.from_pretrained(str(path), torch_dtype=dtype)


def model_vocab_size(path: Path) -> int:
    """Read from ``config.json`` directly: going through transformers here would import model code before the
    profiler starts, and that import belongs to the traced ``from_pretrained``."""
    cfg = json.loads((path / "config.json").read_text())
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("vocab_size"), int):
            return c["vocab_size"]
    raise ValueError(f"{path / 'config.json'} has no vocab_size")


def _device_name(torch: Any, device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions(torch: Any, transformers: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import safetensors

        out["safetensors"] = safetensors.__version__
    except ImportError:
        out["safetensors"] = None
    try:
        from importlib.metadata import version

        out["profparse"] = version("profparse")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        out["profparse"] = None
    return out


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """Set (``value`` not None) an environment variable for the duration; restore it after."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def quiet_transformers(transformers: Any, quiet: bool) -> Iterator[None]:
    """Under --quiet, silence transformers' progress bars and warnings (this also drops tqdm's frames from the
    trace)."""
    if not quiet:
        yield
        return
    tl = transformers.utils.logging
    was_enabled = tl.is_progress_bar_enabled()
    verbosity = tl.get_verbosity()
    tl.disable_progress_bar()
    tl.set_verbosity_error()
    try:
        yield
    finally:
        tl.set_verbosity(verbosity)
        if was_enabled:
            tl.enable_progress_bar()


def _model_folder(options: CaptureOptions) -> Path | None:
    """``--model``'s folder, checked before anything is imported or created (exit 3 when it is not one)."""
    if options.model is None:
        return None
    path = Path(options.model).expanduser()
    try:
        if not path.is_dir():
            raise InputNotFoundError(f"{path}: no such model folder")
        if not (path / "config.json").is_file():
            raise InputNotFoundError(f"{path}: not a Hugging Face model folder (no config.json)")
    except OSError as exc:
        raise from_oserror(exc, inputs=[path]) from None
    return path


def run_capture(options: CaptureOptions) -> CaptureResult:
    """Profile loading + ``options.steps`` training steps; write ``trace.json.gz`` and ``manifest.json``.

    The run folder follows the verbs' output rules (profparse.base.files): it is written under a temporary
    name and renamed into place when complete, an existing one is replaced only with ``force`` and only when a
    capture wrote it. Bad requests raise :mod:`profparse.base.errors` errors before anything is created.
    """
    run_dir = Path(options.out) if options.out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    model_path = _model_folder(options)
    inputs = [model_path] if model_path is not None else []
    check_target(run_dir, kind="dir", verb="capture", force=options.force, inputs=inputs)
    torch, transformers = _import_deps()
    device = resolve_device(torch, options.device)
    with atomic_dir(run_dir, force=options.force, verb="capture", inputs=inputs) as work:
        manifest = _capture(options, torch, transformers, device, model_path, work)
    log = _logger(options.quiet)
    trace_path, manifest_path = run_dir / "trace.json.gz", run_dir / "manifest.json"
    log(f"wrote {trace_path} ({manifest['trace']['bytes'] / 1e6:.2f} MB) and {manifest_path.name}")
    return CaptureResult(run_dir=run_dir, trace_path=trace_path, manifest_path=manifest_path, manifest=manifest)


@dataclass
class _Session:
    """What one capture needs while it runs: the options, torch and transformers, the device, the dtype."""

    options: CaptureOptions
    torch: Any
    transformers: Any
    device: str
    dtype_name: str
    log: Callable[[str], None]

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def dtype(self) -> Any:
        return self.torch.bfloat16 if self.dtype_name == "bf16" else self.torch.float32

    def sync(self) -> None:
        if self.on_cuda:
            self.torch.cuda.synchronize(self.device)

    def mark(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if self.options.stage_marks:
            return self.torch.profiler.record_function(name)
        return contextlib.nullcontext()

    def activities(self) -> list[Any]:
        activity = self.torch.profiler.ProfilerActivity
        return [activity.CPU, activity.CUDA] if self.on_cuda else [activity.CPU]


def _capture(
    options: CaptureOptions, torch: Any, transformers: Any, device: str, model_path: Path | None, run_dir: Path
) -> dict[str, Any]:
    """The session itself, writing into ``run_dir`` (the temporary run folder); returns the manifest."""
    log = _logger(options.quiet)
    t_start = time.perf_counter()
    wall: dict[str, Any] = {}
    dtype_name = options.dtype or ("bf16" if device.startswith("cuda") else "fp32")
    session = _Session(options, torch, transformers, device, dtype_name, log)

    t0 = time.perf_counter()
    if model_path is not None:
        source, built = "path", False
    else:
        model_path, built = ensure_model(options.preset, options.layers, options.cache_dir, log=log)
        source = "default" if options.preset is None else f"preset:{options.preset}"
    wall["build_model"] = time.perf_counter() - t0

    # Inputs: random token ids from a seeded generator, made (and moved) before the profiler starts.
    vocab = model_vocab_size(model_path)
    gen = torch.Generator().manual_seed(options.seed)
    inputs = [
        torch.randint(0, vocab, (options.batch, options.seq_len), generator=gen).to(device)
        for _ in range(options.steps)
    ]
    torch.manual_seed(options.seed)
    with kineto_lines_dropped(no_gpu=not session.on_cuda):
        prof, model, losses = _profiled_run(session, model_path, inputs, wall)
        t0 = time.perf_counter()
        calibration = _calibration(session, model, inputs[0])
        wall["calibrate"] = time.perf_counter() - t0
    trace_path = run_dir / "trace.json.gz"
    json_bytes = _export(prof, run_dir, trace_path, wall, log, calibration)
    wall["total"] = time.perf_counter() - t_start
    manifest = _manifest(session, model, {"source": source, "path": model_path, "built_now": built}, losses, wall)
    manifest["trace"] = {"file": trace_path.name, "bytes": trace_path.stat().st_size, "json_bytes": json_bytes}
    manifest["calibration"] = calibration
    manifest_path = run_dir / "manifest.json"
    _atomic_write_bytes(manifest_path, (json.dumps(manifest, indent=2, default=str) + "\n").encode())
    return manifest


def _profiled_run(
    session: _Session, model_path: Path, inputs: list[Any], wall: dict[str, Any]
) -> tuple[Any, Any, list[Any]]:
    """Warm-up load (optional), then under the profiler: loading as ProfilerStep#0 and one ProfilerStep per
    training step. Returns the profiler, the model and the losses; adds wall times to ``wall``."""
    from transformers import AutoModelForCausalLM

    options, torch, transformers, log = session.options, session.torch, session.transformers, session.log
    load_kwarg = dtype_keyword(transformers)
    sync_load = "1" if options.sync_load else None
    if options.warm:
        log("warm-up load (not profiled)")
        t0 = time.perf_counter()
        with quiet_transformers(transformers, options.quiet), _env(SYNC_LOAD_ENV, sync_load):
            warm_model = from_pretrained_with_dtype(AutoModelForCausalLM, model_path, session.dtype, load_kwarg)
        del warm_model
        wall["warm_up"] = time.perf_counter() - t0

    # ProfilerStep#N is only recorded under a schedule: record every step, loading (#0) included.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*won't be using warmup.*")
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=options.steps + 1, repeat=1)
    log(
        f"profiling on {session.device} ({session.dtype_name}): load + {options.steps} step(s) of batch "
        f"{options.batch} x seq {options.seq_len}"
    )
    mark = session.mark
    with quiet_transformers(transformers, options.quiet):
        t_prof = time.perf_counter()
        with torch.profiler.profile(
            activities=session.activities(),
            schedule=schedule,
            with_stack=options.with_stack,
            record_shapes=options.record_shapes,
            profile_memory=options.profile_memory,
        ) as prof:
            log(f"loading {model_path}")
            t0 = time.perf_counter()
            with mark(marks.stage_mark("load")):
                with mark(marks.load_mark("from_pretrained")), _env(SYNC_LOAD_ENV, sync_load):
                    model = from_pretrained_with_dtype(AutoModelForCausalLM, model_path, session.dtype, load_kwarg)
                    t1 = time.perf_counter()
                with mark(marks.load_mark("to_device")):
                    model = model.to(session.device)
                    session.sync()
                    t2 = time.perf_counter()
            wall.update(from_pretrained=t1 - t0, to_device=t2 - t1, load=t2 - t0)
            t0 = time.perf_counter()
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr)
            wall["optimizer_init"] = time.perf_counter() - t0
            prof.step()
            losses, steps_wall = _training_steps(session, model, optimizer, inputs, prof)
        wall["profiled"] = time.perf_counter() - t_prof
    wall["steps"] = steps_wall
    return prof, model, losses


def _training_steps(
    session: _Session, model: Any, optimizer: Any, inputs: list[Any], prof: Any
) -> tuple[list[Any], list[dict[str, float]]]:
    """ProfilerStep#1..N: forward, backward and optimizer, each marked; the losses and each step's wall times."""
    mark, sync = session.mark, session.sync
    losses, steps_wall = [], []
    for i, ids in enumerate(inputs):
        session.log(f"step {i + 1}/{session.options.steps}")
        t0 = time.perf_counter()
        with mark(marks.stage_mark("forward")):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            sync()
        t1 = time.perf_counter()
        with mark(marks.stage_mark("backward")):
            loss.backward()
            sync()
        t2 = time.perf_counter()
        with mark(marks.stage_mark("optimizer")):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
        t3 = time.perf_counter()
        steps_wall.append({"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "total": t3 - t0})
        losses.append(loss.detach())
        prof.step()  # after the last step the schedule stops recording: no ProfilerStep#N+1
    return losses, steps_wall


def _calibration(session: _Session, model: Any, ids: Any) -> dict[str, Any]:
    """The profiler's cost per event kind (a micro-loop with and without it) and a few training steps timed
    without it (after one to warm up), for the trace's ``profparse_calibration`` (docs/without_profiler.md)."""
    torch = session.torch
    session.log("calibrating the profiler's cost (not profiled)")
    found = calibrate.micro_loop(torch, session.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=session.options.lr)

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    found["unprofiled_step_ns"] = calibrate.unprofiled_steps(step, session.sync, CALIBRATION_STEPS)
    return found


def _export(
    prof: Any,
    run_dir: Path,
    trace_path: Path,
    wall: dict[str, Any],
    log: Callable[[str], None],
    calibration: dict[str, Any] | None = None,
) -> int:
    """Chrome trace to a temporary .json (with ``calibration`` added), gzipped to a temporary name, renamed;
    returns the JSON's size."""
    log("exporting trace")
    tmp_json = run_dir / f".trace.{os.getpid()}.json.tmp"
    try:
        t0 = time.perf_counter()
        prof.export_chrome_trace(str(tmp_json))
        wall["export"] = time.perf_counter() - t0
        if calibration is not None:
            calibrate.add_to_trace(tmp_json, calibration)
        json_bytes = tmp_json.stat().st_size
        t0 = time.perf_counter()
        gzip_atomic(tmp_json, trace_path)
        wall["gzip"] = time.perf_counter() - t0
    finally:
        if tmp_json.exists():
            tmp_json.unlink()
    return json_bytes


def _manifest(
    session: _Session, model: Any, origin: dict[str, Any], losses: list[Any], wall: dict[str, Any]
) -> dict[str, Any]:
    """What was captured, how, and on what: the manifest written beside the trace (its ``trace`` entry aside)."""
    options, torch, device = session.options, session.torch, session.device
    return {
        "format": MANIFEST_FORMAT,
        "kind": "profparse.capture",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "versions": _versions(torch, session.transformers),
        "platform": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "system": platform.system(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        },
        "device": {"type": torch.device(device).type, "id": device, "name": _device_name(torch, device)},
        "dtype": session.dtype_name,
        "model": {
            "source": origin["source"],
            "path": str(origin["path"].resolve()),
            "built_now": origin["built_now"],
            "class": type(model).__name__,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "config": model.config.to_dict(),
        },
        "options": options.to_dict(),
        "profiler": {
            "activities": [a.name for a in session.activities()],
            "with_stack": options.with_stack,
            "record_shapes": options.record_shapes,
            "profile_memory": options.profile_memory,
        },
        "layout": {
            "warm": options.warm,
            "sync_load": options.sync_load,
            "ProfilerStep#0": "load (from_pretrained, .to(device), optimizer creation)",
            "ProfilerStep#1..N": "training steps",
            "steps": options.steps,
        },
        "stage_marks": (
            {
                "stages": [marks.stage_mark(s) for s in marks.TRAINING_STAGES],
                "load": [marks.load_mark("from_pretrained"), marks.load_mark("to_device")],
            }
            if options.stage_marks
            else None
        ),
        "losses": [float(x) for x in losses],
        "wall_s": wall,
    }


def summary_text(trace_path: str | os.PathLike[str]) -> str:
    """``profparse.summarize(trace_path)`` where it exists, else a note saying it does not yet."""
    import profparse

    summarize = getattr(profparse, "summarize", None)
    if summarize is None:
        return f"(profparse.summarize is not available yet; trace written to {trace_path})"
    return summarize(str(trace_path))
