"""Options and helpers shared by the verbs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a Kineto trace (.json or .json.gz)")
    parser.add_argument(
        "--no-marks",
        action="store_true",
        help="ignore stage marks (profparse.stage:* and user ranges) and infer stages from PyTorch's own events",
    )
    parser.add_argument("--strict", action="store_true", help="treat a truncated trace as an error")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes on stderr")


def progress_bar(path: str, quiet: bool) -> Any:
    """A tqdm byte counter on stderr when it is a terminal, else None."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None
    gz = str(path).endswith(".gz")
    tqdm.monitor_interval = 0  # no monitor thread: reading forks decoding workers only from a single-threaded process
    bar = tqdm(total=None if gz else size, unit="B", unit_scale=True, desc="reading", leave=False, file=sys.stderr)
    state = {"last": 0}

    def update(done: int) -> None:
        bar.update(done - state["last"])
        state["last"] = done

    update.close = bar.close  # type: ignore[attr-defined]
    update.phase = lambda text: bar.set_description_str(text)  # type: ignore[attr-defined]  # after reading
    return update


def steps_bar(total: int, desc: str, quiet: bool) -> Any:
    """A tqdm counter of ``total`` steps on stderr when it is a terminal, else None."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)


def note(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"profparse: {message}", file=sys.stderr)


def parse_input(args: argparse.Namespace) -> Any:
    """Run the library's data path on ``args.trace`` with the common options."""
    from profparse.api import parse

    progress = progress_bar(args.trace, args.quiet)
    try:
        parsed = parse(args.trace, include_marks=not args.no_marks, strict=args.strict, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    report = parsed.raw.report
    if report.truncated:
        note(
            f"warning: {args.trace}: truncated at byte {report.truncated_at_byte}; "
            f"recovered {report.events_read} complete events",
            args.quiet,
        )
    for w in parsed.warnings.itertuples(index=False):
        if w.severity != "info" and w.check != "truncated":
            note(f"{w.severity}: {args.trace}: {w.message}", args.quiet)
    return parsed
