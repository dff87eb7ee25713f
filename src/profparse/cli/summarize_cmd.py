"""``profparse summarize TRACE``: the per-stage summary in the terminal (or json/csv/markdown).

``profparse summarize FOLDER``: for a folder of rank traces (or a dataset written by ``parse FOLDER``), the time of
each stage on each rank, the slowest rank per stage and its lead over the median. A capture's run folder (one trace
plus the ``manifest.json`` ``profparse capture`` writes) is summarized as its trace.
"""

from __future__ import annotations

import argparse
import sys

from profparse.cli.common import add_input_options, add_peak_option, emit, int_option, parse_input
from profparse.cli.parse_cmd import add_metric_option, add_rank_options, partial_failure, resolve_input, run_rank_tasks
from profparse.outputs.summary import FORMATS, TOP_N, render_summary


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summarize", help="print time per stage, per step, and the top kernels and ops per stage")
    add_input_options(p)
    add_peak_option(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument(
        "--top", type=int_option(0), default=TOP_N, help=f"kernels and ops listed per stage (default: {TOP_N})"
    )
    add_rank_options(p)
    add_metric_option(p)
    p.set_defaults(run=run, prints_result=True)


def run(args: argparse.Namespace) -> int:
    if resolve_input(args):  # a capture's run folder is its one trace
        return run_ranks(args)
    parsed = parse_input(args)
    emit(render_summary(parsed, fmt=args.format, top=args.top))
    return 0


def run_ranks(args: argparse.Namespace) -> int:
    from profparse import ranks

    if ranks.is_rank_dataset(args.trace):
        results = ranks.results_from_dataset(args.trace)
        for r in results:
            if not r.ok:
                print(f"profparse: rank {r.rank}: error: {r.error}", file=sys.stderr)
        run = ranks.RanksRun(args.trace, [ranks.RankFile(r.path, r.rank, r.source) for r in results], results)
        run.matches, run.match_warnings = ranks.read_matches(args.trace)
    else:
        run = run_rank_tasks(args, None)
    data = ranks.ranks_summary_data(
        run.results,
        metric=args.metric,
        folder=args.trace,
        matches=run.matches,
        match_warnings=run.match_warnings,
        top=args.top,
    )
    emit(ranks.render_ranks(data, args.format))
    if run.failed and not args.keep_going:
        raise partial_failure(run, None)
    return 0
