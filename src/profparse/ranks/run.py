"""``parse_ranks``: prepare the tasks, run them, write the dataset atomically, and say what failed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from profparse.base.errors import OUTPUT_EXIT_CODES, TraceFormatError, error_for_code
from profparse.ranks import late
from profparse.ranks.dataset import (
    partition_dir,
    ranks_table,
    table_names,
    unify_partitions,
    write_matches,
    write_plain_parquet,
)
from profparse.ranks.discovery import RankFile, prepare
from profparse.ranks.results import RankResult, RankTask
from profparse.ranks.scheduling import refuse_in_pool_import, run_tasks


@dataclass
class RanksRun:
    """The outcome of :func:`parse_ranks`: one result per input file (ok or failed), and the output folder."""

    folder: str
    files: list[RankFile]
    results: list[RankResult]
    out: Path | None = None
    seconds: float = 0.0
    matches: pd.DataFrame | None = None  # collective_matches (late.match), None when not computed
    match_warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> list[RankResult]:
        return [r for r in self.results if r.ok]

    @property
    def table(self) -> pd.DataFrame:
        return ranks_table(self.results)


def _tasks(
    files: Sequence[RankFile],
    out_root: Path | None,
    include_marks: bool,
    strict: bool,
    peak_tflops: float | None,
    cache: bool = False,
    output: str | Path | None = None,
) -> list[RankTask]:
    root = str(out_root.resolve()) if out_root is not None else None
    return [
        RankTask(
            path=str(Path(f.path).resolve()),
            rank=f.rank,
            source=f.source,
            out_root=root,
            include_marks=include_marks,
            strict=strict,
            peak_tflops=peak_tflops,
            cache=cache,
            output=str(Path(output).resolve()) if output is not None else None,
        )
        for f in files
    ]


def _display_paths(files: Sequence[RankFile], results: list[RankResult]) -> None:
    for f, r in zip(files, results, strict=True):
        r.path = f.path
        if r.error:
            r.error = r.error.replace(str(Path(f.path).resolve()), f.path)


def parse_ranks(
    folder: str | Path,
    out_dir: str | Path | None,
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    force: bool = False,
    include_marks: bool = True,
    strict: bool = False,
    peak_tflops: float | None = None,
    rank_from: str = "auto",
    files: Sequence[RankFile] | None = None,
    on_done: Callable[[RankResult], None] | None = None,
    cache: bool = False,
) -> RanksRun:
    """Parse every rank trace of ``folder``; with ``out_dir``, write the partitioned dataset there (atomically).

    Failed ranks do not stop the others: they are listed in ``RanksRun.failed`` and in the ``failed_ranks`` table,
    and the ranks that were read are written complete. Raises only when no rank at all could be read (nothing is
    written then) or for bad requests (folder not found, output exists without ``force``, ranks stated twice).
    ``peak_tflops``: the peak every rank's MFU is measured against (default: its device's), as in
    :func:`profparse.parse`; it travels to the workers in each :class:`RankTask` (local processes and Dask alike).
    ``cache``: each rank goes through the user's parsed-trace cache, as :func:`profparse.load` (docs/cache.md), so
    the next verb on the same folder reads no JSON; not on a Dask cluster, whose workers' folders are not the
    user's.
    """
    from profparse.base.files import atomic_dir

    refuse_in_pool_import()  # a script without `if __name__ == '__main__':`, imported again by a pool worker
    start = time.perf_counter()
    files = list(files) if files is not None else prepare(folder, rank_from)
    cache = cache and not scheduler
    if out_dir is None:
        tasks = _tasks(files, None, include_marks, strict, peak_tflops, cache)
        results = run_tasks(tasks, jobs=jobs, scheduler=scheduler, on_done=on_done)
        _display_paths(files, results)
        raise_if_none_read(folder, results)
        matches, warnings = _match(results)
        return RanksRun(str(folder), files, results, None, time.perf_counter() - start, matches, warnings)
    out = Path(out_dir)
    with atomic_dir(out, force=force, verb="parse", inputs=[folder]) as tmp:
        tasks = _tasks(files, tmp, include_marks, strict, peak_tflops, cache, out)
        results = run_tasks(tasks, jobs=jobs, scheduler=scheduler, on_done=on_done)
        _display_paths(files, results)
        _raise_if_output_failed(results)
        raise_if_none_read(folder, results)
        for r in results:  # a failed task removes what it wrote; make sure no half partition stays
            if not r.ok:
                for name in table_names():
                    shutil.rmtree(partition_dir(tmp, name, r.rank), ignore_errors=True)
        unify_partitions(tmp)
        table = ranks_table(results)
        write_plain_parquet(table, tmp / "ranks")
        write_plain_parquet(table[table["status"] != "ok"], tmp / "failed_ranks")
        matches, warnings = _match(results)
        write_matches(matches, tmp / "collective_matches", warnings)
    return RanksRun(str(folder), files, results, out, time.perf_counter() - start, matches, warnings)


def _match(results: Sequence[RankResult]) -> tuple[pd.DataFrame, list[str]]:
    """The cross-rank match of the collective rows the rank tasks sent back (small: one row per collective)."""
    return late.match((r.rank, r.collectives) for r in results if r.ok and r.collectives is not None)


def _raise_if_output_failed(results: list[RankResult]) -> None:
    """A rank that could not write its partitions (disk full, ...) fails the whole run: nothing is kept."""
    for r in results:
        if r.exit_code in OUTPUT_EXIT_CODES:
            raise error_for_code(r.exit_code, r.error or "cannot write the output")


def raise_if_none_read(folder: str | Path, results: list[RankResult]) -> None:
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
