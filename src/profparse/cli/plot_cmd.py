"""``profparse plot TRACE -o DIR``: PNG and SVG pictures, one per kind, one colour per stage."""

from __future__ import annotations

import argparse
import sys

from profparse.cli.common import add_input_options, note, parse_input
from profparse.outputs.plots import FORMATS, PLOT_KINDS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw stages by level, a stage timeline, top kernels/ops, memory, layers and loading (PNG + SVG)",
        description="Write one picture per kind into DIR: " + ", ".join(PLOT_KINDS) + ". A kind whose data is not "
        "in the trace (no GPU, no [memory] events, no nn.Module events, no loading) is skipped with a note.",
    )
    add_input_options(p)
    p.add_argument("-o", "--out", required=True, help="output folder (created; must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument(
        "--kind",
        action="append",
        choices=PLOT_KINDS,
        metavar="KIND",
        help=f"only this kind (repeatable): {', '.join(PLOT_KINDS)} (default: all)",
    )
    p.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        dest="formats",
        help="only this file format (repeatable; default: png and svg)",
    )
    p.add_argument("--dpi", type=int, default=120, help="PNG resolution (default: 120)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.plots import write_plots

    parsed = parse_input(args)
    results = write_plots(
        parsed, args.out, kinds=args.kind, formats=args.formats or FORMATS, force=args.force, dpi=args.dpi
    )
    for r in results:
        if r.skipped:
            sys.stdout.write(f"{r.kind}: skipped ({r.skipped})\n")
        else:
            sys.stdout.write(f"{r.kind}: {' '.join(str(f) for f in r.files)}\n")
    drawn = sum(1 for r in results if not r.skipped)
    note(f"wrote {drawn} of {len(results)} plots into {args.out}/", args.quiet)
    return 0
