"""``profparse advise TRACE|FOLDER``: what to change next, the biggest saving per step first (docs/advice.md).

Thin over the ``findings`` table (:mod:`profparse.analysis.advice`): each finding's kind, stage, steps, saving per
step (time on the critical path the fix removes) and its share of a step, confidence, what was found, one fix, and
the top evidence. A folder of rank traces (or a dataset ``parse FOLDER`` wrote): every rank's findings with its
rank, plus a ``late_rank`` finding per stage where the others wait for one rank at the collectives.

Exit codes as every verb (docs/exit-codes.md): 0 with or without findings; 2 a bad command line; 3 no such input;
4 not a Kineto trace; 5 truncated with ``--strict``; 7 some ranks failed (without ``--keep-going``); 8 out of memory.
A single trace's output is stored in its cache entry with the options that made it: the same command again prints
it without parsing.
"""

from __future__ import annotations

import argparse

from profparse.cli.options import add_input_options, add_peak_option, add_rank_options
from profparse.cli.rank_folder import run_text_verb

FORMATS = ("text", "json")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="list what to change next, the biggest saving per step first, each with its fix and evidence",
        description="List the findings of a trace (or of every rank of a folder): what to change, where, what it "
        "saves per step, and how. See docs/advice.md for each kind of finding.",
        epilog="Exit codes: 0 (with or without findings), 2 usage, 3 no input, 4 not a trace, 5 truncated with "
        "--strict, 7 some ranks failed; docs/exit-codes.md.",
    )
    add_input_options(p, rank_folders=True)
    add_peak_option(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    add_rank_options(p)
    p.set_defaults(run=run, prints_result=True)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.summary.findings import findings_data, render_advice

    def render(parsed) -> str:
        return render_advice(findings_data(parsed.table("findings")), args.trace, args.format)

    def render_ranks(run_) -> str:
        from profparse import ranks

        data = ranks.ranks_summary_data(
            run_.results, folder=args.trace, matches=run_.matches, match_warnings=run_.match_warnings
        )
        return render_advice(data["findings"], args.trace, args.format)

    return run_text_verb(args, render, render_ranks)
