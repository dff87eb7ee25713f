"""A folder given as the input: a capture's run folder is its one trace; otherwise its per-rank traces are parsed
(in processes or on a Dask cluster) or read from the dataset ``parse FOLDER`` wrote. Used by parse, summarize and
report.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from profparse.base.errors import PartialFailureError, UsageError
from profparse.base.formats import display
from profparse.cli.common import emit, input_is_dir, note, print_trace_text
from profparse.cli.progress import steps_bar


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
    bar = steps_bar(len(files), "ranks", args.quiet, unit="rank")
    try:
        run = ranks.parse_ranks(
            args.trace,
            out,
            jobs=args.jobs,
            scheduler=args.scheduler,
            force=getattr(args, "force", False),
            include_marks=not args.no_marks,
            strict=args.strict,
            peak_tflops=getattr(args, "peak_tflops", None),  # summarize, parse and report have --peak-tflops
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
    for message, which in rank_notes(run.results):
        note(f"{which}: {message}", args.quiet)
    for message in run.match_warnings:
        note(f"collectives: warning: {message}", args.quiet)
    return run


def rank_notes(results: list[Any]) -> list[tuple[str, str]]:
    """Each rank's notes once per message, with the ranks that gave it (``ranks 0-63``): a check that fires on
    every rank of a large job is one line, not one per rank. In the order of the lowest rank that gave each."""
    from profparse.ranks.discovery import ranks_text

    given: dict[str, list[int]] = {}
    for result in sorted(results, key=lambda r: r.rank):
        for message in result.notes:
            given.setdefault(message, []).append(result.rank)
    return [(message, ranks_text(ranks)) for message, ranks in given.items()]


def partial_failure(run: Any, written: str | None) -> PartialFailureError:
    failed = sorted(r.rank for r in run.failed)
    shown = ", ".join(str(r) for r in failed[:10]) + (", ..." if len(failed) > 10 else "")
    where = f"the other ranks were written to {written}/" if written else "the summary covers the other ranks"
    return PartialFailureError(
        f"{len(failed)} of {len(run.results)} ranks could not be read (rank {shown}); {where} (--keep-going to exit 0)"
    )


def run_text_verb(
    args: argparse.Namespace, render_trace: Callable[[Any], str], render_ranks: Callable[[Any], str]
) -> int:
    """A verb that prints text (summarize, advise): ``render_trace(parsed)`` of one trace (a capture's run folder is
    its one trace), else ``render_ranks(run)`` of a rank folder, exit 7 when some ranks failed (unless
    ``--keep-going``)."""
    if not resolve_input(args):
        return print_trace_text(args, render_trace)
    run = rank_run(args)
    emit(render_ranks(run))
    if run.failed and not args.keep_going:
        raise partial_failure(run, None)
    return 0
