"""Per-phase wall times of the data path, printed to stderr when ``PROFPARSE_PROFILE_PHASES`` is set.

Used by ``scripts/bench.py``: one line per phase, ``profparse-phase NAME SECONDS CPU_SECONDS PEAK_RSS_MB`` (CPU:
this process's threads plus its finished child processes, e.g. the decoding workers; on a loaded machine it moves
much less than wall time. Peak RSS: this process's high-water mark so far, so the phase where it rises is the one
that sets the peak). Off by default; when off, :func:`phase` costs a few microseconds. Phases that run in two
threads at once (the tables and their Parquet encoding, see ``outputs/parquet.py``) are summed over the threads
with :class:`Totals`.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "PROFPARSE_PROFILE_PHASES"
ENABLED = bool(os.environ.get(ENV, "").strip())


def _since_process_start() -> float | None:
    """Seconds since this process was created (Linux: /proc), i.e. interpreter start-up plus imports so far."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def cpu() -> float:
    """CPU seconds used so far by this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def emit(name: str, seconds: float, cpu_seconds: float | None = None) -> None:
    """Print one phase's time (only when enabled)."""
    if ENABLED:
        extra = "" if cpu_seconds is None else f" {cpu_seconds:.4f}"
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"profparse-phase {name} {seconds:.4f}{extra} {peak_mb:.0f}", file=sys.stderr, flush=True)


def startup() -> None:
    """Print the time from process creation to now (call where the work starts)."""
    if ENABLED:
        since = _since_process_start()
        if since is not None:
            emit("startup+imports", since, cpu())


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name``."""
    if not ENABLED:
        yield
        return
    t0, c0 = time.perf_counter(), cpu()
    try:
        yield
    finally:
        emit(name, time.perf_counter() - t0, cpu() - c0)


class Totals:
    """Seconds summed per phase over calls and threads (``+=`` on a float under the GIL is enough here)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        if ENABLED:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def emit(self) -> None:
        for name, seconds in self.seconds.items():
            emit(name, seconds, 0.0)  # summed over threads: no CPU figure of their own
        self.seconds.clear()
