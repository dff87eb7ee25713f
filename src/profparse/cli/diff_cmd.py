"""``profparse diff A B``: what changed per stage and level, and the kernels and ops that moved most.

The text is stored in A's cache entry, keyed by B's entry and the options (docs/cache.md): the same diff again
prints it without importing pandas or reading either trace's tables.
"""

from __future__ import annotations

import argparse
import copy

from profparse.cli.choices import DIFF_FORMATS as FORMATS
from profparse.cli.choices import DIFF_TOP_N as TOP_N
from profparse.cli.common import emit, entry_name, input_notes, parse_input, replay_text, stored_text, text_options
from profparse.cli.options import add_read_options, int_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two traces: change per stage and level (B - A), kernels and ops that moved most",
    )
    p.add_argument("a", help="the baseline trace (A)")
    p.add_argument("b", help="the trace to compare with it (B)")
    add_read_options(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument("--top", type=int_option(0), default=TOP_N, help=f"kernels and ops listed (default: {TOP_N})")
    p.add_argument(
        "--per-step",
        action="store_true",
        help="compare means per step (for captures with different step counts) instead of whole-trace totals",
    )
    p.set_defaults(run=run, prints_result=True)


def run(args: argparse.Namespace) -> int:
    b_entry = entry_name(args, args.b)
    options = {**text_options(args), "b_entry": b_entry and b_entry[1]}  # stored in A's entry, keyed by B's
    stored = stored_text(args, options, args.a) if b_entry is not None else None
    if stored is not None:  # these two traces, these options, this code: what the first run printed
        return replay_text(args, stored)
    from profparse.diff import render_diff

    parsed = []
    for path in (args.a, args.b):
        one = copy.copy(args)
        one.trace = path
        parsed.append(parse_input(one))
    text = render_diff(parsed[0], parsed[1], args.format, top=args.top, per_step=args.per_step)
    emit(text)
    if parsed[0].cache is not None and b_entry is not None:
        notes = input_notes(args.a, parsed[0]) + input_notes(args.b, parsed[1])
        parsed[0].cache.put_text(options, text, notes, 0)
    return 0
