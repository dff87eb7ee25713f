"""Many ranks: a folder of per-rank traces -> one Parquet dataset partitioned by rank, and stragglers per stage.

Library API (the ``parse DIR`` and ``summarize DIR`` verbs are thin over it)::

    from profparse import ranks
    run = ranks.parse_ranks("traces/", "out/", jobs=4)      # or scheduler="tcp://host:8786"
    run.failed                                               # ranks that could not be read (the others are written)
    kernels = ranks.read_table("out/", "kernels")            # one DataFrame, ``rank`` column from the partitions
    data = ranks.ranks_summary_data(run.results)             # per stage: time on each rank, slowest rank, lead

Layout written (hive style, readable by ``pyarrow.dataset``, ``pd.read_parquet(out / "kernels")`` and DuckDB)::

    out/<table>/rank=<r>/part-0.parquet    every table a single-trace ``parse`` writes (events, kernels, ops, ...)
    out/ranks/part-0.parquet               one row per input file: rank, rank_source, file, status, error, ...
    out/failed_ranks/part-0.parquet        the failed rows of ``ranks`` (empty when every rank was read)

Each rank is parsed by one task (in this process, in local worker processes, or on a Dask cluster) that writes its
own partition files into the temporary output folder; the folder is renamed into place when every task is done.
Rank numbers come from ``distributedInfo.rank``, else the file name (``rank-3``, ``rank3``, ``worker3``), else the
sorted position; they are integers, so no path is ever made from trace text.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import traceback
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.errors import (
    OUTPUT_EXIT_CODES,
    InputNotFoundError,
    ProfparseError,
    TraceFormatError,
    UsageError,
    error_for_code,
    from_oserror,
    install_hint,
)
from profparse.marks import STAGES
from profparse.outputs.formats import display, md_cell, md_code, render_as
from profparse.outputs.formats import text_table as _table

PLAIN_TABLES = ("ranks", "failed_ranks")  # one file each, not partitioned
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
RANK_SOURCES = ("distributedInfo", "file name", "sorted position")
RANK_FROM = {
    "auto": ("distributedInfo", "file name"),
    "name": ("file name",),
    "position": (),
}
METRICS = {
    "host_wall": ("host_wall_ns", "host wall"),
    "host_ops": ("host_op_ns", "host ops"),
    "gpu_time": ("gpu_time_ns", "GPU time"),
    "gpu_busy": ("gpu_busy_ns", "GPU busy"),
    "gpu_idle": ("gpu_idle_ns", "GPU idle"),
}
DEFAULT_METRIC = "host_wall"
TRACE_SUFFIXES = (".json", ".json.gz")
SKIP_NAMES = {"manifest.json"}  # written next to trace.json.gz by ``profparse capture``
PEEK_BYTES = 1 << 20

_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)
_EVENTS_KEY = b'"traceEvents"'
_DIST_INFO = re.compile(r'"distributedInfo"\s*:\s*(?=\{)')
_WORKER_NAME = re.compile(r"(?:^|[^a-z])worker[-_.]?(\d{1,9})(?!\d)", re.IGNORECASE)


# -- finding the rank files and their ranks ------------------------------------------------------------------


def _natural_key(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name))


def find_rank_files(folder: str | Path) -> list[Path]:
    """The trace files (``*.json``, ``*.json.gz``) directly in ``folder``, in natural sort order."""
    folder = Path(folder)
    if not folder.exists():
        raise InputNotFoundError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise InputNotFoundError(f"{folder}: not a folder")
    try:
        entries = list(folder.iterdir())
    except OSError as exc:
        raise InputNotFoundError(f"{folder}: cannot list ({exc.strerror})") from None
    files = [
        p
        for p in entries
        if p.name.lower().endswith(TRACE_SUFFIXES)
        and not p.name.startswith(".")
        and p.name not in SKIP_NAMES
        and p.is_file()
    ]
    if not files:
        raise InputNotFoundError(f"{folder}: no trace files (*.json, *.json.gz) in this folder")
    return sorted(files, key=lambda p: _natural_key(p.name))


def rank_from_name(name: str) -> int | None:
    """The rank a file name states (``rank-3.…``, ``rank3``, ``trace_rank_3``, ``worker3``), else None."""
    for pattern in (_RANK_NAME, _WORKER_NAME):
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def _valid_rank(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    value = int(value)
    return value if 0 <= value < 1 << 31 else None


def peek_rank(path: str | Path) -> int | None:
    """``distributedInfo.rank`` from the header before ``traceEvents`` (reads at most 1 MB), else None.

    Reads in small blocks so that a file cut short or corrupt further on still yields its header; a file that
    cannot be read at all returns None here, and its task reports the error.
    """
    from profparse.trace.decode import open_trace

    buf = b""
    try:
        with open_trace(path) as stream:
            read = getattr(stream, "read1", stream.read)
            while len(buf) < PEEK_BYTES and _EVENTS_KEY not in buf:
                block = read(64 << 10)
                if not block:
                    break
                buf += block
    except (ProfparseError, OSError, EOFError, zlib.error):
        pass
    return _header_rank(buf)


def _header_rank(buf: bytes) -> int | None:
    head = buf.split(_EVENTS_KEY, 1)[0].decode("utf-8", errors="replace")
    match = _DIST_INFO.search(head)
    if not match:
        return None
    try:
        info, _ = json.JSONDecoder().raw_decode(head, match.end())
    except ValueError:
        return None
    return _valid_rank(info.get("rank")) if isinstance(info, dict) else None


@dataclass(frozen=True)
class RankFile:
    """One input file and the rank it was given (``source``: distributedInfo, file name or sorted position)."""

    path: str
    rank: int
    source: str


def assign_ranks(paths: Sequence[str | Path], rank_from: str = "auto") -> list[RankFile]:
    """Give each file a rank: from ``distributedInfo``, else its name, else the lowest rank left, in sorted order.

    ``rank_from``: ``auto`` (that order), ``name`` (ignore ``distributedInfo``) or ``position`` (sorted position
    only). Two files that state the same rank are an error: renumber them with ``rank_from="position"``.
    """
    if rank_from not in RANK_FROM:
        raise UsageError(f"unknown rank source {rank_from!r}; expected one of {', '.join(RANK_FROM)}")
    sources = RANK_FROM[rank_from]
    stated: list[tuple[int, str] | None] = []
    for path in paths:
        found = None
        for source in sources:
            rank = peek_rank(path) if source == "distributedInfo" else rank_from_name(Path(path).name)
            if rank is not None:
                found = (rank, source)
                break
        stated.append(found)
    claims: dict[int, list[str]] = {}
    for path, found in zip(paths, stated, strict=True):
        if found is not None:
            claims.setdefault(found[0], []).append(f"{Path(path).name} ({found[1]})")
    clashes = {rank: names for rank, names in claims.items() if len(names) > 1}
    if clashes:
        rank, names = min(clashes.items())
        more = f" and {len(clashes) - 1} more ranks" if len(clashes) > 1 else ""
        raise UsageError(
            f"rank {rank} is stated by {len(names)} files: {', '.join(names[:4])}{more}; "
            "use --rank-from position (or name) to number the files in sorted order"
        )
    free = (r for r in range(1 << 31) if r not in claims)
    out = []
    for path, found in zip(paths, stated, strict=True):
        rank, source = found if found is not None else (next(free), "sorted position")
        out.append(RankFile(path=str(path), rank=rank, source=source))
    return out


def describe_sources(files: Sequence[RankFile]) -> str:
    """``ranks 0-3 from distributedInfo`` or ``ranks 0-4: distributedInfo 3, file name 2``."""
    ranks = sorted(f.rank for f in files)
    span = _span(ranks)
    counts = {s: sum(f.source == s for f in files) for s in RANK_SOURCES}
    used = {s: n for s, n in counts.items() if n}
    if len(used) == 1:
        return f"{span} from {next(iter(used))}"
    return f"{span}: {', '.join(f'{s} {n}' for s, n in used.items())}"


def _span(ranks: Sequence[int]) -> str:
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"ranks {shown}{', ...' if len(ranks) > 8 else ''}"


# -- one task per rank ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankTask:
    """What one worker needs: the file, its rank, where to write (None: only summarise) and the parse options."""

    path: str
    rank: int
    source: str
    out_root: str | None = None
    include_marks: bool = True
    strict: bool = False


@dataclass
class RankResult:
    """What one task reports back (small: no event data)."""

    path: str
    rank: int
    source: str
    ok: bool
    error: str | None = None
    exit_code: int = 0
    events: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stage_summary: pd.DataFrame | None = None
    seconds: float = 0.0
    header_rank: int | None = None
    devices: list[str] = field(default_factory=list)  # deviceProperties names, else GPU <id> of GPU work


def table_names() -> tuple[str, ...]:
    """The per-rank tables written for each rank: the same as a single-trace ``parse`` writes."""
    from profparse.outputs.parquet import TABLES

    return tuple(TABLES)


def partitioned_tables(out_dir: str | Path) -> list[str]:
    """The tables of a written dataset that are partitioned by rank (folders holding ``rank=<r>`` folders)."""
    root = Path(out_dir)
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name not in PLAIN_TABLES and _TABLE_NAME.fullmatch(p.name) and any(p.glob("rank=*"))
    )


def partition_dir(root: str | Path, table: str, rank: int) -> Path:
    """``root/<table>/rank=<r>``; ``rank`` must be a non-negative int (never text from a trace)."""
    rank = _valid_rank(rank)
    if rank is None or not isinstance(table, str) or not _TABLE_NAME.fullmatch(table) or table in PLAIN_TABLES:
        raise ValueError(f"bad partition {table!r} / {rank!r}")
    return Path(root) / table / f"rank={rank}"


def write_rank_tables(parsed: Any, root: str | Path, rank: int, metadata: dict[str, str] | None = None) -> dict:
    """Write every table of one parsed trace as ``root/<table>/rank=<r>/part-0.parquet``; returns row counts."""
    import pyarrow.parquet as pq

    from profparse.outputs.parquet import internal_tables, to_arrow

    frames = internal_tables(parsed)
    rows = {}
    written: list[Path] = []
    try:
        for name, frame in frames.items():
            table = to_arrow(frame)
            if metadata:
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
            folder = partition_dir(root, name, rank)
            folder.mkdir(parents=True, exist_ok=True)
            written.append(folder)
            pq.write_table(table, folder / "part-0.parquet", compression="zstd")
            rows[name] = table.num_rows
    except BaseException:
        for folder in written:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return rows


def run_rank(task: RankTask) -> RankResult:
    """Parse one rank file (and write its partitions when ``task.out_root`` is set). Never raises for bad input."""
    from profparse.api import parse
    from profparse.quality import gpu_devices

    start = time.perf_counter()
    result = RankResult(path=task.path, rank=task.rank, source=task.source, ok=False)
    try:
        parsed = parse(task.path, include_marks=task.include_marks, strict=task.strict)
        result.header_rank = parsed.rank
        result.events = int(len(parsed.raw.events))
        result.devices = gpu_devices(parsed)
        report = parsed.raw.report
        if report.truncated:
            result.notes.append(
                f"warning: truncated at byte {report.truncated_at_byte}; recovered {report.events_read} complete events"
            )
        for w in parsed.warnings.itertuples(index=False):
            if w.severity != "info" and w.check != "truncated":
                result.notes.append(f"{w.severity}: {w.message}")
        if task.source != "distributedInfo" and parsed.rank is not None and parsed.rank != task.rank:
            result.notes.append(
                f"warning: distributedInfo says rank {parsed.rank} (after the events); kept rank {task.rank} "
                f"from the {task.source}"
            )
        result.stage_summary = parsed.stage_summary
        if task.out_root is not None:
            metadata = {
                "profparse.source": str(task.path),
                "profparse.rank": str(task.rank),
                "profparse.rank_source": task.source,
            }
            try:
                result.rows = write_rank_tables(parsed, task.out_root, task.rank, metadata)
            except OSError as exc:  # the output's fault (disk full, permissions), not the rank's: see parse_ranks
                mapped = from_oserror(exc)
                raise mapped if isinstance(mapped, ProfparseError) else exc from None
        result.ok = True
    except ProfparseError as exc:
        result.error, result.exit_code = str(exc), exc.exit_code
    except MemoryError:
        result.error, result.exit_code = f"{task.path}: out of memory", 8
    except RecursionError:
        result.error, result.exit_code = f"{task.path}: nested too deeply (corrupt or hostile input)", 4
    except Exception as exc:  # noqa: BLE001 - one bad rank must not stop the others
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.error = (
            f"{task.path}: internal error: {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
        )
        result.exit_code = 70
    result.seconds = time.perf_counter() - start
    return result


# -- running the tasks: in process, local processes, Dask ---------------------------------------------------------


def _failed(task: RankTask, message: str, exit_code: int = 70) -> RankResult:
    return RankResult(path=task.path, rank=task.rank, source=task.source, ok=False, error=message, exit_code=exit_code)


def _worker_start(parent: int) -> None:
    """In each pool worker: leave Ctrl-C to the parent (it stops the pool; a worker's own KeyboardInterrupt only
    printed a traceback), and exit as soon as the parent is gone (SIGKILL, SIGTERM), rather than wait forever for
    work from it. Linux also gets the kernel's parent-death signal, for the forkserver the worker was forked from.
    """
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(parent, 0)
            except (ProcessLookupError, PermissionError):  # gone (or its pid reused by another user)
                os._exit(1)

    threading.Thread(target=watch, name="profparse-parent-watch", daemon=True).start()


DIED = "the worker process died (killed or out of memory; a script must start it under `if __name__ == '__main__':`)"


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C while the pool starts (forkserver, workers, submits) and raise it right after, where the pool
    can be stopped cleanly. A Ctrl-C in the first second otherwise broke off a worker's start half-way (the
    worker, unknown to the pool, then printed a traceback) or reached the forkserver (:func:`_start_forkserver`).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _start_forkserver() -> None:
    """Start the forkserver ignoring Ctrl-C, a setting it inherits: it imports profparse before it sets its own
    handlers, so a Ctrl-C then printed a traceback from it."""
    import signal
    import threading
    from multiprocessing import forkserver, resource_tracker

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    resource_tracker.ensure_running()  # first: it unblocks Ctrl-C itself after starting, which would drop one below
    # held as well as ignored here: Linux keeps a held signal pending even while it is ignored, so a Ctrl-C in
    # this window reaches the handler put back below instead of being lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _stop(pool: Any) -> None:
    """Shut a process pool down at once: pending ranks cancelled, running workers killed."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # no public way to reach them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.kill()
    for process in workers:
        process.join(5)


def _run_local(
    tasks: list[RankTask],
    jobs: int,
    on_done: Callable[[RankResult], None],
    fn: Callable[[RankTask], RankResult] = run_rank,
) -> list[RankResult]:
    if jobs <= 1 or len(tasks) <= 1:
        results = []
        for task in tasks:
            results.append(fn(task))
            on_done(results[-1])
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # forkserver: workers start from a clean process (no inherited threads), with profparse imported once
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["profparse.ranks", "profparse.api", "profparse.outputs.parquet"])
    results: dict[int, RankResult] = {}
    broken: list[int] = []
    start = {"mp_context": context, "initializer": _worker_start, "initargs": (os.getpid(),)}
    pool = None
    try:
        with _ctrl_c_held():
            _start_forkserver()
            pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), **start)
            futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except BrokenProcessPool:
                broken.append(i)
                continue
            except Exception as exc:  # noqa: BLE001
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {type(exc).__name__}: {exc}")
            on_done(results[i])
    except BaseException:  # Ctrl-C or an error here: stop the workers now rather than wait for their ranks
        if pool is not None:
            _stop(pool)
        raise
    pool.shutdown()
    # A dead worker takes the pool down with every rank it still held: run those again one by one, each in its own
    # process, so that only a rank that kills its process again fails.
    for i in sorted(broken):
        with ProcessPoolExecutor(max_workers=1, **start) as solo:
            try:
                results[i] = solo.submit(fn, tasks[i]).result()
            except BrokenProcessPool:
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {DIED}", 8)
            except Exception as exc:  # noqa: BLE001
                results[i] = _failed(tasks[i], f"{tasks[i].path}: {type(exc).__name__}: {exc}")
        on_done(results[i])
    return [results[i] for i in range(len(tasks))]


def _run_dask(tasks: list[RankTask], scheduler: str, on_done: Callable[[RankResult], None]) -> list[RankResult]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UsageError(
            f"--scheduler needs dask.distributed: {install_hint('dask')} (here and on the workers)"
        ) from None
    try:
        client = Client(scheduler, timeout="20s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ProfparseError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    results: dict[int, RankResult] = {}
    try:
        run_id = uuid.uuid4().hex[:12]
        keys = [f"profparse-rank-{t.rank}-{run_id}" for t in tasks]
        futures = client.map(run_rank, tasks, pure=False, retries=0, key=keys)
        index = {f.key: i for i, f in enumerate(futures)}
        for future in as_completed(futures, loop=client.loop):
            i = index[future.key]
            try:
                results[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker fails its rank only
                results[i] = _failed(tasks[i], f"{tasks[i].path}: Dask task failed: {type(exc).__name__}: {exc}")
            on_done(results[i])
    finally:
        client.close()
    return [results[i] for i in range(len(tasks))]


def run_tasks(
    tasks: list[RankTask],
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    on_done: Callable[[RankResult], None] | None = None,
) -> list[RankResult]:
    """Run one :func:`run_rank` per task: on the Dask ``scheduler`` if given, else ``jobs`` local processes."""
    on_done = on_done or (lambda result: None)
    if scheduler:
        return _run_dask(tasks, scheduler, on_done)
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {jobs})")
    return _run_local(tasks, jobs, on_done)


# -- the dataset -------------------------------------------------------------------------------------------------


RANKS_COLUMNS = ("rank", "rank_source", "file", "status", "error", "exit_code", "events", "seconds")


def ranks_table(results: Iterable[RankResult]) -> pd.DataFrame:
    """One row per input file: its rank, where the rank came from, ok/failed and why."""
    rows = [
        {
            "rank": r.rank,
            "rank_source": r.source,
            "file": r.path,
            "status": "ok" if r.ok else "failed",
            "error": r.error,
            "exit_code": r.exit_code,
            "events": r.events,
            "seconds": round(r.seconds, 3),
        }
        for r in sorted(results, key=lambda r: r.rank)
    ]
    return pd.DataFrame(rows, columns=list(RANKS_COLUMNS))


def _write_plain(frame: pd.DataFrame, folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("rank", pa.int64()),
            ("rank_source", pa.string()),
            ("file", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("exit_code", pa.int64()),
            ("events", pa.int64()),
            ("seconds", pa.float64()),
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, folder / "part-0.parquet")


def _conform(table: Any, schema: Any) -> Any:
    import pyarrow as pa

    columns = [
        table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema
    ]
    return pa.table(columns, schema=schema.with_metadata(table.schema.metadata))


def unify_partitions(root: str | Path) -> list[str]:
    """Give every partition of a table the same schema (an all-null column in one rank is typed like the others).

    Readers take the schema of one file and cast the others to it, so a ``null``-typed column in the first file
    would make the whole table unreadable. Returns the tables that had to be rewritten.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    fixed = []
    for name in partitioned_tables(root):
        parts = sorted((Path(root) / name).glob("rank=*/part-0.parquet"))
        schemas = [pq.read_schema(p).remove_metadata() for p in parts]
        if len(parts) < 2 or all(s.equals(schemas[0]) for s in schemas[1:]):
            continue
        try:
            unified = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue
        for part, schema in zip(parts, schemas, strict=True):
            if schema.equals(unified):
                continue
            table = _conform(pq.read_table(part), unified)
            tmp = part.with_name(".part-0.parquet.partial")
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, part)
        fixed.append(name)
    return fixed


@dataclass
class RanksRun:
    """The outcome of :func:`parse_ranks`: one result per input file (ok or failed), and the output folder."""

    folder: str
    files: list[RankFile]
    results: list[RankResult]
    out: Path | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> list[RankResult]:
        return [r for r in self.results if r.ok]

    @property
    def table(self) -> pd.DataFrame:
        return ranks_table(self.results)


def _tasks(files: Sequence[RankFile], out_root: Path | None, include_marks: bool, strict: bool) -> list[RankTask]:
    root = str(out_root.resolve()) if out_root is not None else None
    return [
        RankTask(
            path=str(Path(f.path).resolve()),
            rank=f.rank,
            source=f.source,
            out_root=root,
            include_marks=include_marks,
            strict=strict,
        )
        for f in files
    ]


def _display_paths(files: Sequence[RankFile], results: list[RankResult]) -> None:
    for f, r in zip(files, results, strict=True):
        r.path = f.path
        if r.error:
            r.error = r.error.replace(str(Path(f.path).resolve()), f.path)


def prepare(folder: str | Path, rank_from: str = "auto") -> list[RankFile]:
    """The files of ``folder`` with their ranks (see :func:`assign_ranks`)."""
    return assign_ranks(find_rank_files(folder), rank_from)


def parse_ranks(
    folder: str | Path,
    out_dir: str | Path | None,
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    force: bool = False,
    include_marks: bool = True,
    strict: bool = False,
    rank_from: str = "auto",
    files: Sequence[RankFile] | None = None,
    on_done: Callable[[RankResult], None] | None = None,
) -> RanksRun:
    """Parse every rank trace of ``folder``; with ``out_dir``, write the partitioned dataset there (atomically).

    Failed ranks do not stop the others: they are listed in ``RanksRun.failed`` and in the ``failed_ranks`` table,
    and the ranks that were read are written complete. Raises only when no rank at all could be read (nothing is
    written then) or for bad requests (folder not found, output exists without ``force``, ranks stated twice).
    """
    from profparse.outputs.files import atomic_dir

    start = time.perf_counter()
    files = list(files) if files is not None else prepare(folder, rank_from)
    if out_dir is None:
        results = run_tasks(_tasks(files, None, include_marks, strict), jobs=jobs, scheduler=scheduler, on_done=on_done)
        _display_paths(files, results)
        _raise_if_none_read(folder, results)
        return RanksRun(str(folder), files, results, None, time.perf_counter() - start)
    out = Path(out_dir)
    with atomic_dir(out, force=force, verb="parse", inputs=[folder]) as tmp:
        tasks = _tasks(files, tmp, include_marks, strict)
        results = run_tasks(tasks, jobs=jobs, scheduler=scheduler, on_done=on_done)
        _display_paths(files, results)
        _raise_if_output_failed(results)
        _raise_if_none_read(folder, results)
        for r in results:  # a failed task removes what it wrote; make sure no half partition stays
            if not r.ok:
                for name in table_names():
                    shutil.rmtree(partition_dir(tmp, name, r.rank), ignore_errors=True)
        unify_partitions(tmp)
        table = ranks_table(results)
        _write_plain(table, tmp / "ranks")
        _write_plain(table[table["status"] != "ok"], tmp / "failed_ranks")
    return RanksRun(str(folder), files, results, out, time.perf_counter() - start)


def _raise_if_output_failed(results: list[RankResult]) -> None:
    """A rank that could not write its partitions (disk full, ...) fails the whole run: nothing is kept."""
    for r in results:
        if r.exit_code in OUTPUT_EXIT_CODES:
            raise error_for_code(r.exit_code, r.error or "cannot write the output")


def _raise_if_none_read(folder: str | Path, results: list[RankResult]) -> None:
    """No rank read: one error whose exit code is the ranks' own when they agree (8 when all ran out of memory),
    else 4."""
    if results and not any(r.ok for r in results):
        first = results[0]
        error = TraceFormatError(
            f"{folder}: none of the {len(results)} rank traces could be read (rank {first.rank}: {first.error})"
        )
        codes = {r.exit_code for r in results}
        if len(codes) == 1 and None not in codes:
            error.exit_code = int(codes.pop())
        raise error


def read_table(out_dir: str | Path, table: str) -> pd.DataFrame:
    """One table of a dataset written by :func:`parse_ranks`, all ranks, with an int ``rank`` column, by rank.

    A folder that only looks like such a dataset (files that are not Parquet, a table without ``rank``
    partitions) is a :class:`~profparse.errors.TraceFormatError` (exit 4), not an Arrow error."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    folder = Path(out_dir) / table
    if not _TABLE_NAME.fullmatch(table) or not folder.is_dir():
        raise InputNotFoundError(f"{folder}: no such table folder")
    partitioned = table not in PLAIN_TABLES
    partitioning = "hive" if partitioned else None
    try:
        frame = (
            ds.dataset(folder, format="parquet", partitioning=partitioning)
            .to_table()
            .to_pandas(types_mapper=_nullable_ints)
        )
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise TraceFormatError(f"{folder}: not a readable profparse rank dataset table ({reason})") from None
    if partitioned and "rank" not in frame.columns:
        raise TraceFormatError(f"{folder}: not a profparse rank dataset table (no rank=N partitions)")
    if partitioned:
        frame["rank"] = frame["rank"].astype("int64")
        frame = frame.sort_values("rank", kind="stable").reset_index(drop=True)
    return frame


def _nullable_ints(arrow_type: Any) -> Any:
    import pyarrow as pa

    return {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get(arrow_type)


def is_rank_dataset(folder: str | Path) -> bool:
    """True for a folder written by :func:`parse_ranks` (``ranks/`` and ``stage_summary/`` inside)."""
    folder = Path(folder)
    return (folder / "ranks").is_dir() and (folder / "stage_summary").is_dir()


def results_from_dataset(out_dir: str | Path) -> list[RankResult]:
    """Rebuild the per-rank results (stage summaries, failures) from a written dataset."""
    table = read_table(out_dir, "ranks")
    summary = read_table(out_dir, "stage_summary")
    missing = sorted(set(RANKS_COLUMNS) - set(table.columns)) + sorted({"scope", "stage"} - set(summary.columns))
    if missing:
        raise TraceFormatError(f"{out_dir}: not a profparse rank dataset (columns missing: {', '.join(missing)})")
    results = []
    for row in table.itertuples(index=False):
        ok = row.status == "ok"
        results.append(
            RankResult(
                path=str(row.file),
                rank=int(row.rank),
                source=str(row.rank_source),
                ok=ok,
                error=None if pd.isna(row.error) else str(row.error),
                exit_code=int(row.exit_code),
                events=int(row.events),
                seconds=float(row.seconds),
                stage_summary=summary[summary["rank"] == int(row.rank)].drop(columns="rank") if ok else None,
            )
        )
    return results


# -- stragglers ---------------------------------------------------------------------------------------------------


def per_rank_totals(results: Iterable[RankResult]) -> pd.DataFrame:
    """One row per (rank, stage) of the ranks that were read: the whole-trace stage totals."""
    frames = []
    for r in results:
        if not r.ok or r.stage_summary is None:
            continue
        totals = r.stage_summary[r.stage_summary["scope"] == "total"].drop(columns=["scope", "step"])
        frames.append(totals.assign(rank=r.rank))
    if not frames:
        return pd.DataFrame(columns=["rank", "stage"])
    out = pd.concat(frames, ignore_index=True)
    out["stage"] = pd.Categorical(out["stage"].astype(str), categories=list(STAGES))
    columns = ["rank", "stage"] + [c for c in out.columns if c not in ("rank", "stage")]
    return out[columns].sort_values(["rank", "stage"], kind="stable").reset_index(drop=True)


def stragglers(per_rank: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Per stage: median, fastest and slowest rank, and the slowest rank's lead over the median (ns and share).

    Ties go to the lowest rank; a stage where every rank has 0 has no slowest rank.
    """
    column = METRICS[metric][0]
    rows = []
    for stage in STAGES:
        part = per_rank[per_rank["stage"] == stage].sort_values("rank", kind="stable")
        values = part[column].astype("int64").to_numpy() if len(part) else np.array([], dtype=np.int64)
        if not len(values):
            continue
        median = int(round(float(np.median(values))))  # whole ns: an even count can fall between two values
        slow = int(np.argmax(values))
        fast = int(np.argmin(values))
        top = int(values[slow])
        lead = top - median
        rows.append(
            {
                "stage": stage,
                "ranks": int(len(values)),
                "median_ns": median,
                "min_ns": int(values[fast]),
                "fastest_rank": int(part["rank"].iloc[fast]) if top > 0 else None,
                "max_ns": top,
                "slowest_rank": int(part["rank"].iloc[slow]) if top > 0 else None,
                "lead_ns": lead,
                "lead_share": (lead / median) if median > 0 else None,
            }
        )
    frame = pd.DataFrame(
        rows,
        columns=[
            "stage",
            "ranks",
            "median_ns",
            "min_ns",
            "fastest_rank",
            "max_ns",
            "slowest_rank",
            "lead_ns",
            "lead_share",
        ],
    )
    for column in ("fastest_rank", "slowest_rank"):
        frame[column] = frame[column].astype("Int64")
    return frame


# -- the multi-rank summary: data, then renderers -------------------------------------------------------------


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def ranks_summary_data(
    results: Sequence[RankResult], metric: str = DEFAULT_METRIC, folder: str | Path | None = None
) -> dict[str, Any]:
    """Everything the multi-rank summary shows, as plain JSON-ready data."""
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    per_rank = per_rank_totals(results)
    table = stragglers(per_rank, metric)
    files = [RankFile(r.path, r.rank, r.source) for r in results]
    return {
        "folder": str(folder) if folder is not None else None,
        "metric": metric,
        "metric_column": METRICS[metric][0],
        "ranks": [
            {
                "rank": r.rank,
                "rank_source": r.source,
                "file": r.path,
                "status": "ok" if r.ok else "failed",
                "events": r.events,
                "devices": r.devices,
            }
            for r in sorted(results, key=lambda r: r.rank)
        ],  # fmt: skip
        "rank_sources": describe_sources(files),
        "per_rank": [
            {k: (str(v) if k == "stage" else _plain(v)) for k, v in row.items()} for row in per_rank.to_dict("records")
        ],
        "stragglers": [{k: _plain(v) for k, v in row.items()} for row in table.to_dict("records")],
        "failed_ranks": [
            {"rank": r.rank, "file": r.path, "error": r.error, "exit_code": r.exit_code}
            for r in sorted(results, key=lambda r: r.rank)
            if not r.ok
        ],
    }


def _ms(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def _pct(share: Any) -> str:
    return "-" if share is None else f"{share:+.1%}"


def _matrix(data: dict[str, Any]) -> tuple[list[int], dict[tuple[int, str], Any]]:
    column = data["metric_column"]
    cells = {(row["rank"], row["stage"]): row[column] for row in data["per_rank"]}
    ranks = sorted({row["rank"] for row in data["per_rank"]})
    return ranks, cells


def _straggler_rows(data: dict[str, Any]) -> list[list[str]]:
    return [
        [
            s["stage"],
            _ms(s["median_ns"]),
            _ms(s["min_ns"]),
            _ms(s["max_ns"]),
            "-" if s["slowest_rank"] is None else str(s["slowest_rank"]),
            _ms(s["lead_ns"]),
            _pct(s["lead_share"]),
        ]
        for s in data["stragglers"]
    ]


def _devices_line(ranks: list[dict[str, Any]]) -> str:
    """The devices the ranks ran on: ``NVIDIA A100 x 8 ranks``, or ``no GPU`` when no rank ran GPU work."""
    read = [r for r in ranks if r["status"] == "ok"]
    counts: dict[str, int] = {}
    for r in read:
        for name in sorted(set(r["devices"])):
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "no GPU"
    return ", ".join(f"{display(name)} ({n} of {len(read)} ranks)" for name, n in sorted(counts.items()))


STRAGGLER_HEADERS = ["stage", "median", "fastest", "slowest", "slowest rank", "lead", "lead %"]


def render_ranks_text(data: dict[str, Any]) -> str:
    label = METRICS[data["metric"]][1]
    n_ok = sum(r["status"] == "ok" for r in data["ranks"])
    failed = len(data["failed_ranks"])
    lines = [
        f"profparse ranks summary: {display(data['folder'])}",
        f"  {len(data['ranks'])} rank traces ({display(data['rank_sources'])}), {n_ok} read, {failed} failed",
        f"  devices: {_devices_line(data['ranks'])}",
        "",
        f"{label[0].upper()}{label[1:]} per rank and stage (ms)",
    ]
    ranks, cells = _matrix(data)
    rows = [[str(r)] + [_ms(cells.get((r, s))) for s in STAGES] for r in ranks]
    lines.append(_table(["rank", *STAGES], rows))
    lines += ["", f"Stragglers per stage ({label}, ms; lead = slowest rank minus the median)"]
    lines.append(_table(STRAGGLER_HEADERS, _straggler_rows(data)))
    if data["failed_ranks"]:
        lines += ["", "Failed ranks (not in the tables above)"]
        lines += [f"  rank {f['rank']}: {display(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


def render_ranks_markdown(data: dict[str, Any]) -> str:
    label = METRICS[data["metric"]][1]
    folder = Path(data["folder"]).name if data["folder"] else "ranks"
    sources = md_cell(data["rank_sources"])
    lines = [f"# profparse ranks summary: {md_code(folder)}", "", f"{len(data['ranks'])} ranks ({sources}).", ""]
    lines += [f"## {label[0].upper()}{label[1:]} per rank and stage (ms)", ""]
    lines.append("| rank | " + " | ".join(STAGES) + " |")
    lines.append("|" + "---|" * (len(STAGES) + 1))
    ranks, cells = _matrix(data)
    for r in ranks:
        lines.append(f"| {r} | " + " | ".join(_ms(cells.get((r, s))) for s in STAGES) + " |")
    lines += ["", f"## Stragglers per stage ({label}, ms)", ""]
    lines.append("| " + " | ".join(STRAGGLER_HEADERS) + " |")
    lines.append("|" + "---|" * len(STRAGGLER_HEADERS))
    for row in _straggler_rows(data):
        lines.append("| " + " | ".join(row) + " |")
    if data["failed_ranks"]:
        lines += ["", "## Failed ranks", ""]
        lines += [f"- rank {f['rank']}: {md_code(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


def render_ranks_csv(data: dict[str, Any]) -> str:
    """One row per (stage, rank): the metric, the stage median, this rank's lead over it, and the slowest flag."""
    column = data["metric_column"]
    by_stage = {s["stage"]: s for s in data["stragglers"]}
    rows = []
    for row in data["per_rank"]:
        s = by_stage.get(row["stage"], {})
        median = s.get("median_ns")
        rows.append(
            {
                "stage": row["stage"],
                "rank": row["rank"],
                column: row[column],
                "stage_median_ns": median,
                "lead_over_median_ns": None if median is None else row[column] - median,
                "slowest": s.get("slowest_rank") == row["rank"],
            }
        )
    frame = pd.DataFrame(rows, columns=["stage", "rank", column, "stage_median_ns", "lead_over_median_ns", "slowest"])
    if len(frame):
        frame["stage"] = pd.Categorical(frame["stage"], categories=list(STAGES))
        frame = frame.sort_values(["stage", "rank"], kind="stable")
    return frame.to_csv(index=False)


def render_ranks(data: dict[str, Any], fmt: str = "text") -> str:
    renderers = {"text": render_ranks_text, "markdown": render_ranks_markdown, "csv": render_ranks_csv}
    return render_as(data, fmt, renderers)
