"""``profparse plot TRACE -o DIR``: PNG and SVG pictures, one per kind, one colour per stage.

The figures are stored in the trace's cache entry with the options that drew them (docs/cache.md): the same
command again copies them (matplotlib takes seconds per figure and format on a large trace).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from profparse.base.formats import display
from profparse.cli.choices import PLOT_FORMATS as FORMATS
from profparse.cli.choices import PLOT_KINDS, PLOT_MAX_PIXELS
from profparse.cli.common import check_output, emit, input_notes, note, output_options, parse_input, stored_output
from profparse.cli.options import add_input_options, add_output_options, add_peak_option, int_option

#: PNG resolution. Below MIN_DPI the smallest labels (7 pt) are under one pixel, which FreeType refuses (dpi 1-5
#: was an internal error); each PNG is also held to profparse.outputs.plots.MAX_PIXELS, whatever the dpi.
MIN_DPI = 20
MAX_DPI = 1000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw stages by level, a stage timeline, top kernels/ops, memory, layers and loading (PNG + SVG)",
        description="Write one picture per kind into DIR: " + ", ".join(PLOT_KINDS) + ". A kind whose data is not "
        "in the trace (no GPU, no [memory] events, no nn.Module events, no loading) is skipped with a note.",
    )
    add_input_options(p)
    add_output_options(
        p,
        out_help="output folder (created; must not exist unless --force)",
        force_help="replace the plots of the chosen kinds and formats in a folder profparse plot wrote (others stay)",
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
        "--dpi",
        type=int_option(MIN_DPI, MAX_DPI),
        default=120,
        help=f"PNG resolution, {MIN_DPI}-{MAX_DPI} (default: 120); a PNG is at most {PLOT_MAX_PIXELS / 1e6:.0f} "
        "Mpixel (a larger one is drawn at a lower dpi, with a note)",
    )
    add_peak_option(p)  # the roofline's compute roof
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_output(args, "dir", "plot", [args.trace])
    options = output_options(args, ("matplotlib",))
    stored = stored_output(args, options)
    if stored is not None:  # this trace, these options, this code: the figures the first run drew
        body, folder = stored
        for message in body["notes"]:
            note(message, args.quiet)
        results = body["results"]
        copy_plots(args, results, folder)
    else:
        from profparse.outputs.plots import write_plots

        parsed = parse_input(args)
        drawn = write_plots(
            parsed,
            args.out,
            kinds=args.kind,
            formats=args.formats or FORMATS,
            force=args.force,
            dpi=args.dpi,
            release=True,
        )
        results = [
            {"kind": r.kind, "files": [f.name for f in r.files], "skipped": r.skipped, "note": r.note} for r in drawn
        ]
        if parsed.cache is not None:
            body = {"notes": input_notes(args.trace, parsed), "results": results}
            parsed.cache.put_output(options, body, [f for r in drawn for f in r.files])
    for r in results:  # a PNG drawn at a lower dpi: said again when the figures are copied from the cache
        if r.get("note"):
            note(r["note"], args.quiet)
    lines = [
        f"{r['kind']}: skipped ({r['skipped']})"
        if r["skipped"]
        else f"{r['kind']}: {' '.join(display(Path(args.out) / f) for f in r['files'])}"
        for r in results
    ]
    emit("".join(f"{line}\n" for line in lines), required=False)
    drawn_count = sum(1 for r in results if not r["skipped"])
    note(f"wrote {drawn_count} of {len(results)} plots into {args.out}/", args.quiet)
    return 0


def copy_plots(args: argparse.Namespace, results: list[dict], folder: Path) -> None:
    """Write the stored figures into ``-o`` as :func:`profparse.outputs.plots.write_plots` writes drawn ones
    (one atomic folder; with --force only the chosen kinds' and formats' files are replaced)."""
    from profparse.base.files import atomic_dir

    kinds = args.kind or list(PLOT_KINDS)
    owns = [f"{kind}.{fmt}" for kind in kinds for fmt in args.formats or FORMATS]
    with atomic_dir(args.out, force=args.force, verb="plot", inputs=[args.trace], owns=owns) as tmp:
        for r in results:
            for name in r["files"]:
                shutil.copyfile(folder / name, tmp / name)
