"""``profparse parse TRACE -o DIR``: write the Parquet tables.

``profparse parse FOLDER -o DIR`` does it for a folder of rank traces: one dataset partitioned by rank
(``DIR/<table>/rank=<r>/part-0.parquet``), ranks parsed in parallel (``--jobs``) or on a Dask cluster (``--scheduler``).
A capture's run folder (one trace plus its ``manifest.json``) is that one trace.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from profparse.base.errors import OutputWriteError, PartialFailureError, UsageError
from profparse.base.formats import display
from profparse.cli.common import (
    add_input_options,
    add_peak_option,
    check_output,
    input_is_dir,
    int_option,
    note,
    output_option,
    parse_input,
    steps_bar,
)

TRACE_HELP = "a Kineto trace (.json or .json.gz), or a folder of per-rank traces"


def add_metric_option(parser: argparse.ArgumentParser) -> None:
    """``--metric`` of the verbs that compare ranks (summarize, report)."""
    from profparse.cli.choices import DEFAULT_METRIC, METRICS

    parser.add_argument(
        "--metric",
        choices=METRICS,
        default=DEFAULT_METRIC,
        help=f"for a folder of ranks: the time compared across ranks (default: {DEFAULT_METRIC})",
    )


def add_rank_options(parser: argparse.ArgumentParser) -> None:
    """Options for a folder of rank traces (ignored for a single trace)."""
    for action in parser._actions:
        if action.dest == "trace":
            action.help = TRACE_HELP
    group = parser.add_argument_group("many ranks (when TRACE is a folder of per-rank traces)")
    group.add_argument(
        "-j",
        "--jobs",
        type=int_option(1),
        default=None,
        metavar="N",
        help="ranks parsed in parallel processes (default: CPUs)",
    )
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the ranks on a Dask cluster (tcp://host:8786); workers must see the same files (docs/ranks.md)",
    )
    group.add_argument(
        "--keep-going", action="store_true", help="exit 0 even if some ranks could not be read (they are reported)"
    )
    group.add_argument(
        "--rank-from",
        choices=("auto", "name", "position"),
        default="auto",
        help="where rank numbers come from: auto = distributedInfo, else the file name (rank3, worker3), "
        "else sorted position; name = skip distributedInfo; position = sorted position only",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="write Parquet tables (events, kernels, ops, stage_summary, steps)")
    add_input_options(p)
    add_peak_option(p)
    p.add_argument(
        "-o", "--out", required=True, type=output_option, help="output folder (created; must not exist unless --force)"
    )
    p.add_argument(
        "--force", action="store_true", help="replace an existing output folder (only one profparse parse wrote)"
    )
    add_rank_options(p)
    p.set_defaults(run=run)


def capture_run_trace(folder: str) -> str | None:
    """The trace of a ``profparse capture`` run folder, else None (a folder of rank traces).

    A run folder holds exactly one trace file plus a ``manifest.json`` of kind ``profparse.capture`` naming it;
    such a folder is that one trace, not a one-rank run. Anything unreadable or unexpected: not a run folder."""
    import json
    from pathlib import Path

    from profparse.ranks import SKIP_NAMES, TRACE_SUFFIXES

    manifest_path = Path(folder) / "manifest.json"
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read(1 << 20))  # a capture's manifest is a few kB
        traces = [
            p
            for p in Path(folder).iterdir()
            if p.name.lower().endswith(TRACE_SUFFIXES) and p.name not in SKIP_NAMES and not p.name.startswith(".")
        ]
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("kind") != "profparse.capture":
        return None
    named = manifest.get("trace", {}).get("file") if isinstance(manifest.get("trace"), dict) else None
    if len(traces) != 1 or traces[0].name != named or not traces[0].is_file():
        return None
    return str(traces[0])


def resolve_input(args: argparse.Namespace) -> bool:
    """Whether ``args.trace`` is a folder of ranks; a capture's run folder becomes its one trace."""
    if not input_is_dir(args.trace):
        return False
    run_trace = capture_run_trace(args.trace)
    if run_trace is None:
        return True
    args.trace = run_trace
    return False


def check_utf8_output(out: str) -> None:
    """Refuse an output folder whose name is not UTF-8 (exit 11): Arrow takes paths as UTF-8 text only, so its
    Parquet files could not be written there, nor the dataset read back."""
    try:
        os.fsencode(out).decode("utf-8")
    except UnicodeDecodeError:
        raise OutputWriteError(
            f"{display(out)}: cannot write (Parquet needs a UTF-8 path; this name is not UTF-8)"
        ) from None


def run(args: argparse.Namespace) -> int:
    is_ranks = resolve_input(args)
    check_utf8_output(args.out)
    check_output(args, "dir", "parse", [args.trace])
    if is_ranks:
        return run_ranks(args)
    from profparse.outputs.parquet import TABLES, write_parquet

    parsed = parse_input(args)
    bar = steps_bar(len(TABLES), "writing tables", args.quiet)
    advance = None if bar is None else lambda _: bar.update(1)
    try:
        out = write_parquet(parsed, args.out, force=args.force, on_table=advance)
    finally:
        if bar is not None:
            bar.close()
    note(f"wrote {out}/ ({len(parsed.raw.events):,} events)", args.quiet)
    return 0


# -- many ranks ----------------------------------------------------------------------------------------------------


def rank_files(args: argparse.Namespace) -> list[Any]:
    """Find and number the rank files of ``args.trace``; say where the work will run."""
    from profparse import ranks

    if args.jobs is not None and args.scheduler:
        raise UsageError("--jobs and --scheduler do not go together (the Dask cluster decides the parallelism)")
    files = ranks.prepare(args.trace, args.rank_from, notify=lambda message: note(message, args.quiet))
    if args.scheduler:
        where = f"on the Dask cluster at {args.scheduler}"
    else:
        jobs, lowered = ranks.local_workers(args.jobs, len(files))
        where = ("in this process" if jobs == 1 else f"in {jobs} processes") + (f" ({lowered})" if lowered else "")
    note(f"{args.trace}: {len(files)} rank traces ({ranks.describe_sources(files)}); parsing {where}", args.quiet)
    return files


def rank_progress(total: int, quiet: bool) -> Any:
    """A tqdm counter of finished ranks on stderr when it is a terminal, else None."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="rank", desc="ranks", leave=False, file=sys.stderr)


def rank_run(args: argparse.Namespace) -> Any:
    """The ranks of ``args.trace`` for a summary: read from a dataset ``parse DIR`` wrote (its failed ranks said on
    stderr, one line each), else parsed now (:func:`run_rank_tasks`)."""
    from profparse import ranks

    if not ranks.is_rank_dataset(args.trace):
        return run_rank_tasks(args, None)
    results = ranks.results_from_dataset(args.trace)
    for r in results:
        if not r.ok:
            print(f"profparse: rank {r.rank}: error: {display(r.error)}", file=sys.stderr)  # names, escaped
    run = ranks.RanksRun(args.trace, [ranks.RankFile(r.path, r.rank, r.source) for r in results], results)
    run.matches, run.match_warnings = ranks.read_matches(args.trace)
    return run


def run_rank_tasks(args: argparse.Namespace, out: str | None) -> Any:
    """Parse (and with ``out``, write) every rank; report failures and notes on stderr, one line each."""
    from profparse import ranks

    files = rank_files(args)
    bar = rank_progress(len(files), args.quiet)
    try:
        run = ranks.parse_ranks(
            args.trace,
            out,
            jobs=args.jobs,
            scheduler=args.scheduler,
            force=getattr(args, "force", False),
            include_marks=not args.no_marks,
            strict=args.strict,
            peak_tflops=getattr(args, "peak_tflops", None),  # report has no --peak-tflops
            files=files,
            on_done=(lambda result: bar.update(1)) if bar is not None else None,
            cache=not getattr(args, "no_cache", False),
        )
    finally:
        if bar is not None:
            bar.close()
    for result in sorted(run.results, key=lambda r: r.rank):
        if not result.ok:
            print(f"profparse: rank {result.rank}: error: {display(result.error)}", file=sys.stderr)  # names, escaped
        for message in result.notes:
            note(f"rank {result.rank}: {message}", args.quiet)
    for message in run.match_warnings:
        note(f"collectives: warning: {message}", args.quiet)
    return run


def partial_failure(run: Any, written: str | None) -> PartialFailureError:
    failed = sorted(r.rank for r in run.failed)
    shown = ", ".join(str(r) for r in failed[:10]) + (", ..." if len(failed) > 10 else "")
    where = f"the other ranks were written to {written}/" if written else "the summary covers the other ranks"
    return PartialFailureError(
        f"{len(failed)} of {len(run.results)} ranks could not be read (rank {shown}); {where} (--keep-going to exit 0)"
    )


def run_ranks(args: argparse.Namespace) -> int:
    run = run_rank_tasks(args, args.out)
    events = sum(r.events for r in run.ok)
    note(
        f"wrote {run.out}/ ({len(run.ok)} ranks, {events:,} events; tables partitioned by rank) in {run.seconds:.1f} s",
        args.quiet,
    )
    if run.failed:
        if not args.keep_going:
            raise partial_failure(run, str(run.out))
        note(f"{len(run.failed)} failed ranks are listed in {run.out}/failed_ranks", args.quiet)
    return 0
