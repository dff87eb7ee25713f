"""Errors profparse reports to users, each with its documented exit code (see docs/exit-codes.md)."""

from __future__ import annotations


class ProfparseError(Exception):
    """Base class: a problem with the user's input or request, reported as one line."""

    exit_code = 1


class UsageError(ProfparseError):
    """Bad command-line use (unknown option values, conflicting flags)."""

    exit_code = 2


class InputNotFoundError(ProfparseError):
    """The input path does not exist or is not the kind of path expected."""

    exit_code = 3


class TraceFormatError(ProfparseError):
    """The input is not a readable Kineto trace (not JSON, corrupt gzip, no traceEvents, ...)."""

    exit_code = 4


class TruncatedTraceError(TraceFormatError):
    """The trace ends before its event array is closed (raised only with ``strict=True``)."""

    exit_code = 5


class OutputExistsError(ProfparseError):
    """An output already exists and ``--force`` was not given."""

    exit_code = 6


class PartialFailureError(ProfparseError):
    """Some ranks of a multi-rank run failed; the others were written."""

    exit_code = 7


class OutOfMemoryError(ProfparseError):
    """The input needs more memory than this machine (or process limit) has; the message says how much."""

    exit_code = 8
