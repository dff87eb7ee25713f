"""Helpers shared by the verbs: reading the input, writing the result, replaying a stored one (their options:
:mod:`profparse.cli.options`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.base.errors import NoSpaceError, OutputWriteError, from_oserror, is_no_space
from profparse.base.formats import display
from profparse.cli.progress import reading_bar

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

#: True when the process started with its standard output closed (``>&-``); see main.guard_std_streams.
STDOUT_CLOSED = False


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


def note(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"profparse: {display(message)}", file=sys.stderr)  # trace and file names may hold control characters


def parse_input(args: argparse.Namespace) -> Any:
    """Run the library's data path on ``args.trace`` with the common options (through the cache, docs/cache.md)."""
    from profparse.api import load

    progress = reading_bar(args.trace, args.quiet)
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


def input_notes(trace: str, parsed: ParsedTrace) -> list[str]:
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
    :meth:`profparse.cache.entry.Entry.put_text`), or None. Silent but for a damaged text: on a miss, loading the
    trace opens the cache again and says what it has to say."""
    return _stored(args, trace or args.trace, (), lambda store, name: store.get_text(name, options))


def replay_text(args: argparse.Namespace, stored: dict[str, Any]) -> int:
    """Print a stored result as the run that stored it did (its notes, its output); its exit code."""
    for message in stored["notes"]:
        note(message, args.quiet)
    emit(stored["stdout"])
    return stored["code"]


def print_trace_text(args: argparse.Namespace, render: Callable[[Any], str]) -> int:
    """A text verb on one trace: print what the same command stored for this trace and code, else
    ``render(parsed)``, printed and stored in the trace's cache entry with its notes. Exit 0."""
    options = text_options(args)
    stored = stored_text(args, options)
    if stored is not None:  # this trace, these options, this code: print what the first run printed
        return replay_text(args, stored)
    parsed = parse_input(args)
    text = render(parsed)
    emit(text)
    if parsed.cache is not None:
        parsed.cache.put_text(options, text, input_notes(args.trace, parsed), 0)
    return 0


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
    from profparse.cache.keys import load_options
    from profparse.cache.store import Cache

    heard: list[str] = []
    store = Cache.open(notify=heard.append, inputs=[trace], outputs=outputs)
    if store is None:
        return None
    key = store.key(trace, load_options(not args.no_marks, args.strict, getattr(args, "peak_tflops", None)))
    return None if key is None else (store, key[0], heard)


def stored_output(args: argparse.Namespace, options: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """The files a verb stored for ``args.trace`` with ``options`` and its result.json (see
    :meth:`profparse.cache.entry.Entry.put_output`), or None; like :func:`stored_text`."""
    out = getattr(args, "out", None)
    return _stored(args, args.trace, (out,) if out else (), lambda store, name: store.get_output(name, options))


def output_options(args: argparse.Namespace, libraries: tuple[str, ...]) -> dict[str, Any]:
    """:func:`text_options` of a verb that writes files, less where they go (``-o``, ``--force``: the files are
    the same), plus the libraries that render them."""
    from profparse.cache.keys import library_stamp

    options = {k: v for k, v in text_options(args).items() if k not in ("out", "force")}
    options["libraries"] = library_stamp(libraries)
    return options
