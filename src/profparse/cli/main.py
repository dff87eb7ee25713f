"""``profparse`` command line: one small module per verb, all thin over the library API.

Every user-caused error ends here as one line and its documented exit code (docs/exit-codes.md): profparse's own
errors carry their code (profparse.base.errors), argparse errors are exit 2, and an ``OSError`` that got this far is
mapped by its kind (disk full 10, an input's path 3, an output's path 11).
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM while the verbs' modules load (before main() can catch it): the same one line and exit
    as later (nothing has been written yet)."""
    if signum == signal.SIGTERM:
        print("profparse: terminated (SIGTERM); nothing was left half-written", file=sys.stderr)
        os._exit(143)
    print("profparse: interrupted", file=sys.stderr)
    os._exit(130)


def _set_handler(handler: object, sig: int = signal.SIGINT) -> object:
    """Install a signal handler where Python allows it (the main thread); the previous one, or None. A signal the
    parent ignores (``nohup``, a background job of a script) stays ignored, as Python itself leaves it."""
    try:
        if signal.getsignal(sig) == signal.SIG_IGN:
            return None
        return signal.signal(sig, handler)  # type: ignore[arg-type]
    except (ValueError, TypeError):  # not the main thread, or no Python-level handler to restore
        return None


_started_with = _set_handler(_interrupted_while_starting)  # restored at the end of this module
_term_started_with = _set_handler(_interrupted_while_starting, signal.SIGTERM)

import argparse  # noqa: E402
import importlib  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import NoReturn  # noqa: E402

from profparse.base.errors import OutputWriteError, ProfparseError, UsageError, from_oserror  # noqa: E402
from profparse.base.formats import display  # noqa: E402
from profparse.base.version import __version__  # noqa: E402
from profparse.cli import common  # noqa: E402

#: The verbs, in the order ``--help`` lists them: each is the module ``profparse/cli/<verb>_cmd.py`` with
#: ``add_parser(subparsers)``; a new verb is its module plus its name here.
VERBS = ("parse", "summarize", "advise", "plot", "report", "annotate", "diff", "hta")

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C, so temporary outputs are removed on the way out."""


#: The signal (SIGINT, SIGTERM) that arrived during :func:`main`, if any. An exception raised after it is its
#: consequence: code that caught the KeyboardInterrupt and raised something else in C (numpy's "Importing the
#: numpy C-extensions failed" ImportError, when the Ctrl-C lands while numpy loads) keeps no trace of it.
_signalled: int | None = None


def _interrupt(signum: int, frame: object) -> None:
    global _signalled
    _signalled = signal.SIGINT
    raise KeyboardInterrupt


def _terminate(signum: int, frame: object) -> None:
    global _signalled
    _signalled = signal.SIGTERM
    raise Terminated


#: How long after a signal was lost (below) it is raised again.
REDELIVER_S = 0.01
#: The SIGALRM handler :func:`_lost_signal` replaced, put back at the end of :func:`main`.
_alarm_before: object = None


def _lost_signal(hook_args: object) -> None:
    """``sys.unraisablehook`` during :func:`main`. A signal that lands while Python runs code whose exceptions it
    ignores (a weakref callback of the import system, a ``__del__``) raises its KeyboardInterrupt there: Python
    prints "Exception ignored" with a traceback and goes on as if no signal came. Such an exception is raised
    again a moment later (SIGALRM), where it ends the run as any Ctrl-C does; any other goes to Python's hook."""
    global _alarm_before
    exc_type = getattr(hook_args, "exc_type", None)
    if _signalled is not None and isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt | Terminated):
        if signal.getsignal(signal.SIGALRM) is not _raise_again:
            _alarm_before = _set_handler(_raise_again, signal.SIGALRM)
        if signal.getsignal(signal.SIGALRM) is _raise_again:  # (not where SIGALRM is ignored)
            signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)
        return
    sys.__unraisablehook__(hook_args)  # type: ignore[arg-type]


def _raise_again(signum: int, frame: object) -> None:
    """SIGALRM after a lost signal: its exception, raised where the program runs now (again lost: again later)."""
    raise Terminated if _signalled == signal.SIGTERM else KeyboardInterrupt


def _no_lost_signals() -> None:
    """The end of :func:`main`: no signal raised again after it, the SIGALRM handler and Python's hook back."""
    global _alarm_before
    if signal.getsignal(signal.SIGALRM) is _raise_again:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _set_handler(_alarm_before if _alarm_before is not None else signal.SIG_DFL, signal.SIGALRM)
        _alarm_before = None
    sys.unraisablehook = sys.__unraisablehook__


def stopped_by(exc: BaseException) -> int | None:
    """The signal an exception stands for: SIGINT for a KeyboardInterrupt (SIGTERM for :class:`Terminated`), in
    itself or anywhere in its ``__cause__`` / ``__context__`` chain, else the signal that arrived during the run;
    None for a plain error."""
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return signal.SIGINT
        if isinstance(current, Terminated):
            return signal.SIGTERM
        pending += [current.__cause__, current.__context__]
    return _signalled


def _stopped(signum: int) -> int:
    """The one line and exit code of a run ended by ``signum``."""
    if signum == signal.SIGTERM:
        print("profparse: terminated (SIGTERM); nothing was left half-written", file=sys.stderr)
        return EXIT_TERMINATED
    print("profparse: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


EXIT_OUT_OF_MEMORY = 8


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr (``profparse: error: ...``), exit 2."""

    tool = "profparse"

    def error(self, message: str) -> NoReturn:
        # the message quotes the command line (unrecognized arguments, a bad value), which may hold anything a
        # shell glob matched: escaped like every other line profparse prints
        print(display(f"{self.tool}: error: {message} (see '{self.prog} --help')"), file=sys.stderr)
        raise SystemExit(UsageError.exit_code)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="profparse",
        description="Attribute a PyTorch (Kineto) trace to load / forward / backward / optimizer.",
        epilog="Exit codes: see docs/exit-codes.md. Set PROFPARSE_DEBUG=1 for tracebacks.",
    )
    parser.add_argument("--version", action="version", version=f"profparse {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb in VERBS:
        importlib.import_module(f"profparse.cli.{verb}_cmd").add_parser(sub)
    return parser


def guard_std_streams() -> None:
    """Give closed standard streams (``>&-``) /dev/null, so no file profparse opens lands on fd 0-2 (a later
    write "to stdout" would then go into that file); remember a closed stdout (verbs printing results refuse)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            if fd == 1:
                common.STDOUT_CLOSED = True
    if sys.stdout is None:
        common.STDOUT_CLOSED = True
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


def _inputs(args: argparse.Namespace) -> list[str]:
    return [str(getattr(args, k)) for k in ("trace", "a", "b") if getattr(args, k, None)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; its exit code (docs/exit-codes.md)."""
    global _signalled
    guard_std_streams()
    _signalled = None
    previous_int = _set_handler(_interrupt)
    if hasattr(signal, "setitimer") and sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _lost_signal
    try:
        return _main(argv)
    except (KeyboardInterrupt, Terminated) as exc:  # a signal that landed while an error was being reported
        return _stopped(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    finally:
        if sys.unraisablehook is _lost_signal:
            _no_lost_signals()
        if previous_int is not None:
            _set_handler(previous_int)


def _main(argv: Sequence[str] | None) -> int:
    args = None
    previous_term = None
    try:  # the verbs import what they need as they start (lazily): a Ctrl-C during those imports is an interrupt too
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # a usage error (one line, already printed), --help or --version
            return exc.code if isinstance(exc.code, int) else UsageError.exit_code
        from profparse.base import files
        from profparse.base.requirements import check_dependencies

        check_dependencies()  # before a verb imports numpy, pandas or pyarrow
        quiet = getattr(args, "quiet", False)
        files.wait_notice = (lambda text: common.note(text, quiet)) if not quiet else None
        previous_term = _set_handler(_terminate, signal.SIGTERM)
        if common.STDOUT_CLOSED and getattr(args, "prints_result", False):
            raise OutputWriteError("standard output is closed (redirect it to a file or to /dev/null instead)")
        return int(args.run(args) or 0)
    except (KeyboardInterrupt, Terminated) as exc:
        return _stopped(stopped_by(exc) or signal.SIGINT)
    except Exception as exc:  # noqa: BLE001 - last resort: one line, never a traceback unless asked
        signum = stopped_by(exc)  # an error a signal caused (it broke an import, a read) is that signal
        return _stopped(signum) if signum is not None else _report(exc, args)
    finally:
        files_module = sys.modules.get("profparse.base.files")
        if files_module is not None:
            files_module.wait_notice = None
        if previous_term is not None:
            _set_handler(previous_term, signal.SIGTERM)


def _report(exc: Exception, args: argparse.Namespace | None) -> int:
    """The one line and exit code of an error that reached the command line."""
    if isinstance(exc, ProfparseError):
        return report_error(exc)
    if isinstance(exc, MemoryError):
        print("profparse: error: out of memory", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    if isinstance(exc, ImportError) and not (exc.name or "").startswith("profparse"):
        print(f"profparse: error: a dependency failed to import: {display(exc)} (reinstall it)", file=sys.stderr)
        return UsageError.exit_code
    if isinstance(exc, BrokenPipeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if isinstance(exc, OSError):
        mapped = from_oserror(exc, inputs=_inputs(args) if args is not None else [])
        if isinstance(mapped, ProfparseError):
            return report_error(mapped)
        if isinstance(mapped, MemoryError):
            print("profparse: error: out of memory", file=sys.stderr)
            return EXIT_OUT_OF_MEMORY
    return _internal(exc)


def report_error(exc: ProfparseError, tool: str = "profparse") -> int:
    """Print ``exc`` as its one line (names from the trace or the command line escaped); its exit code."""
    print(f"{tool}: error: {display(exc)}", file=sys.stderr)
    return exc.exit_code


def _internal(exc: Exception) -> int:
    if os.environ.get("PROFPARSE_DEBUG"):
        raise exc
    message = f"{type(exc).__name__}: {display(exc)}"
    print(f"profparse: internal error: {message} (PROFPARSE_DEBUG=1 shows more)", file=sys.stderr)
    return EXIT_INTERNAL


_set_handler(_started_with if callable(_started_with) else signal.default_int_handler)  # modules loaded
_set_handler(_term_started_with if _term_started_with is not None else signal.SIG_DFL, signal.SIGTERM)


def entry() -> NoReturn:
    """The ``profparse`` command: :func:`main`, then exit without tearing down the heap.

    Every output is complete (renamed into place) when ``main`` returns; freeing the tables of a large trace
    piece by piece took about a second of wall time after that (docs/performance.md), so the process ends
    at once after flushing its streams. Tests call :func:`main`, which returns normally.
    """
    # The resource tracker (a process multiprocessing starts for the rank workers' semaphores) takes its warning
    # options from this one. After a Ctrl-C, the exit function below releases what the pool still holds; a Ctrl-C
    # to the whole process group while the pool starts can still leave the tracker a semaphore that it then
    # removes itself, with two lines of "leaked semaphore" warnings on stderr after "profparse: interrupted" (seen
    # in a CI run of tests/test_ranks.py::test_ctrl_c_while_the_pool_starts). The clean-up is its job; its
    # warnings about doing it are not the user's business.
    sys.warnoptions.append("ignore::UserWarning:multiprocessing.resource_tracker")
    from profparse.trace.budget import map_big_allocations, use_system_allocator

    use_system_allocator()  # before anything imports pyarrow
    map_big_allocations()
    code = main()
    if code == EXIT_INTERRUPTED and "multiprocessing.util" in sys.modules:
        # a stopped worker pool's semaphores: released as the normal exit would (else the resource tracker warns
        # about them on stderr); not the normal exit itself, where a late second Ctrl-C can kill the process
        try:
            sys.modules["multiprocessing.util"]._exit_function()
        except BaseException:  # noqa: BLE001 - exiting anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
