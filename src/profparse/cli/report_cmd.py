"""``profparse report TRACE|FOLDER -o report.html``: one self-contained HTML page (opens from disk, no network)."""

from __future__ import annotations

import argparse
from pathlib import Path

from profparse.cli.common import check_output, input_notes, note, output_options, parse_input, stored_output
from profparse.cli.options import (
    add_input_options,
    add_metric_option,
    add_output_options,
    add_peak_option,
    add_rank_options,
)
from profparse.cli.rank_folder import partial_failure, rank_run, resolve_input


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write one self-contained HTML page: stages per step, a zoomable timeline, top kernels/ops, "
        "layers, loading, memory, checks (a folder of ranks: rank x stage heatmap and stragglers)",
        description="Write OUT, one HTML file with its scripts and styles inlined (it opens from disk with no "
        "network). The numbers are the ones 'summarize' prints; see docs/report.md.",
    )
    add_input_options(p, rank_folders=True)
    add_output_options(
        p,
        out_help="output .html file; must not exist unless --force",
        force_help="replace an existing regular file (never the input, a link or a device)",
    )
    add_peak_option(p)
    add_rank_options(p)
    add_metric_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    is_ranks = resolve_input(args)  # a capture's run folder is its one trace
    check_output(args, "file", "report", [args.trace])
    if not is_ranks:
        return run_trace(args)
    from profparse.outputs.report import ranks_payload, write_report
    from profparse.ranks import ranks_summary_data

    run_ = rank_run(args)
    matches, match_warnings = run_.matches, run_.match_warnings
    data = ranks_summary_data(
        run_.results, metric=args.metric, folder=args.trace, matches=matches, match_warnings=match_warnings
    )
    payload = ranks_payload(data, args.trace)
    size = write_report(payload, args.out, force=args.force, inputs=[args.trace])
    note(f"wrote {args.out} ({size / 1e6:,.2f} MB)", args.quiet)
    if run_.failed and not args.keep_going:
        raise partial_failure(run_, None)
    return 0


def run_trace(args: argparse.Namespace) -> int:
    """One trace's page; stored in its cache entry (docs/cache.md), so the same command again copies it."""
    options = output_options(args, ())
    stored = stored_output(args, options)
    if stored is not None:  # this trace, these options, this code: the page the first run wrote
        body, folder = stored
        for message in body["notes"]:
            note(message, args.quiet)
        size = copy_report(args, folder / body["files"][0])
    else:
        from profparse.outputs.report import trace_payload, write_report

        parsed = parse_input(args)
        size = write_report(trace_payload(parsed, release=True), args.out, force=args.force, inputs=[args.trace])
        if parsed.cache is not None:
            parsed.cache.put_output(options, {"notes": input_notes(args.trace, parsed)}, [Path(args.out)])
    note(f"wrote {args.out} ({size / 1e6:,.2f} MB)", args.quiet)
    return 0


def copy_report(args: argparse.Namespace, page: Path) -> int:
    """Write a stored page to ``-o`` as :func:`profparse.outputs.report.write_report` does; its size."""
    from profparse.base.files import atomic_file

    data = page.read_bytes()
    with atomic_file(args.out, force=args.force, inputs=[args.trace]) as tmp:
        tmp.write_bytes(data)
    return len(data)
