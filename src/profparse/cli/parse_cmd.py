"""``profparse parse TRACE -o DIR``: write the Parquet tables."""

from __future__ import annotations

import argparse

from profparse.cli.common import add_input_options, note, parse_input


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="write Parquet tables (events, kernels, ops, stage_summary, steps)")
    add_input_options(p)
    p.add_argument("-o", "--out", required=True, help="output folder (created; must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from profparse.outputs.parquet import write_parquet

    parsed = parse_input(args)
    out = write_parquet(parsed, args.out, force=args.force)
    note(f"wrote {out}/ ({len(parsed.raw.events):,} events)", args.quiet)
    return 0
