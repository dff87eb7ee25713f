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
    out/collective_matches/part-0.parquet  one row per (collective matched across ranks, rank): waiting, transfer

Each rank is parsed by one task (in this process, in local worker processes, or on a Dask cluster) that writes its
own partition files into the temporary output folder; the folder is renamed into place when every task is done.
Rank numbers come from ``distributedInfo.rank``, else the file name (``rank-3``, ``rank3``, ``worker3``), else the
sorted position; they are integers, so no path is ever made from trace text.

One module per job: :mod:`~profparse.ranks.discovery` (files and rank numbers), :mod:`~profparse.ranks.results`
(task and result records), :mod:`~profparse.ranks.worker` (one rank task), :mod:`~profparse.ranks.scheduling`
(local processes, Dask), :mod:`~profparse.ranks.dataset` (the Parquet partitions), :mod:`~profparse.ranks.run`
(``parse_ranks``), :mod:`~profparse.ranks.stragglers`, :mod:`~profparse.ranks.late` (collectives matched across
ranks: waiting, transfer, the late rank per stage), :mod:`~profparse.ranks.render` (the multi-rank summary).
Every public name is importable from ``profparse.ranks`` itself.
"""

from profparse.ranks import late
from profparse.ranks.dataset import (
    PLAIN_TABLES,
    RANKS_COLUMNS,
    is_rank_dataset,
    partition_dir,
    partitioned_tables,
    ranks_table,
    read_matches,
    read_table,
    results_from_dataset,
    table_names,
    unify_partitions,
    write_rank_tables,
)
from profparse.ranks.discovery import (
    PEEK_BYTES,
    RANK_FROM,
    RANK_SOURCES,
    SKIP_NAMES,
    TRACE_SUFFIXES,
    RankFile,
    assign_ranks,
    describe_sources,
    find_rank_files,
    peek_rank,
    prepare,
    rank_from_name,
)
from profparse.ranks.render import (
    STRAGGLER_HEADERS,
    ranks_summary_data,
    render_ranks,
    render_ranks_csv,
    render_ranks_markdown,
    render_ranks_text,
)
from profparse.ranks.results import RankResult, RankTask
from profparse.ranks.run import RanksRun, parse_ranks, raise_if_none_read
from profparse.ranks.scheduling import DIED, FORCE_JOBS_ENV, local_workers, run_local, run_tasks
from profparse.ranks.stragglers import DEFAULT_METRIC, METRICS, per_rank_totals, stragglers
from profparse.ranks.worker import run_rank

__all__ = [
    "DEFAULT_METRIC",
    "DIED",
    "FORCE_JOBS_ENV",
    "METRICS",
    "PEEK_BYTES",
    "PLAIN_TABLES",
    "RANKS_COLUMNS",
    "RANK_FROM",
    "RANK_SOURCES",
    "SKIP_NAMES",
    "STRAGGLER_HEADERS",
    "TRACE_SUFFIXES",
    "RankFile",
    "RankResult",
    "RankTask",
    "RanksRun",
    "raise_if_none_read",
    "run_local",
    "assign_ranks",
    "describe_sources",
    "find_rank_files",
    "is_rank_dataset",
    "late",
    "local_workers",
    "parse_ranks",
    "partition_dir",
    "partitioned_tables",
    "peek_rank",
    "per_rank_totals",
    "prepare",
    "rank_from_name",
    "ranks_summary_data",
    "ranks_table",
    "read_matches",
    "read_table",
    "render_ranks",
    "render_ranks_csv",
    "render_ranks_markdown",
    "render_ranks_text",
    "results_from_dataset",
    "run_rank",
    "run_tasks",
    "stragglers",
    "table_names",
    "unify_partitions",
    "write_rank_tables",
]
