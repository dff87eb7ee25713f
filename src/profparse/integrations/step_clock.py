"""Training steps timed without the profiler, where profparse's handler and Trainer callback profile
(docs/without_profiler.md, "Calibration").

A few steps just outside the profiled window are timed (``perf_counter_ns`` at each step's end; on a GPU one
synchronisation at each end of the block, none inside it, so the block runs as training does) and stored as the
trace's ``profparse_calibration`` field ``unprofiled_step_ns``: the analysis then scales the profiler's cost per
event so that the step replayed without it takes as long as those steps. Nothing here imports torch, and nothing
here raises into the training loop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: unprofiled steps timed per gap between profiled windows (the first after a recording is left out of three or
#: more: it pays for the profiler's teardown, 1.5-10x a steady step of a small CPU model)
STEPS = 4
#: the calibration field's ``source`` for each integration
SOURCES = ("profparse.on_trace_ready", "profparse.ProfileCallback")


def cuda_sync() -> None:
    """Wait for the GPU where torch already uses CUDA (never initialises it); nothing on failure."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001, S110 - a timing aid: the training loop's own next call reports a broken device
        pass


def calibration(steps_ns: list[int], source: str, after_recording: bool) -> dict[str, Any]:
    """The trace's ``profparse_calibration`` for ``steps_ns`` timed by ``source``; ``after_recording``: the first
    step ran just after a recording ended (kept apart, as ``first_step_after_recording_ns``, from three steps)."""
    steps = [int(n) for n in steps_ns]
    if after_recording and len(steps) >= 3:
        return {"unprofiled_step_ns": steps[1:], "first_step_after_recording_ns": steps[0], "source": source}
    return {"unprofiled_step_ns": steps, "source": source}


def store(json_path: str | Path, found: dict[str, Any] | None) -> None:
    """``found`` added to the plain JSON trace at ``json_path`` (nothing when None)."""
    if found:
        from profparse.capture.calibrate import add_to_trace

        add_to_trace(Path(json_path), found)


def _is_idle(action: Any) -> bool:
    """Whether a ``torch.profiler.ProfilerAction`` records nothing (``NONE``)."""
    return getattr(action, "name", None) == "NONE"


class StepClock:
    """Times the unprofiled steps of a ``torch.profiler.profile`` it hooks (its ``step`` and ``stop``, on that
    instance only; ``close`` undoes it): up to :data:`STEPS` steps per gap between recordings. ``done(block)`` is
    called with each gap's block (ns per step) once it is complete (full, or a recording starts), and with None
    when the profiler stops."""

    def __init__(self, prof: Any, done: Callable[[list[int] | None], None]) -> None:
        self.prof, self.done = prof, done
        self.block: list[int] = []
        self.began: int | None = None  # when the step being timed began
        self.full = False  # this gap's block is complete
        self._step, self._stop = prof.step, prof.stop
        prof.step, prof.stop = self.step, self.stop

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The profiler's ``step()``, with the unprofiled step that ends here timed."""
        try:
            self._end_step()
        except Exception:  # noqa: BLE001, S110 - timing is never worth a failed step
            pass
        try:
            return self._step(*args, **kwargs)
        finally:
            try:
                self._begin_step()
            except Exception:  # noqa: BLE001, S110 - as above
                pass

    def stop(self, *args: Any, **kwargs: Any) -> Any:
        """The profiler's ``stop()``; then the hooks are undone and the waiting cycles released."""
        try:
            return self._stop(*args, **kwargs)
        finally:
            self.close()

    def close(self) -> None:
        """Undo the hooks (a step being timed is dropped: the loop may have ended anywhere in it); ``done(None)``."""
        for name in ("step", "stop"):
            if getattr(self.prof, name, None) == getattr(self, name):
                try:
                    delattr(self.prof, name)
                except AttributeError:
                    setattr(self.prof, name, getattr(self, f"_{name}"))
        try:
            if self.block:
                self._complete()
            self.done(None)
        except Exception:  # noqa: BLE001, S110 - stop() returns as torch's does; the cycles settle in wait()
            pass

    def arm(self) -> None:
        """Start timing now if the coming step records nothing: called at the end of the handler's cycle, which runs
        inside the ``step()`` that ended the recording (before the hook existed, at the first cycle)."""
        try:
            self._begin_step()
        except Exception:  # noqa: BLE001, S110 - timing is never worth a failed step
            pass

    def _next_idle(self) -> bool:
        """Whether the step after the one ending now records nothing (the schedule asked ahead)."""
        try:
            return _is_idle(self.prof.schedule(self.prof.step_num + 1))
        except Exception:  # noqa: BLE001 - a schedule of the user's: assume the block goes on
            return True

    def _end_step(self) -> None:
        if self.began is None:
            return
        if len(self.block) + 1 >= STEPS or not self._next_idle():
            cuda_sync()  # the block's last step: its GPU work counts
        self.block.append(time.perf_counter_ns() - self.began)
        self.began = None
        if len(self.block) >= STEPS:
            self._complete()

    def _begin_step(self) -> None:
        if not _is_idle(getattr(self.prof, "current_action", None)):
            if self.block:
                self._complete()
            self.full = False  # recording: the next gap gets its own block
            return
        if self.full:
            return
        if not self.block:
            cuda_sync()  # the block starts with the GPU idle, as the profiled window's first step did
        self.began = time.perf_counter_ns()

    def _complete(self) -> None:
        block, self.block, self.began, self.full = self.block, [], None, True
        self.done(block)
