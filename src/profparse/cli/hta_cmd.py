"""``profparse hta TRACE``: HTA's kernel-type and idle-time breakdowns split by stage (needs the ``hta`` extra)."""

from __future__ import annotations

import argparse

from profparse.cli.common import emit, parse_input
from profparse.cli.options import add_input_options, int_option

FORMATS = ("text", "json", "markdown")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hta",
        help="HolisticTraceAnalysis kernel-type and idle-time breakdowns per stage (needs the hta extra)",
    )
    add_input_options(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument(
        "--exact",
        action="store_true",
        help="load with HTA_DISABLE_NS_ROUNDING=1 (HTA otherwise rounds every event to whole microseconds)",
    )
    p.add_argument(
        "--kernel-delay",
        type=int_option(0),
        default=30,
        metavar="US",
        help="HTA's consecutive_kernel_delay: shorter gaps count as kernel wait (default: 30, HTA's unit)",
    )
    p.set_defaults(run=run, prints_result=True)


def run(args: argparse.Namespace) -> int:
    from profparse.hta import INSTALL_HINT, HtaNotInstalledError, hta_available

    if not hta_available():
        raise HtaNotInstalledError(INSTALL_HINT)  # one line, profparse: error: ..., exit 2
    from profparse.hta import hta_by_stage, hta_data, render

    parsed = parse_input(args)
    result = hta_by_stage(parsed, exact=args.exact, consecutive_kernel_delay=args.kernel_delay)
    emit(render(hta_data(result), args.format))
    return 0
