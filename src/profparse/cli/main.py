"""``profparse`` command line: one small module per verb, all thin over the library API."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from profparse import __version__
from profparse.cli import annotate_cmd, diff_cmd, hta_cmd, parse_cmd, plot_cmd, summarize_cmd
from profparse.errors import ProfparseError

VERBS = (parse_cmd, summarize_cmd, plot_cmd, annotate_cmd, diff_cmd, hta_cmd)

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_OUT_OF_MEMORY = 8


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profparse",
        description="Attribute a PyTorch (Kineto) trace to load / forward / backward / optimizer.",
        epilog="Exit codes: see docs/exit-codes.md. Set PROFPARSE_DEBUG=1 for tracebacks.",
    )
    parser.add_argument("--version", action="version", version=f"profparse {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb in VERBS:
        verb.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ProfparseError as exc:
        print(f"profparse: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("profparse: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        print("profparse: error: out of memory", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - last resort: one line, never a traceback unless asked
        if os.environ.get("PROFPARSE_DEBUG"):
            raise
        print(f"profparse: internal error: {type(exc).__name__}: {exc} (PROFPARSE_DEBUG=1 shows more)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
