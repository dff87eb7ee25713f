"""``profparse summarize TRACE``: the per-stage summary in the terminal (or json/csv/markdown)."""

from __future__ import annotations

import argparse
import sys

from profparse.cli.common import add_input_options, parse_input
from profparse.outputs.summary import FORMATS, TOP_N, render_summary


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summarize", help="print time per stage, per step, and the top kernels and ops per stage")
    add_input_options(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument("--top", type=int, default=TOP_N, help=f"kernels and ops listed per stage (default: {TOP_N})")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    parsed = parse_input(args)
    sys.stdout.write(render_summary(parsed, fmt=args.format, top=args.top))
    return 0
