"""``profparse summarize TRACE``: the per-stage summary in the terminal (or json/csv/markdown).

``profparse summarize FOLDER``: for a folder of rank traces (or a dataset written by ``parse FOLDER``), the time of
each stage on each rank, the slowest rank per stage and its lead over the median. A capture's run folder (one trace
plus the ``manifest.json`` ``profparse capture`` writes) is summarized as its trace.

A single trace's summary is stored in its cache entry with the options that made it (docs/cache.md): the same
command again prints it, and its notes, without importing pandas (over 10x faster).
"""

from __future__ import annotations

import argparse

from profparse.cli.choices import SUMMARY_FORMATS as FORMATS
from profparse.cli.choices import SUMMARY_TOP_N as TOP_N
from profparse.cli.options import add_input_options, add_metric_option, add_peak_option, add_rank_options, int_option
from profparse.cli.rank_folder import run_text_verb


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summarize", help="print time per stage, per step, and the top kernels and ops per stage")
    add_input_options(p, rank_folders=True)
    add_peak_option(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument(
        "--top", type=int_option(0), default=TOP_N, help=f"kernels and ops listed per stage (default: {TOP_N})"
    )
    add_rank_options(p)
    add_metric_option(p)
    p.set_defaults(run=run, prints_result=True)


def run(args: argparse.Namespace) -> int:
    def render(parsed) -> str:
        from profparse.outputs.summary import render_summary

        return render_summary(parsed, fmt=args.format, top=args.top, release=True)

    def render_ranks(run_) -> str:
        from profparse import ranks

        data = ranks.ranks_summary_data(
            run_.results,
            metric=args.metric,
            folder=args.trace,
            matches=run_.matches,
            match_warnings=run_.match_warnings,
            top=args.top,
        )
        return ranks.render_ranks(data, args.format)

    return run_text_verb(args, render, render_ranks)
