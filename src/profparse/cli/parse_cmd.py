"""``profparse parse TRACE -o DIR``: write the Parquet tables.

``profparse parse FOLDER -o DIR`` does it for a folder of rank traces: one dataset partitioned by rank
(``DIR/<table>/rank=<r>/part-0.parquet``), ranks parsed in parallel (``--jobs``) or on a Dask cluster (``--scheduler``).
A capture's run folder (one trace plus its ``manifest.json``) is that one trace.
"""

from __future__ import annotations

import argparse
import os

from profparse.base.errors import OutputWriteError
from profparse.base.formats import display
from profparse.cli.common import check_output, note, parse_input
from profparse.cli.options import add_input_options, add_output_options, add_peak_option, add_rank_options
from profparse.cli.progress import steps_bar
from profparse.cli.rank_folder import partial_failure, resolve_input, run_rank_tasks


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="write Parquet tables (events, kernels, ops, stage_summary, steps)")
    add_input_options(p, rank_folders=True)
    add_peak_option(p)
    add_output_options(
        p,
        out_help="output folder (created; must not exist unless --force)",
        force_help="replace an existing output folder (only one profparse parse wrote)",
    )
    add_rank_options(p)
    p.set_defaults(run=run)


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
    from profparse.outputs.parquet import write_parquet
    from profparse.tables.registry import written

    parsed = parse_input(args)
    bar = steps_bar(len(written()), "writing tables", args.quiet)
    advance = None if bar is None else lambda _: bar.update(1)
    try:
        out = write_parquet(parsed, args.out, force=args.force, on_table=advance, release=True)
    finally:
        if bar is not None:
            bar.close()
    note(f"wrote {out}/ ({len(parsed.raw.events):,} events)", args.quiet)
    return 0


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
