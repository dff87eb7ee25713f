"""``profparse.on_trace_ready(DIR)``: a drop-in for ``torch.profiler.tensorboard_trace_handler`` that also says
where the step's time went.

Each profiling cycle gets a folder ``DIR/step-N/`` (N: the profiler's step number when the cycle ended, the same on
every rank) holding ``NAME.pt.trace.json.gz``, ``NAME.summary.txt`` and, with ``report=True``, ``NAME.report.html``;
NAME is ``rankR`` under ``torch.distributed`` (so ``profparse summarize DIR/step-N`` reads the ranks), else
``HOST_PID`` as torch's handler names it. One line is printed per cycle: the files and the headline.

In the training loop the handler only exports the trace as plain JSON (cheaper than torch's own gzip export);
gzip, parse, summary and report run in a separate Python process by default (``background=True``), so the loop
waits no longer than it does for ``tensorboard_trace_handler(use_gzip=True)`` (docs/integrations.md, measured).
With ``calibrate=True`` (default) the few steps just after each cycle are timed without the profiler and stored in
its trace before it is analysed (:mod:`profparse.integrations.step_clock`), so the step without the profiler is
``calibrated`` (docs/without_profiler.md). This module never imports torch: the profiler object it is handed is
torch's.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profparse.base.errors import ProfparseError
from profparse.base.files import atomic_file
from profparse.integrations.step_clock import SOURCES, StepClock, calibration, store

TRACE_SUFFIX = ".pt.trace.json.gz"


@dataclass
class CycleFiles:
    """The files of one profiling cycle (``report`` None without ``report=True``) and how it went: ``status`` is
    "pending" (the worker has it), "written" (every file final) or "failed" (``error`` says why)."""

    folder: str
    trace: str
    summary: str
    report: str | None
    step: int = 0
    status: str = "pending"
    error: str | None = None

    def paths(self) -> dict[str, str | None]:
        """The four paths, what the worker is sent."""
        return {"folder": self.folder, "trace": self.trace, "summary": self.summary, "report": self.report}

    def settle(self, error: str | None) -> None:
        """Record the cycle's outcome (the first one counts: a late report of a lost cycle changes nothing)."""
        if self.status == "pending":
            self.status, self.error = ("written", None) if error is None else ("failed", error)


def distributed_rank() -> int | None:
    """This process's rank when ``torch.distributed`` is initialised (looked up only if torch is loaded), else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None


def file_stem(worker_name: str | None, rank: int | None) -> str:
    """``rankR`` (or ``WORKER_rankR``) under torch.distributed; else ``WORKER`` or torch's ``HOST_PID``."""
    if rank is not None:
        return f"rank{rank}" if not worker_name else f"{worker_name}_rank{rank}"
    return worker_name or f"{socket.gethostname()}_{os.getpid()}"


def planned_files(folder: Path, step: int, stem: str, report: bool) -> CycleFiles:
    """The names of a cycle's files in ``folder`` (nothing is created)."""
    return CycleFiles(
        folder=str(folder),
        trace=str(folder / f"{stem}{TRACE_SUFFIX}"),
        summary=str(folder / f"{stem}.summary.txt"),
        report=str(folder / f"{stem}.report.html") if report else None,
        step=step,
    )


def cycle_files(dir_name: str | os.PathLike[str], step: int, stem: str, report: bool) -> CycleFiles:
    """Where this cycle's files go: ``DIR/step-N/``, or ``DIR/step-N-2/``... when that one already holds a file of
    one of this cycle's names, or is itself something other than a folder (a second profiling session in the same
    folder, or the user's file: nothing is overwritten); the folder is created."""
    base = Path(dir_name) / f"step-{step}"
    attempt = 1
    while True:
        folder = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        files = planned_files(folder, step, stem, report)
        names = (files.trace, files.summary, files.report)
        taken = os.path.lexists(folder) and not folder.is_dir()
        if not taken and not any(name is not None and os.path.lexists(name) for name in names):
            folder.mkdir(parents=True, exist_ok=True)
            return files
        attempt += 1


def gzip_into_place(json_path: Path, target: Path) -> None:
    """Compress ``json_path`` (the export this handler made) to ``target`` atomically, never over an existing file,
    then remove the plain JSON. Level 6: a fifth of level 9's time for a file about 5% larger."""
    with atomic_file(target) as tmp, open(json_path, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    json_path.unlink(missing_ok=True)  # only once the trace is in place: a failure keeps the plain export


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` atomically, never over an existing file."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def headline_line(files: CycleFiles, summary: dict[str, Any]) -> str:
    """The one line a cycle prints: its files, the step time, the biggest stage and the top finding if any, else
    the top warning if any (the report headline's last item)."""
    from profparse.outputs.report.headline import biggest_stage, step_time, what_to_change

    step, stage, last = step_time(summary), biggest_stage(summary), what_to_change(summary)
    kinds = ["trace", "summary.txt"] + (["report.html"] if files.report else [])
    stem = Path(files.trace).name[: -len(TRACE_SUFFIX)]
    line = f"profparse: {Path(files.folder) / stem}.* ({', '.join(kinds)}): step time {step['text']}"
    line += f", {step['detail']}; biggest stage {stage['text']}: {stage['detail']}"
    if last["key"] == "top_finding":
        line += f"; top finding {last['text']}"
    elif last["value"] in ("error", "warning"):
        line += f"; {last['text']}"
    return line


def finish_cycle(json_path: str, files: CycleFiles) -> str:
    """Everything after the export: gzip the trace into place, parse it (through the cache, so a later
    ``profparse summarize`` of the file reads no JSON), write the summary and the report; returns the line."""
    from profparse.api import load
    from profparse.base.formats import plain
    from profparse.outputs.summary import render, summary_data
    from profparse.trace.kinds import NULL

    gzip_into_place(Path(json_path), Path(files.trace))
    parsed = load(files.trace, notify=lambda message: None)
    data = summary_data(parsed)
    write_text(Path(files.summary), render(data, "text"))
    if files.report:
        from profparse.outputs.report import trace_payload, write_report

        write_report(trace_payload(parsed), files.report, inputs=[files.trace])
    return headline_line(files, plain(data, null=NULL))


def cycle_error(json_path: str, files: CycleFiles, quiet: bool) -> str | None:
    """:func:`finish_cycle` with its one line printed; None, or why the cycle failed (also one line on stderr):
    nothing one cycle raises reaches the training loop or ends the worker."""
    try:
        line = finish_cycle(json_path, files)
    except Exception as exc:  # noqa: BLE001 - any failure of a cycle is that cycle's, never the loop's
        reason = str(exc) if isinstance(exc, (ProfparseError, OSError)) else f"{type(exc).__name__}: {exc}"
        print(f"profparse: {files.trace}: not analysed: {reason}", file=sys.stderr, flush=True)
        return reason
    if not quiet:
        print(line, flush=True)
    return None


def run_cycle(json_path: str, files: CycleFiles, quiet: bool) -> int:
    """:func:`cycle_error` as a status: 0, or 1 after a failure."""
    return 0 if cycle_error(json_path, files, quiet) is None else 1


def loop_folder() -> str:
    """The training loop's working folder, or an OSError that says it was removed."""
    try:
        return os.getcwd()
    except OSError as exc:
        raise OSError(exc.errno, "the working folder was removed and the output folder is relative") from exc


def worker_pythonpath(pythonpath: str) -> str:
    """The worker's PYTHONPATH: this profparse's folder first, then the loop's entries made absolute (a starting
    Python makes each entry absolute and dies when an empty or relative one meets a removed working folder)."""
    entries = [str(Path(__file__).resolve().parents[2])]
    for entry in filter(None, pythonpath.split(os.pathsep)):
        try:
            entries.append(os.path.abspath(entry))
        except OSError:  # relative to a removed working folder: nothing to find there
            continue
    return os.pathsep.join(entries)


class Worker:
    """One background Python (never a fork of the training process; it pays the imports once) and the cycles it
    was sent; a thread reads the one result line it writes per cycle. It finds this profparse even when it was not
    installed (its folder leads PYTHONPATH)."""

    def __init__(self, cycles: list[CycleFiles]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
        read, write = os.pipe()
        command = [sys.executable, "-m", "profparse.integrations.torch_profiler", str(write)]
        try:
            # it starts in the root folder: the loop's folder may be removed under a starting Python; a job with
            # relative paths carries its folder
            self.process = subprocess.Popen(
                command, env=env, stdin=subprocess.PIPE, text=True, encoding="utf-8", pass_fds=(write,), cwd=os.sep
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.cycles, self.sent = cycles, []
        self.reader = threading.Thread(target=self._read, args=(read,), daemon=True)
        self.reader.start()

    def _read(self, fd: int) -> None:
        with open(fd, encoding="utf-8") as results:
            for line in results:
                result = json.loads(line)
                self.cycles[result["id"]].settle(result["error"])

    def send(self, index: int, job: dict[str, Any]) -> bool:
        """Queue cycle ``index`` (a worker busy with an earlier cycle takes it next; the pipe holds some hundred
        cycles before the loop would wait); False when the worker is gone."""
        if not self._write(job):
            return False
        self.sent.append(index)
        return True

    def send_calibration(self, index: int, found: dict[str, Any] | None) -> bool:
        """The calibration cycle ``index`` waits for (None: there is none); False when the worker is gone."""
        return self._write({"calibration_of": index, "calibration": found})

    def _write(self, message: dict[str, Any]) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            self.process.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
        except OSError:  # BrokenPipeError: it died (the OOM killer, a signal)
            return False
        return True

    def close(self) -> None:
        """No more cycles: the worker finishes those it has, then exits."""
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError:  # a dead worker's pipe still held an unsent line
            pass

    def join(self, timeout: float | None) -> list[CycleFiles]:
        """Wait for the worker to exit (``subprocess.TimeoutExpired`` after ``timeout``); the cycles it was sent and
        never finished are failed, and returned."""
        code = self.process.wait(timeout)
        self.reader.join(timeout=10)  # EOF once the worker is gone
        lost = [self.cycles[i] for i in self.sent if self.cycles[i].status == "pending"]
        for files in lost:
            files.settle(f"the background worker ended (exit {code}) before finishing this cycle")
        return lost


class TraceHandler:
    """The ``on_trace_ready`` callable: see the module's docstring and :func:`on_trace_ready`."""

    def __init__(
        self,
        dir_name: str | os.PathLike[str],
        *,
        report: bool = False,
        background: bool = True,
        worker_name: str | None = None,
        quiet: bool = False,
        calibrate: bool = True,
    ) -> None:
        self.dir_name, self.report, self.background = Path(dir_name), report, background
        self.worker_name, self.quiet, self.calibrate = worker_name, quiet, calibrate
        self.timed_steps: list[list[int]] = []  # each block of steps timed without the profiler (ns per step)
        self._clock: StepClock | None = None
        self._awaiting: list[int] = []  # cycles a worker holds until their calibration comes
        self._deferred: list[tuple[str, CycleFiles]] = []  # the same, analysed here (background=False)
        self.cycles: list[CycleFiles] = []
        self.export_seconds: list[float] = []  # what each call kept the training loop waiting
        self._worker: Worker | None = None
        self._closing: list[Worker] = []  # told to finish, maybe still running
        self._reported = 0  # cycles before this were counted by an earlier wait()

    def __call__(self, prof: Any) -> None:
        """One cycle; whatever goes wrong is a warning and a failed entry in ``cycles``, never an exception."""
        started, count = time.perf_counter(), len(self.cycles)
        try:
            self._cycle(prof)
        except Exception as exc:  # noqa: BLE001 - the handler never raises into the training loop
            if len(self.cycles) == count:
                step = getattr(prof, "step_num", 0)
                self.cycles.append(planned_files(self.dir_name / f"step-{step}", step, "", self.report))
            files = self.cycles[-1]
            files.settle(f"{type(exc).__name__}: {exc}")
            message = f"profparse: the cycle at step {files.step} was not analysed ({files.error}); training goes on"
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        if self._clock is not None:
            self._clock.arm()  # the step after this cycle is timed from here, the cycle's own work done
        self.export_seconds.append(time.perf_counter() - started)

    def _cycle(self, prof: Any) -> None:
        stem = file_stem(self.worker_name, distributed_rank())
        # relative paths are the loop's working folder's at this cycle; an absolute folder needs none
        cwd = None if self.dir_name.is_absolute() else loop_folder()
        files = cycle_files(self.dir_name, int(getattr(prof, "step_num", 0)), stem, self.report)
        self.cycles.append(files)
        json_path = str(Path(files.folder) / f".{stem}.{os.getpid()}.{time.time_ns()}.json")
        try:
            prof.export_chrome_trace(json_path)
        except BaseException:
            Path(json_path).unlink(missing_ok=True)  # no half export left beside the cycle's files
            raise
        awaiting = self._watch(prof)
        if self.background:
            self._send(len(self.cycles) - 1, json_path, files, cwd, awaiting)
        elif awaiting:
            self._deferred.append((json_path, files))
        else:
            files.settle(cycle_error(json_path, files, self.quiet))

    def _watch(self, prof: Any) -> bool:
        """Whether the steps after this cycle are timed (``calibrate``): the profiler's ``step``/``stop`` hooked
        from its first cycle on (a profiler without them, or any failure: no calibration)."""
        if not self.calibrate:
            return False
        if self._clock is not None and self._clock.prof is prof:
            return True
        try:
            self._clock = StepClock(prof, self._timed)
        except Exception:  # noqa: BLE001 - not a torch profiler: the cycle goes without calibration
            self._clock = None
            return False
        return True

    def _timed(self, block: list[int] | None) -> None:
        """A block of unprofiled steps was timed (None: the profiler stopped): the waiting cycles get the latest."""
        if block:
            self.timed_steps.append(block)
        if block is None:
            self._clock = None
        self._release()

    def _release(self) -> None:
        """The waiting cycles get the latest block timed (none yet: they go without) and are analysed."""
        found = calibration(self.timed_steps[-1], SOURCES[0], True) if self.timed_steps else None
        awaiting, self._awaiting = self._awaiting, []
        for index in awaiting:
            worker = self._worker
            if worker is None or index not in worker.sent or self.cycles[index].status != "pending":
                continue  # its worker is gone: it failed with it
            if not worker.send_calibration(index, found):
                self._worker = None
                self._retire(worker)
        deferred, self._deferred = self._deferred, []
        for json_path, files in deferred:
            try:
                store(json_path, found)
            except OSError:
                pass  # the trace is analysed as exported
            files.settle(cycle_error(json_path, files, self.quiet))

    def _send(self, index: int, json_path: str, files: CycleFiles, cwd: str | None, awaiting: bool = False) -> None:
        """Queue the cycle for the worker (``awaiting``: it waits for the cycle's calibration); a dead worker is
        replaced (once per cycle), and a cycle no worker takes is analysed here."""
        job = {"id": index, "json_path": json_path, "files": files.paths(), "quiet": self.quiet, "cwd": cwd}
        job["await"] = awaiting
        for _ in range(2):
            if self._worker is None:
                try:
                    self._worker = Worker(self.cycles)
                except OSError:
                    break
            if self._worker.send(index, job):
                if awaiting:
                    self._awaiting.append(index)
                return
            worker, self._worker = self._worker, None
            self._retire(worker)
        files.settle(cycle_error(json_path, files, self.quiet))

    def _retire(self, worker: Worker) -> None:
        """A worker that died: the cycles it had failed, and a warning says which."""
        worker.close()
        try:
            lost = worker.join(timeout=10)
        except subprocess.TimeoutExpired:  # not gone yet: a later wait() settles its cycles
            self._closing.append(worker)
            return
        steps = ", ".join(str(files.step) for files in lost) or "none"
        message = f"profparse: the background worker ended (exit {worker.process.returncode}); cycles not analysed "
        warnings.warn(message + f"at steps: {steps}; a new worker takes the next cycle", RuntimeWarning, stacklevel=4)

    def wait(self, timeout: float | None = None) -> int:
        """Block until every cycle so far is final (written or failed); the number of cycles that failed since the
        previous ``wait()`` that returned (``cycles`` says which and why). After ``timeout`` seconds it raises
        ``subprocess.TimeoutExpired``: the worker goes on, and a later ``wait()`` waits for it again. Cycles still
        waiting for steps to be timed after them get the latest block timed, if any."""
        self._release()
        if self._worker is not None:
            self._worker.close()  # the worker finishes what it has and exits (a later cycle starts a new one)
            self._closing.append(self._worker)
            self._worker = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._closing:
            self._closing[0].join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self._closing.pop(0)
        failed = sum(files.status == "failed" for files in self.cycles[self._reported :])
        self._reported = len(self.cycles)
        return failed


def on_trace_ready(
    dir_name: str | os.PathLike[str],
    report: bool = False,
    *,
    background: bool = True,
    worker_name: str | None = None,
    quiet: bool = False,
    calibrate: bool = True,
) -> TraceHandler:
    """A handler for ``torch.profiler.profile(on_trace_ready=...)``: per cycle the trace (``.json.gz``), its stage
    summary as text, with ``report`` the HTML report, and one printed line. ``background=False`` does the work in
    the training process (the loop waits for it); call ``handler.wait()`` before reading the files (it returns
    how many cycles failed; ``handler.cycles`` says which and why). A failure is a warning, never an exception in
    the training loop. ``calibrate`` (default): the few steps after each cycle are timed without the profiler and
    stored in its trace (docs/without_profiler.md); its analysis starts once they ran (or the profiler stopped)."""
    return TraceHandler(
        dir_name, report=report, background=background, worker_name=worker_name, quiet=quiet, calibrate=calibrate
    )


def job_error(job: dict[str, Any]) -> str | None:
    """One job of the worker: None, or why its cycle failed."""
    if job.get("cwd"):
        try:
            os.chdir(job["cwd"])
        except OSError as exc:
            return f"the training loop's working folder is gone: {exc}"
    try:
        store(job["json_path"], job.get("calibration"))
    except OSError:
        pass  # the trace is analysed as exported; its own read reports a file that is gone
    return cycle_error(job["json_path"], CycleFiles(**job["files"]), job["quiet"])


def main(argv: list[str] | None = None) -> int:
    """The background worker: ``python -m profparse.integrations.torch_profiler FD`` reads one JSON job per line on
    stdin until it closes and writes one result line per job to file descriptor FD; its exit code is the number
    of cycles that failed. A job with ``await`` waits (and the jobs after it) for its ``calibration_of`` line,
    or for stdin to close."""
    args = sys.argv[1:] if argv is None else argv
    results = open(int(args[0]), "w", encoding="utf-8") if args else None  # noqa: SIM115 - open while jobs come
    failed, queue = 0, []
    for line in itertools.chain(sys.stdin, [None]):
        message = json.loads(line) if line is not None else None
        if message is not None and "calibration_of" in message:
            for job in queue:
                if job.get("id") == message["calibration_of"]:
                    job["await"], job["calibration"] = False, message["calibration"]
        elif message is not None:
            queue.append(message)
        while queue and (message is None or not queue[0].get("await")):
            job = queue.pop(0)
            error = job_error(job)
            failed += error is not None
            if results is not None:
                results.write(json.dumps({"id": job.get("id"), "error": error}) + "\n")
                results.flush()
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
