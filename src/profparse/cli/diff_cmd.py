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
    from profparse.diff import compare, render, side

    sides, notes, caches = [], [], []
    for path in (args.a, args.b):  # one trace held at a time: what is compared of each is small
        one = copy.copy(args)
        one.trace = path
        parsed = parse_input(one)
        sides.append(side(parsed, args.per_step, release=True))
        notes += input_notes(path, parsed)
        caches.append(parsed.cache)
        del parsed
    text = render(compare(sides[0], sides[1], top=args.top, per_step=args.per_step), args.format)
    emit(text)
    if caches[0] is not None and b_entry is not None:
        caches[0].put_text(options, text, notes, 0)
    return 0
