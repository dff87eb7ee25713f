"""``profparse report TRACE|FOLDER -o report.html``: one self-contained HTML page (opens from disk, no network)."""

from __future__ import annotations

import argparse
import sys

from profparse.cli.common import add_input_options, check_output, note, output_option, parse_input
from profparse.cli.parse_cmd import add_metric_option, add_rank_options, partial_failure, resolve_input, run_rank_tasks


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write one self-contained HTML page: stages per step, a zoomable timeline, top kernels/ops, "
        "layers, loading, memory, checks (a folder of ranks: rank x stage heatmap and stragglers)",
        description="Write OUT, one HTML file with its scripts and styles inlined (it opens from disk with no "
        "network). The numbers are the ones 'summarize' prints; see docs/report.md.",
    )
    add_input_options(p)
    p.add_argument(
        "-o", "--out", required=True, type=output_option, help="output .html file; must not exist unless --force"
    )
    p.add_argument(
        "--force", action="store_true", help="replace an existing regular file (never the input, a link or a device)"
    )
    add_rank_options(p)
    add_metric_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.report import ranks_payload, trace_payload, write_report

    is_ranks = resolve_input(args)  # a capture's run folder is its one trace
    check_output(args, "file", "report", [args.trace])
    failed = None
    if is_ranks:
        from profparse import ranks

        if ranks.is_rank_dataset(args.trace):
            results = ranks.results_from_dataset(args.trace)
            for r in results:
                if not r.ok:
                    print(f"profparse: rank {r.rank}: error: {r.error}", file=sys.stderr)
            run_ = ranks.RanksRun(args.trace, [ranks.RankFile(r.path, r.rank, r.source) for r in results], results)
        else:
            run_ = run_rank_tasks(args, None)
        payload = ranks_payload(run_.results, args.trace, args.metric)
        failed = run_ if run_.failed and not args.keep_going else None
    else:
        payload = trace_payload(parse_input(args))
    size = write_report(payload, args.out, force=args.force, inputs=[args.trace])
    note(f"wrote {args.out} ({size / 1e6:,.2f} MB)", args.quiet)
    if failed is not None:
        raise partial_failure(failed, None)
    return 0
