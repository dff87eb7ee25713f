"""Kineto's own log lines, kept off the user's terminal during a capture.

Kineto writes ``USDT:... profiler_start`` / ``profiler_stop`` (and, at some log levels, ``STAGE:``) lines straight
to file descriptor 2 from C++, whatever ``KINETO_LOG_LEVEL`` says; Python's ``sys.stderr`` cannot catch them.
:func:`kineto_lines_dropped` puts a pipe in front of descriptor 2 and forwards everything else as it comes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

KINETO_LINE = re.compile(rb"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy ``read_fd`` to ``write_fd`` line by line (a ``\\r`` ends a line too: progress bars stay live), leaving
    out Kineto's log lines."""
    pending = b""
    while chunk := os.read(read_fd, 65536):
        pending += chunk
        *lines, pending = re.split(rb"(?<=[\r\n])", pending)
        kept = b"".join(line for line in lines if not KINETO_LINE.match(line))
        if kept:
            os.write(write_fd, kept)
    if pending and not KINETO_LINE.match(pending):
        os.write(write_fd, pending)


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Within the block, descriptor 2 loses Kineto's log lines and keeps everything else."""
    try:
        original = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:  # no descriptor 2, or none left: leave stderr alone
        yield
        return
    sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    forwarder = threading.Thread(target=_forward, args=(read_fd, original), daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the forwarder reads to the end and stops
        forwarder.join(timeout=5)
        os.close(read_fd)
        os.close(original)
