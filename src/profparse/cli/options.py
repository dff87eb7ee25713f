"""The verbs' option groups, each declared once: how a trace is read, where results go, the peak, many ranks.

Building the command line must not import pandas, numpy or pyarrow (see :mod:`profparse.cli.choices`).
"""

from __future__ import annotations

import argparse
from typing import Any

#: The positional's help in the verbs that also take a folder of per-rank traces.
TRACE_HELP = "a Kineto trace (.json or .json.gz), or a folder of per-rank traces"

#: ``--peak-tflops`` bounds: 1 MFLOP/s to 1 EFLOP/s per device, around every real peak by orders of magnitude.
#: Outside them the MFU arithmetic leaves the float range (1e-320 overflowed dividing by it, 1e300 multiplying by
#: it: numpy's RuntimeWarnings on stderr, and an MFU of 1e196 or 0).
PEAK_TFLOPS_RANGE = (1e-6, 1e6)


def int_option(low: int, high: int | None = None) -> Any:
    """An argparse ``type`` for an integer option in ``[low, high]``: a bad value is a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound} (got {value})")
        return value

    parse.__name__ = "integer"
    return parse


def peak_option(text: str) -> float:
    """An argparse ``type`` for ``--peak-tflops``: a number within :data:`PEAK_TFLOPS_RANGE`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of TFLOP/s, got {text!r}") from None
    low, high = PEAK_TFLOPS_RANGE
    if not low <= value <= high:  # NaN too
        raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g} TFLOP/s (got {text})")
    return value


def output_option(text: str) -> str:
    """An argparse ``type`` for ``-o``: not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty")
    return text


def add_input_options(parser: argparse.ArgumentParser, *, rank_folders: bool = False) -> None:
    """The trace (or, with ``rank_folders``, a folder of rank traces) and how it is read."""
    parser.add_argument("trace", help=TRACE_HELP if rank_folders else "a Kineto trace (.json or .json.gz)")
    add_read_options(parser)


def add_read_options(parser: argparse.ArgumentParser) -> None:
    """How traces are read: ``--no-marks``, ``--strict``, ``-q``, ``--no-cache``."""
    parser.add_argument(
        "--no-marks",
        action="store_true",
        help="ignore stage marks (profparse.stage:* and user ranges) and infer stages from PyTorch's own events",
    )
    parser.add_argument("--strict", action="store_true", help="treat a truncated trace as an error")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes on stderr")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="read the JSON even when this trace's parsed tables are in the cache, and store nothing (docs/cache.md)",
    )


def add_output_options(parser: argparse.ArgumentParser, out_help: str, force_help: str) -> None:
    """``-o/--out`` (required, not empty) and ``--force``, with the verb's own words for them."""
    parser.add_argument("-o", "--out", required=True, type=output_option, help=out_help)
    parser.add_argument("--force", action="store_true", help=force_help)


def add_peak_option(parser: argparse.ArgumentParser) -> None:
    """``--peak-tflops``: the peak MFU and HFU are measured against (default: the device's, from the peak table)."""
    parser.add_argument(
        "--peak-tflops",
        type=peak_option,
        default=None,
        metavar="TFLOPS",
        help="dense peak TFLOP/s for MFU/HFU (default: the device's peak for the main dtype; docs/efficiency.md)",
    )


def add_rank_options(parser: argparse.ArgumentParser) -> None:
    """Options for a folder of rank traces (ignored for a single trace)."""
    group = parser.add_argument_group("many ranks (when TRACE is a folder of per-rank traces)")
    group.add_argument(
        "-j",
        "--jobs",
        type=int_option(1),
        default=None,
        metavar="N",
        help="ranks parsed in parallel processes (default: CPUs)",
    )
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the ranks on a Dask cluster (tcp://host:8786); workers must see the same files (docs/ranks.md)",
    )
    group.add_argument(
        "--keep-going", action="store_true", help="exit 0 even if some ranks could not be read (they are reported)"
    )
    group.add_argument(
        "--rank-from",
        choices=("auto", "name", "position"),
        default="auto",
        help="where rank numbers come from: auto = distributedInfo, else the file name (rank3, worker3), "
        "else sorted position; name = skip distributedInfo; position = sorted position only",
    )


def add_metric_option(parser: argparse.ArgumentParser) -> None:
    """``--metric`` of the verbs that compare ranks (summarize, report)."""
    from profparse.cli.choices import DEFAULT_METRIC, METRICS

    parser.add_argument(
        "--metric",
        choices=METRICS,
        default=DEFAULT_METRIC,
        help=f"for a folder of ranks: the time compared across ranks (default: {DEFAULT_METRIC})",
    )
