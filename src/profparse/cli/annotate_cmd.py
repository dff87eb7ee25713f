"""``profparse annotate TRACE -o OUT.json.gz``: the trace plus stage tracks, for Perfetto UI / chrome://tracing."""

from __future__ import annotations

import argparse

from profparse.cli.common import check_output, note, parse_input
from profparse.cli.options import add_input_options, add_output_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "annotate",
        help="write a copy of the trace with stage tracks added (open it in Perfetto UI or chrome://tracing)",
        description="Copy TRACE to OUT unchanged and append, before the event array closes, one process named "
        "'profparse stages' with a thread per host thread and GPU stream whose slices are the stages "
        "(args: stage, rule, step). OUT is gzip-compressed when it ends with .gz.",
    )
    add_input_options(p)
    add_output_options(
        p,
        out_help="output trace (.json or .json.gz); must not exist unless --force",
        force_help="replace an existing regular file (never the input, a link or a device)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.perfetto import write_annotated

    check_output(args, "file", "annotate", [args.trace])
    parsed = parse_input(args)
    result = write_annotated(parsed, args.out, force=args.force)
    cut = " (input was cut short: its complete events were copied)" if result.truncated_input else ""
    if result.trailing_bytes:
        cut += f" ({result.trailing_bytes:,} bytes after the input's JSON document were not copied)"
    tracks = f"{result.tracks} track" + ("s" if result.tracks != 1 else "")
    substeps = f", {result.substeps:,} loading sub-step slices" if result.substeps else ""
    substeps += f", {result.path_segments:,} critical path slices" if result.path_segments else ""
    note(f"wrote {result.path} ({result.intervals:,} stage slices on {tracks}{substeps}){cut}", args.quiet)
    return 0
