"""``profparse.on_trace_ready(DIR)``: a drop-in for ``torch.profiler.tensorboard_trace_handler`` that also says
where the step's time went.

Each profiling cycle gets a folder ``DIR/step-N/`` (N: the profiler's step number when the cycle ended, the same on
every rank) holding ``NAME.pt.trace.json.gz``, ``NAME.summary.txt`` and, with ``report=True``, ``NAME.report.html``;
NAME is ``rankR`` under ``torch.distributed`` (so ``profparse summarize DIR/step-N`` reads the ranks), else
``HOST_PID`` as torch's handler names it. One line is printed per cycle: the files and the headline.

In the training loop the handler only exports the trace as plain JSON (cheaper than torch's own gzip export);
gzip, parse, summary and report run in a separate Python process by default (``background=True``), so the loop
waits no longer than it does for ``tensorboard_trace_handler(use_gzip=True)`` (docs/integrations.md, measured).
This module never imports torch: the profiler object it is handed is torch's.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from profparse.base.errors import ProfparseError
from profparse.base.files import atomic_file

TRACE_SUFFIX = ".pt.trace.json.gz"


@dataclass(frozen=True)
class CycleFiles:
    """The files of one profiling cycle (``report`` None without ``report=True``)."""

    folder: str
    trace: str
    summary: str
    report: str | None


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


def cycle_files(dir_name: str | os.PathLike[str], step: int, stem: str, report: bool) -> CycleFiles:
    """Where this cycle's files go: ``DIR/step-N/``, or ``DIR/step-N-2/``... when that one already holds a file of
    one of this cycle's names (a second profiling session in the same folder: nothing is overwritten); the folder
    is created."""
    base = Path(dir_name) / f"step-{step}"
    attempt = 1
    while True:
        folder = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        files = CycleFiles(
            folder=str(folder),
            trace=str(folder / f"{stem}{TRACE_SUFFIX}"),
            summary=str(folder / f"{stem}.summary.txt"),
            report=str(folder / f"{stem}.report.html") if report else None,
        )
        names = (files.trace, files.summary, files.report)
        if not any(name is not None and os.path.lexists(name) for name in names):
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


def run_cycle(json_path: str, files: CycleFiles, quiet: bool) -> int:
    """:func:`finish_cycle` with its one line printed; a trace profparse cannot read is one line on stderr, never
    an exception into the training loop. Returns 0, or 1 after such a failure."""
    try:
        line = finish_cycle(json_path, files)
    except (ProfparseError, OSError) as exc:
        print(f"profparse: {files.trace}: not analysed: {exc}", file=sys.stderr, flush=True)
        return 1
    if not quiet:
        print(line, flush=True)
    return 0


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
    ) -> None:
        self.dir_name, self.report, self.background = Path(dir_name), report, background
        self.worker_name, self.quiet = worker_name, quiet
        self.cycles: list[CycleFiles] = []
        self.export_seconds: list[float] = []  # what each call kept the training loop waiting
        self._worker: subprocess.Popen | None = None
        self._failed = 0

    def __call__(self, prof: Any) -> None:
        started = time.perf_counter()
        stem = file_stem(self.worker_name, distributed_rank())
        files = cycle_files(self.dir_name, int(getattr(prof, "step_num", 0)), stem, self.report)
        json_path = str(Path(files.folder) / f".{stem}.{os.getpid()}.{time.time_ns()}.json")
        prof.export_chrome_trace(json_path)
        self.cycles.append(files)
        if self.background:
            self._send(json_path, files)
        else:
            self._failed += run_cycle(json_path, files, self.quiet)
        self.export_seconds.append(time.perf_counter() - started)

    def _send(self, json_path: str, files: CycleFiles) -> None:
        """Queue the cycle for the worker: one line on its stdin (a worker busy with an earlier cycle takes it next;
        the pipe holds some hundred cycles before the loop would wait)."""
        if self._worker is None:
            self._worker = self._start_worker()
        # the paths are as the user gave them, relative to the loop's working folder at this cycle
        job = json.dumps({"json_path": json_path, "files": asdict(files), "quiet": self.quiet, "cwd": os.getcwd()})
        self._worker.stdin.write(job + "\n")  # type: ignore[union-attr]
        self._worker.stdin.flush()  # type: ignore[union-attr]

    def _start_worker(self) -> subprocess.Popen:
        """One fresh Python per handler (never a fork of the training process; it pays the imports once), started at
        the first cycle; it finds this profparse even when it was not installed (its folder leads PYTHONPATH)."""
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "profparse.integrations.torch_profiler"]
        return subprocess.Popen(command, env=env, stdin=subprocess.PIPE, text=True, encoding="utf-8")

    def wait(self, timeout: float | None = None) -> int:
        """Let the worker finish every cycle so far and exit (a later cycle starts a new one); the number of cycles
        whose analysis failed (0: every file written)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stdin.close()  # type: ignore[union-attr]
            self._failed += worker.wait(timeout)
        failed, self._failed = self._failed, 0
        return failed


def on_trace_ready(
    dir_name: str | os.PathLike[str],
    report: bool = False,
    *,
    background: bool = True,
    worker_name: str | None = None,
    quiet: bool = False,
) -> TraceHandler:
    """A handler for ``torch.profiler.profile(on_trace_ready=...)``: per cycle the trace (``.json.gz``), its stage
    summary as text, with ``report`` the HTML report, and one printed line. ``background=False`` does the work in
    the training process (the loop waits for it); call ``handler.wait()`` before reading the files (it returns
    how many cycles failed)."""
    return TraceHandler(dir_name, report=report, background=background, worker_name=worker_name, quiet=quiet)


def main() -> int:
    """The background worker: ``python -m profparse.integrations.torch_profiler`` reads one JSON job per line on
    stdin until it closes; its exit code is the number of cycles that failed."""
    failed = 0
    for line in sys.stdin:
        job = json.loads(line)
        os.chdir(job["cwd"])
        failed += run_cycle(job["json_path"], CycleFiles(**job["files"]), job["quiet"])
    return min(failed, 125)


if __name__ == "__main__":
    sys.exit(main())
