"""``profparse plot TRACE -o DIR``: PNG and SVG pictures, one per kind, one colour per stage."""

from __future__ import annotations

import argparse

from profparse.cli.choices import PLOT_FORMATS as FORMATS
from profparse.cli.choices import PLOT_KINDS
from profparse.cli.common import add_input_options, check_output, emit, int_option, note, output_option, parse_input

MAX_DPI = 1000  # a 12 x 6 inch figure at 1000 dpi is 72 Mpixel already


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw stages by level, a stage timeline, top kernels/ops, memory, layers and loading (PNG + SVG)",
        description="Write one picture per kind into DIR: " + ", ".join(PLOT_KINDS) + ". A kind whose data is not "
        "in the trace (no GPU, no [memory] events, no nn.Module events, no loading) is skipped with a note.",
    )
    add_input_options(p)
    p.add_argument(
        "-o", "--out", required=True, type=output_option, help="output folder (created; must not exist unless --force)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the plots of the chosen kinds and formats in a folder profparse plot wrote (others stay)",
    )
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
    p.add_argument(
        "--dpi", type=int_option(1, MAX_DPI), default=120, help=f"PNG resolution, 1-{MAX_DPI} (default: 120)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.plots import write_plots

    check_output(args, "dir", "plot", [args.trace])
    parsed = parse_input(args)
    results = write_plots(
        parsed, args.out, kinds=args.kind, formats=args.formats or FORMATS, force=args.force, dpi=args.dpi
    )
    lines = [
        f"{r.kind}: skipped ({r.skipped})" if r.skipped else f"{r.kind}: {' '.join(map(str, r.files))}" for r in results
    ]
    emit("".join(f"{line}\n" for line in lines), required=False)
    drawn = sum(1 for r in results if not r.skipped)
    note(f"wrote {drawn} of {len(results)} plots into {args.out}/", args.quiet)
    return 0
