"""Options and helpers shared by the verbs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profparse.base.errors import NoSpaceError, OutputWriteError, from_oserror, is_no_space
from profparse.base.formats import display

#: True when the process started with its standard output closed (``>&-``); see main.guard_std_streams.
STDOUT_CLOSED = False


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


#: ``--peak-tflops`` bounds: 1 MFLOP/s to 1 EFLOP/s per device, around every real peak by orders of magnitude.
#: Outside them the MFU arithmetic leaves the float range (1e-320 overflowed dividing by it, 1e300 multiplying by
#: it: numpy's RuntimeWarnings on stderr, and an MFU of 1e196 or 0).
PEAK_TFLOPS_RANGE = (1e-6, 1e6)


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


def add_peak_option(parser: argparse.ArgumentParser) -> None:
    """``--peak-tflops``: the peak MFU and HFU are measured against (default: the device's, from the peak table)."""
    parser.add_argument(
        "--peak-tflops",
        type=peak_option,
        default=None,
        metavar="TFLOPS",
        help="dense peak TFLOP/s for MFU/HFU (default: the device's peak for the main dtype; docs/efficiency.md)",
    )


def output_option(text: str) -> str:
    """An argparse ``type`` for ``-o``: not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty")
    return text


def input_is_dir(path: str) -> bool:
    """Whether the input is a folder; a path that cannot be looked at (name too long, permission) is exit 3."""
    try:
        return Path(path).is_dir()
    except OSError as exc:
        raise from_oserror(exc, inputs=[path]) from None


def check_output(args: argparse.Namespace, kind: str, verb: str, inputs: list[str]) -> None:
    """Refuse a bad ``-o`` before any work is done (writing checks again, under the output's lock)."""
    from profparse.base import files

    files.check_target(args.out, kind=kind, verb=verb, force=args.force, inputs=inputs)


def emit(text: str, *, required: bool = True) -> None:
    """Write a result to standard output; a full disk or a closed stdout is a one-line error, not a traceback.

    ``required=False``: the text is only a listing of what was written elsewhere; a closed stdout drops it."""
    if STDOUT_CLOSED:
        if not required:
            return
        raise OutputWriteError("standard output is closed (redirect it to a file or to /dev/null instead)")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        _discard_stdout()
        if is_no_space(exc):
            raise NoSpaceError("standard output: no space left on device") from None
        raise OutputWriteError(f"standard output: cannot write ({exc.strerror or exc})") from None


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's own flush at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def add_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a Kineto trace (.json or .json.gz)")
    parser.add_argument(
        "--no-marks",
        action="store_true",
        help="ignore stage marks (profparse.stage:* and user ranges) and infer stages from PyTorch's own events",
    )
    parser.add_argument("--strict", action="store_true", help="treat a truncated trace as an error")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes on stderr")
    add_cache_option(parser)


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="read the JSON even when this trace's parsed tables are in the cache, and store nothing (docs/cache.md)",
    )


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
        print(f"profparse: {display(message)}", file=sys.stderr)  # trace and file names may hold control characters


def parse_input(args: argparse.Namespace) -> Any:
    """Run the library's data path on ``args.trace`` with the common options (through the cache, docs/cache.md)."""
    from profparse.api import load

    progress = progress_bar(args.trace, args.quiet)
    out = getattr(args, "out", None)
    try:
        parsed = load(
            args.trace,
            cache=not getattr(args, "no_cache", False),
            include_marks=not args.no_marks,
            strict=args.strict,
            progress=progress,
            notify=lambda message: note(message, args.quiet),
            outputs=(out,) if out else (),
            peak_tflops=getattr(args, "peak_tflops", None),
        )
    finally:
        if progress is not None:
            progress.close()
    for message in input_notes(args.trace, parsed):
        note(message, args.quiet)
    return parsed


def input_notes(trace: str, parsed: Any) -> list[str]:
    """The warnings :func:`parse_input` prints about a parsed trace (truncation, quality checks), in order."""
    notes = []
    report = parsed.raw.report
    if report.truncated:
        notes.append(
            f"warning: {trace}: truncated at byte {report.truncated_at_byte}; "
            f"recovered {report.events_read} complete events"
        )
    for w in parsed.warnings.itertuples(index=False):
        if w.severity != "info" and w.check != "truncated":
            notes.append(f"{w.severity}: {trace}: {w.message}")
    return notes


#: Environment variables that can change a verb's result (besides the options): part of a stored text's key.
RESULT_ENV = ("PROFPARSE_TORCH_FLOPS",)  # profparse.analysis.flops.TORCH_ENV


def text_options(args: argparse.Namespace) -> dict[str, Any]:
    """What a verb's printed result depends on besides the trace's content and profparse's code (both in the
    cache entry's name): every option (present and future; ``-q`` only hides notes, which are replayed
    through it; the trace's path as given, which the result names), and :data:`RESULT_ENV`."""
    options = {
        k: v for k, v in sorted(vars(args).items()) if k not in ("quiet", "run", "prints_result") and not callable(v)
    }
    options["env"] = {name: os.environ.get(name) for name in RESULT_ENV}
    return options


def stored_text(args: argparse.Namespace, options: dict[str, Any], trace: str | None = None) -> dict[str, Any] | None:
    """The result a verb stored for ``trace`` (default ``args.trace``) with ``options`` (see
    :meth:`profparse.cache.Entry.put_text`), or None. Silent but for a damaged text: on a miss, loading the
    trace opens the cache again and says what it has to say."""
    return _stored(args, trace or args.trace, (), lambda store, name: store.get_text(name, options))


def replay_text(args: argparse.Namespace, stored: dict[str, Any]) -> int:
    """Print a stored result as the run that stored it did (its notes, its output); its exit code."""
    for message in stored["notes"]:
        note(message, args.quiet)
    emit(stored["stdout"])
    return stored["code"]


def _stored(args: argparse.Namespace, trace: str, outputs: tuple[str, ...], get: Callable[[Any, str], Any]) -> Any:
    """``get(cache, entry name)`` for ``trace``'s entry, or None; on a hit, what opening the cache had to say
    (a bad PROFPARSE_CACHE_MAX_BYTES) is printed, as a miss says it."""
    found = entry_name(args, trace, outputs)
    if found is None:
        return None
    store, name, heard = found
    store.notify = lambda message: note(message, args.quiet)
    stored = get(store, name)
    if stored is not None:
        for message in heard:
            note(message, args.quiet)
    return stored


def entry_name(
    args: argparse.Namespace, trace: str, outputs: tuple[str, ...] = ()
) -> tuple[Any, str, list[str]] | None:
    """(the cache, the name of ``trace``'s entry with ``args``' parse options, the notes opening the cache gave),
    or None (no cache, --no-cache, not a regular file). Prints nothing (on a miss, loading the trace opens the
    cache again and says it), and imports neither pandas nor pyarrow."""
    if getattr(args, "no_cache", False):
        return None
    from profparse.cache import Cache, load_options

    heard: list[str] = []
    store = Cache.open(notify=heard.append, inputs=[trace], outputs=outputs)
    if store is None:
        return None
    key = store.key(trace, load_options(not args.no_marks, args.strict, getattr(args, "peak_tflops", None)))
    return None if key is None else (store, key[0], heard)


def stored_output(args: argparse.Namespace, options: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """The files a verb stored for ``args.trace`` with ``options`` and its result.json (see
    :meth:`profparse.cache.Entry.put_output`), or None; like :func:`stored_text`."""
    out = getattr(args, "out", None)
    return _stored(args, args.trace, (out,) if out else (), lambda store, name: store.get_output(name, options))


def output_options(args: argparse.Namespace, libraries: tuple[str, ...]) -> dict[str, Any]:
    """:func:`text_options` of a verb that writes files, less where they go (``-o``, ``--force``: the files are
    the same), plus the libraries that render them."""
    from profparse.cache import library_stamp

    options = {k: v for k, v in text_options(args).items() if k not in ("out", "force")}
    options["libraries"] = library_stamp(libraries)
    return options
