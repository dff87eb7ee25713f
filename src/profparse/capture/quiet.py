"""Kineto's own log lines, kept off the user's terminal during a capture.

Kineto writes ``USDT:... profiler_start`` / ``profiler_stop`` (and, at some log levels, ``STAGE:``) lines straight
to file descriptor 2 from C++, whatever ``KINETO_LOG_LEVEL`` says; Python's ``sys.stderr`` cannot catch them.
:func:`kineto_lines_dropped` puts a pipe in front of descriptor 2 and forwards everything else as it comes.

A CUDA build of torch on a machine without a GPU driver also has Kineto say ``ERROR:... DeviceProperties.cpp:56]
gpuGetDeviceCount failed with code 35`` when the profiler stops: on a CPU capture that is no error of the user's
(``no_gpu``); on a GPU capture it would be, and it is kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

KINETO_LINE = re.compile(rb"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
NO_GPU_LINE = re.compile(
    rb"^ERROR:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed"
)


def _forward(read_fd: int, write_fd: int, dropped: tuple[re.Pattern[bytes], ...] = (KINETO_LINE,)) -> None:
    """Copy ``read_fd`` to ``write_fd`` line by line (a ``\\r`` ends a line too: progress bars stay live), leaving
    out the lines that match one of ``dropped``."""
    pending = b""
    while chunk := os.read(read_fd, 65536):
        pending += chunk
        *lines, pending = re.split(rb"(?<=[\r\n])", pending)
        kept = b"".join(line for line in lines if not any(p.match(line) for p in dropped))
        if kept:
            os.write(write_fd, kept)
    if pending and not any(p.match(pending) for p in dropped):
        os.write(write_fd, pending)


@contextlib.contextmanager
def kineto_lines_dropped(no_gpu: bool = False) -> Iterator[None]:
    """Within the block, descriptor 2 loses Kineto's log lines (with ``no_gpu``, a capture on the CPU: also its
    line that no GPU driver was found) and keeps everything else."""
    try:
        original = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:  # no descriptor 2, or none left: leave stderr alone
        yield
        return
    sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    dropped = (KINETO_LINE, NO_GPU_LINE) if no_gpu else (KINETO_LINE,)
    forwarder = threading.Thread(target=_forward, args=(read_fd, original, dropped), daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the forwarder reads to the end and stops
        forwarder.join(timeout=5)
        os.close(read_fd)
        os.close(original)
