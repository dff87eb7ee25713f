"""Profile chosen steps of any Hugging Face ``Trainer`` run, with profparse's stage marks (docs/integrations.md).

``Trainer(..., callbacks=[ProfileCallback(steps=(10, 13), out_dir="prof")])`` records optimizer steps 10, 11 and
12 (``state.global_step`` when the step begins, as ``range(10, 13)``) with ``torch.profiler`` and writes the trace,
its stage summary and its HTML report. Nothing about the user's training changes: their model, collator,
optimizer and scheduler run as they are. The stages are marked with profparse's ``record_function`` names
(:mod:`profparse.base.marks`) so attribution reads them instead of inferring them:

- forward: the Trainer's ``compute_loss`` (the model's forward and its loss);
- backward: its accelerator's ``backward(loss)``;
- optimizer: from the end of the step's last backward (the accelerator's ``sync_gradients``), so the Trainer's
  loss checks and gradient clipping there, through ``on_pre_optimizer_step``, ``optimizer.step()``, the LR
  scheduler and ``zero_grad`` to ``on_step_end``: what profparse's rules call ``optimizer.before_step`` and
  ``optimizer`` (docs/stages.md).

Callbacks are not handed the Trainer, so the callback finds it on the call stack of ``on_train_begin`` and wraps
those three methods on that instance only while a profiled step runs (undone afterwards). Where it cannot (a
Trainer-like loop that is not a ``transformers.Trainer``), only the optimizer is marked and profparse's inference
decides the forward/backward split. Data loading and logging between steps stay unmarked: profparse calls them
``other``.

With ``calibrate=True`` (default) a few steps just before the profiled ones (else just after them) are timed without
the profiler and stored in the trace (:mod:`profparse.integrations.step_clock`), so that the step without the
profiler is ``calibrated`` (docs/without_profiler.md).
"""

from __future__ import annotations

import gzip
import inspect
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profparse.base import marks
from profparse.base.errors import install_hint
from profparse.base.files import atomic_file
from profparse.integrations.step_clock import SOURCES, STEPS, calibration, cuda_sync, store

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - the module is only imported by Trainer users
    raise ImportError(
        f"profparse.integrations.transformers needs transformers and torch: {install_hint('trainer')}"
    ) from error

#: The files of one run, after its base name: the trace, the summary, the report.
OUTPUT_SUFFIXES = (".json.gz", ".summary.txt", ".report.html")

#: The ``TrainerCallback`` hooks the callback relies on (``on_pre_optimizer_step``: transformers 4.47 and later).
REQUIRED_HOOKS: tuple[str, ...] = (
    "on_train_begin",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_step_end",
    "on_train_end",
)


def missing_hooks(base: type = TrainerCallback) -> list[str]:
    """The required hooks that ``base`` (the installed ``TrainerCallback``) lacks."""
    return [name for name in REQUIRED_HOOKS if not callable(getattr(base, name, None))]


def calling_trainer() -> Any | None:
    """The ``transformers.Trainer`` whose method is on the call stack (the one running the callbacks), if any."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, transformers.Trainer):
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame


class StageMarks:
    """At most one stage mark open at a time: opening one closes the previous, so the ranges never overlap."""

    def __init__(self) -> None:
        self.current: Any = None
        self.stage: str | None = None

    def open(self, stage: str) -> None:
        """Open ``stage``'s mark; one already open for the same stage stays (one range, not two)."""
        import torch

        if self.stage == stage:
            return
        self.close()
        self.current = torch.autograd.profiler.record_function(marks.stage_mark(stage))
        self.current.__enter__()
        self.stage = stage

    def close(self) -> None:
        if self.current is not None:
            current, self.current, self.stage = self.current, None, None
            current.__exit__(None, None, None)

    def around(
        self,
        stage: str,
        function: Callable[..., Any],
        active: Callable[[], bool],
        then: Callable[[], str | None] = lambda: None,
    ) -> Callable[..., Any]:
        """``function`` run inside the ``stage`` mark while ``active()``, else as it is; afterwards the mark of
        the stage ``then()`` names is opened (None: closed). Inside a mark of the same stage it just runs."""

        def marked(*args: Any, **kwargs: Any) -> Any:
            if not active() or self.stage == stage:
                return function(*args, **kwargs)
            self.open(stage)
            try:
                return function(*args, **kwargs)
            finally:
                following = then()
                if following is None:
                    self.close()
                else:
                    self.open(following)

        marked.__wrapped__ = function  # type: ignore[attr-defined]
        return marked


class ProfileCallback(TrainerCallback):
    """Profile optimizer steps ``range(*steps)`` of a ``Trainer`` run into ``out_dir``, with stage marks.

    Writes ``trainer_steps_A-B[_rankN].json.gz`` (the trace), ``.summary.txt`` (``profparse summarize``) and, with
    ``report``, ``.report.html``, then prints one line: where they are, the step time and the biggest stage."""

    def __init__(
        self,
        steps: tuple[int, int] = (10, 13),
        out_dir: str | Path = "prof",
        *,
        report: bool = True,
        record_shapes: bool = True,
        with_stack: bool = False,
        profile_memory: bool = False,
        quiet: bool = False,
        calibrate: bool = True,
    ) -> None:
        start, stop = (int(s) for s in steps)
        if not 0 <= start < stop:
            raise ValueError(f"steps must be (start, stop) with 0 <= start < stop, like range(); got {steps!r}")
        self.steps = range(start, stop)
        self.out_dir = Path(out_dir)
        self.report, self.quiet, self.calibrate = report, quiet, calibrate
        self.options = {"record_shapes": record_shapes, "with_stack": with_stack, "profile_memory": profile_memory}
        missing = missing_hooks()
        self.disabled = (
            f"profparse: ProfileCallback is off: transformers {transformers.__version__} has no "
            f"TrainerCallback.{', '.join(missing)} (profparse needs transformers >= 4.47); training runs unprofiled"
            if missing
            else None
        )
        if self.disabled:
            warnings.warn(self.disabled, RuntimeWarning, stacklevel=2)
        self.marks = StageMarks()
        self.trainer: Any = None
        self.profiler: Any = None
        self.in_step = False
        self.rank: int | None = None
        self.trace_path: Path | None = None
        self.name = ""
        self.files: list[Path] = []
        self.error: str | None = None  # why the files were not (all) written, if they were not
        self._undo: list[Callable[[], None]] = []
        # steps timed without the profiler (ns), before and after the profiled ones; the trace waits for the
        # steps after (``_pending``) when too few ran before
        self.timed_before: list[int] = []
        self.timed_after: list[int] = []
        self._mark: int | None = None  # the end of the last step timed or opening a block
        self._max_steps = 0
        self._pending = False
        self._raw: Path | None = None  # the exported trace, before its calibration is added

    # -- the Trainer's hooks ---------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.disabled:
            return
        self.trainer = calling_trainer()
        self.rank = args.process_index if args.world_size > 1 else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.disabled:
            return
        self._max_steps = int(getattr(state, "max_steps", 0) or 0)
        if self.profiler is None and state.global_step == self.steps.start:
            enough = len(self.timed_before) >= STEPS - 1
            self._pending = self.calibrate and not enough and self._max_steps > self.steps.stop
            self._start()
        self.in_step = self.profiler is not None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.in_step:
            self.marks.open("optimizer")  # optimizer.step(), then the LR scheduler and zero_grad, to on_step_end

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Nothing to do: the optimizer mark opened at ``on_pre_optimizer_step`` stays open until the step ends."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.disabled:
            return
        if not self.in_step:
            self._time_step(int(state.global_step) - 1)
            return
        self.marks.close()
        self.in_step = False
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")
            self.profiler.step()  # ends this ProfilerStep#; after the last profiled step, the recording
        if state.global_step >= self.steps.stop:
            self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None:  # training ended inside the profiled steps: keep what was recorded
            self.marks.close()
            self.in_step = False
            self._finish()
        self._complete()  # the trace still waiting for steps after it takes those that ran

    # -- steps timed without the profiler ----------------------------------------------------------------------

    def _time_step(self, step: int) -> None:
        """Step ``step`` (the Trainer's ``global_step`` when it began) ended unprofiled: timed when it is one of the
        :data:`STEPS` just before the profiled ones, or, while the trace waits, just after them; one
        synchronisation at each end of a block."""
        if not self.calibrate:
            return
        start, stop = self.steps.start, self.steps.stop
        first = max(1, start - STEPS)  # the first step's own time includes the run's start: never timed
        last_after = min(stop + STEPS, self._max_steps) - 1
        if first - 1 <= step < start:
            if step in (first - 1, start - 1):
                cuda_sync()
            now = time.perf_counter_ns()
            if step >= first and self._mark is not None:
                self.timed_before.append(now - self._mark)
            self._mark = now
        elif self._pending and stop <= step <= last_after and self._mark is not None:
            if step == last_after:
                cuda_sync()
            now = time.perf_counter_ns()
            self.timed_after.append(now - self._mark)
            self._mark = now
            if step == last_after:
                self._complete()

    def _found(self) -> dict[str, Any] | None:
        """The trace's calibration: the steps after it where it waited for them, else those before, else none."""
        if not self.calibrate:
            return None
        if self.timed_after:
            return calibration(self.timed_after, SOURCES[1], after_recording=True)
        return calibration(self.timed_before, SOURCES[1], after_recording=False) if self.timed_before else None

    def _complete(self) -> None:
        """The trace that waited for the steps after it: placed with their times, then its summary and report."""
        if not self._pending:
            return
        self._pending = False
        if self._raw is None:  # not exported (a warning said why)
            return
        try:
            self._place_trace()
        except Exception as exc:  # noqa: BLE001 - whatever stops the trace, training goes on
            self.trace_path, self.files = None, []
            self._warn(f"no trace written into {self.out_dir}", exc)
            return
        self._outputs()

    # -- profiling -------------------------------------------------------------------------------------------

    def _start(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # a schedule makes torch record one ProfilerStep#N range per step (profparse's step windows)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")  # warmup=0 is meant: every step is recorded
            schedule = torch.profiler.schedule(wait=0, warmup=0, active=len(self.steps), repeat=1)
            self.profiler = torch.profiler.profile(
                activities=activities, schedule=schedule, on_trace_ready=self._export, **self.options
            )
            self.profiler.start()
        self._wrap_trainer()

    def _wrap_trainer(self) -> None:
        """Mark forward, backward and clipping by wrapping the Trainer's methods on this instance only."""
        trainer = self.trainer
        if trainer is None:
            return
        active = lambda: self.in_step  # noqa: E731
        targets = [(trainer, "compute_loss", "forward")]
        accelerator = getattr(trainer, "accelerator", None)
        after_backward = lambda: "optimizer" if getattr(accelerator, "sync_gradients", False) else None  # noqa: E731
        if accelerator is not None:
            targets += [(accelerator, "backward", "backward"), (accelerator, "clip_grad_norm_", "optimizer")]
        for owner, name, stage in targets:
            if not callable(getattr(owner, name, None)):
                continue
            had_own = name in vars(owner)
            previous = vars(owner).get(name)
            then = after_backward if name == "backward" else lambda: None
            setattr(owner, name, self.marks.around(stage, getattr(owner, name), active, then))
            self._undo.append(lambda o=owner, n=name, h=had_own, p=previous: setattr(o, n, p) if h else delattr(o, n))

    def _unwrap_trainer(self) -> None:
        while self._undo:
            self._undo.pop()()

    def free_name(self) -> str:
        """``trainer_steps_A-B[_rankR]``, or with ``-2``, ``-3``... when ``out_dir`` already holds a file (or link)
        of one of this run's names: an earlier run's files, or the user's, are never written over."""
        base = f"trainer_steps_{self.steps.start}-{self.steps.stop - 1}"
        base += f"_rank{self.rank}" if self.rank is not None else ""
        name, attempt = base, 1
        while any(os.path.lexists(self.out_dir / f"{name}{suffix}") for suffix in OUTPUT_SUFFIXES):
            attempt += 1
            name = f"{base}-{attempt}"
        return name

    def _warn(self, what: str, exc: BaseException) -> None:
        """A failure to write is a warning and ``self.error``: profiling never aborts training."""
        self.error = f"{what} ({type(exc).__name__}: {exc})"
        warnings.warn(f"profparse: ProfileCallback: {self.error}; training goes on", RuntimeWarning, stacklevel=3)

    def _export(self, profiler: Any) -> None:
        """``on_trace_ready``: the trace written, or a warning (an ``out_dir`` that is a file, read-only or full)."""
        try:
            self._export_trace(profiler)
        except Exception as exc:  # noqa: BLE001 - whatever stops the trace, training goes on
            self._drop_raw()
            self.trace_path, self.files = None, []
            self._warn(f"no trace written into {self.out_dir}", exc)

    def _export_trace(self, profiler: Any) -> None:
        """The Chrome trace exported into a temporary folder of ``out_dir``; placed now unless it waits for the
        steps after it to be timed."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.name = self.free_name()
        self.trace_path = self.out_dir / f"{self.name}{OUTPUT_SUFFIXES[0]}"
        self._raw = Path(tempfile.mkdtemp(dir=self.out_dir, prefix=".profparse-")) / "trace.json"
        profiler.export_chrome_trace(str(self._raw))
        if not self._pending:
            self._place_trace()

    def _place_trace(self) -> None:
        """The exported trace with its calibration, gzipped into place atomically (no half file under the name);
        the temporary folder removed whatever happens."""
        raw, trace = self._raw, self.trace_path
        assert raw is not None and trace is not None
        try:
            store(raw, self._found())
            with atomic_file(trace) as tmp, open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        finally:
            self._drop_raw()
        self.files = [trace]

    def _drop_raw(self) -> None:
        if self._raw is not None:
            shutil.rmtree(self._raw.parent, ignore_errors=True)
            self._raw = None

    def _finish(self) -> None:
        profiler, self.profiler = self.profiler, None
        try:
            profiler.stop()  # after the last scheduled step the recording already ended; this releases the profiler
        finally:
            self._unwrap_trainer()
        if self._pending:  # the steps after are timed from here
            cuda_sync()
            self._mark = time.perf_counter_ns()
        else:
            self._outputs()

    def _outputs(self) -> None:
        """The summary and the report of the placed trace, or a warning."""
        if self.trace_path is not None:
            try:
                self._write_outputs(self.trace_path)
            except Exception as exc:  # noqa: BLE001 - the trace is kept; training goes on
                self._warn(f"{self.trace_path}: summary or report not written", exc)

    def _write_outputs(self, trace: Path) -> None:
        """The summary and the report beside the trace, and one line saying where they are."""
        import profparse
        from profparse.outputs.report import trace_payload, write_report
        from profparse.outputs.summary import render_summary

        parsed = profparse.parse(trace)
        summary = trace.with_name(self.name + OUTPUT_SUFFIXES[1])
        with atomic_file(summary, inputs=[str(trace)]) as tmp:
            tmp.write_text(render_summary(parsed), encoding="utf-8")
        self.files.append(summary)
        payload = trace_payload(parsed)
        if self.report:
            report = trace.with_name(self.name + OUTPUT_SUFFIXES[2])
            write_report(payload, report, inputs=[str(trace)])
            self.files.append(report)
        if not self.quiet:
            say(headline_line(self.files, payload["headline"]))


def say(line: str) -> None:
    """``line`` on stderr on a line of its own: through tqdm where it is loaded (the Trainer's progress bar is
    cleared and redrawn around it), else printed."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None and hasattr(tqdm, "tqdm"):
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def headline_line(files: list[Path], headline: list[dict[str, Any]]) -> str:
    """``profparse: DIR/{a,b,c}; step time ..., biggest stage ...[; top finding ...]`` (the report's own headline
    items)."""
    items = {item["key"]: item for item in headline}
    names = ",".join(path.name for path in files)
    step, stage = items["step_time"], items["biggest_stage"]
    finding = f"; top finding {items['top_finding']['text']}" if "top_finding" in items else ""
    return (
        f"profparse: {files[0].parent}/{{{names}}}; step time {step['text']} ({step['detail']}); "
        f"biggest stage {stage['text']} ({stage['detail']}){finding}"
    )
