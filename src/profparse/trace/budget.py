"""How much memory a trace needs and how much there is: the early refusal of a trace too large for the machine."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from profparse.base.errors import OutOfMemoryError, UsageError

MEMORY_ENV = "PROFPARSE_MEMORY_LIMIT"
DEBUG_ENV = "PROFPARSE_MEMORY_DEBUG"  # "1": print each estimate and its parts on stderr
# peak memory of summarize/parse ~ NEED_FIXED + max(NEED_PER_JSON_BYTE x the JSON, the tables' need per event)
# + what the distinct strings take. NEED_FIXED: what Python, numpy, pandas and pyarrow take themselves once
# imported: ~105 MiB on Python 3.11, ~135 MiB on Python 3.13 with the newest numpy, pandas and pyarrow (their
# libraries' mapped pages are larger there), with room over the larger. The tables hold
# every event whatever its JSON size (one-field events: ~55 bytes of JSON, ~800 bytes of memory), and the
# analyses keep columns per op (flops, efficiency, the op tree), per Python frame (the stack tree) and per GPU
# event (linking, streams); every distinct string is a Python object in a categorical's categories, hashed once
# or twice. Fitted to the peaks of scripts/memory_cases.py (unique names, unique thread ids, tiny events, Python
# functions, GPU events) and of the real traces; see docs/performance.md.
NEED_FIXED = 160 << 20
NEED_PER_JSON_BYTE = 1.5
NEED_PER_EVENT = 250
NEED_PER_OP = 550
NEED_PER_PYTHON = 300
NEED_PER_GPU = 250
NEED_PER_STRING = 200
NEED_PER_CHAR = 3
BYTES_PER_EVENT = 200  # Kineto events take 200-250 bytes of JSON: sizes the event table before reading


@dataclass
class Tally:
    """What a trace holds, as far as memory goes: events, and of them ops (``cpu_op``), Python functions and GPU
    events; distinct strings (names, categories, text args) and their characters."""

    events: float = 0
    ops: float = 0
    python: float = 0
    gpu: float = 0
    strings: float = 0
    chars: float = 0

    def scaled(self, factor: float) -> Tally:
        """The counts projected to ``factor`` times as much JSON (distinct strings too: a trace of unique names
        goes on as it started; a real trace's strings repeat, and the check after reading counts them exactly)."""
        return Tally(*(factor * value for value in astuple(self)))


def estimate(json_bytes: float, tally: Tally | None = None) -> tuple[float, dict[str, float]]:
    """The peak memory (bytes) a trace of ``json_bytes`` of JSON holding ``tally`` needs, and its parts."""
    t = tally or Tally()
    parts = {
        "fixed": float(NEED_FIXED),
        "json": NEED_PER_JSON_BYTE * json_bytes,
        "events": float(
            NEED_PER_EVENT * t.events + NEED_PER_OP * t.ops + NEED_PER_PYTHON * t.python + NEED_PER_GPU * t.gpu
        ),
        "strings": float(NEED_PER_STRING * t.strings + NEED_PER_CHAR * t.chars),
    }
    return parts["fixed"] + max(parts["json"], parts["events"]) + parts["strings"], parts


def _size(text: str) -> int:
    """``"1.5G"``, ``"800M"``, ``"123456"`` -> bytes (binary units)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if found is None:
        raise UsageError(f"{MEMORY_ENV}={text!r}: expected a size such as 4G, 800M or a number of bytes")
    return int(float(found.group(1)) * units[found.group(2).upper()])


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# (controller folder under the cgroup mount, limit file, usage file); v1's "no limit" is a number near 2**63
CGROUP_FILES = {
    "v2": ("", "memory.max", "memory.current"),
    "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
}


def _cgroup_left(folder: Path, limit_name: str, usage_name: str) -> int | None:
    """``limit - usage`` of one cgroup folder, or None when it has no limit (or the files cannot be read)."""
    try:
        limit = (folder / limit_name).read_text().strip()
        usage = int((folder / usage_name).read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= 1 << 60:  # "max" (v2), or v1's page-rounded 2**63
        return None
    return max(int(limit) - usage, 0)


def cgroup_memory_left(proc: Path | None = None, root: Path | None = None) -> int | None:
    """Bytes left under the memory limits of this process's cgroups (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``, each less what is in use), the tightest of its folder and every parent up to the
    mount; None where none is set. A container that shows its own cgroup as the mount's root is read there."""
    proc, root = proc or PROC_CGROUP, root or CGROUP_ROOT
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    lefts = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        version = "v2" if hierarchy == "0" and not controllers else "v1" if "memory" in controllers.split(",") else ""
        if not version:
            continue
        sub, limit_name, usage_name = CGROUP_FILES[version]
        base = root / sub if sub else root
        folder = base / path.strip("/")
        folder = folder if folder.is_dir() else base
        while True:
            left = _cgroup_left(folder, limit_name, usage_name)
            if left is not None:
                lefts.append(left)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(lefts) if lefts else None


def memory_budget() -> tuple[int | None, str]:
    """Bytes this process may still take, and what says so: ``$PROFPARSE_MEMORY_LIMIT``, else the smallest of
    ``MemAvailable`` (/proc/meminfo), what is left under the cgroup memory limit (v1 or v2: a container's or a
    job's; exceeding it is the kernel's OOM kill) and the address-space limit (``ulimit -v``) minus what is
    mapped already."""
    env = os.environ.get(MEMORY_ENV, "").strip()
    if env:
        return _size(env), f"allowed by {MEMORY_ENV}"
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "available"))
    except (OSError, ValueError, IndexError):
        pass
    cgroup = cgroup_memory_left()
    if cgroup is not None:
        found.append((cgroup, "left under the memory limit of its cgroup"))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            mapped = 0
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmSize:"):
                    mapped = int(line.split()[1]) * 1024
            found.append((max(soft - mapped, 0), "left under the address-space limit (ulimit -v)"))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(found) if found else (None, "")


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc cannot say)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _debug(path: str, stage: str, need: float, parts: dict[str, float], tally: Tally | None, held: int) -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        counts = ", ".join(f"{k} {v:,.0f}" for k, v in vars(tally).items()) if tally else "no counts"
        sizes = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in parts.items())
        print(
            f"profparse: memory estimate [{stage}]: {need / 2**20:.1f} MiB = fixed + max(json, events) + strings "
            f"({sizes} MiB; {counts}; held {held / 2**20:.1f} MiB) {path}",
            file=sys.stderr,
        )


def check_memory(
    path: str,
    json_bytes: float,
    disk_bytes: int | None = None,
    tally: Tally | None = None,
    *,
    held: int = 0,
    stage: str = "before",
) -> None:
    """Raise :class:`OutOfMemoryError` when ``json_bytes`` of JSON holding ``tally`` (None: not known yet) need
    more memory than there is (:func:`estimate`); ``disk_bytes``: the size of the compressed file they are
    inflated from, for the message; ``held``: what this process has taken for the trace already (counted in the
    estimate, and no longer in what is left, except under ``$PROFPARSE_MEMORY_LIMIT``, which bounds the whole);
    ``stage``: before, while or after reading, for ``$PROFPARSE_MEMORY_DEBUG``."""
    need, parts = estimate(json_bytes, tally)
    _debug(path, stage, need, parts, tally, held)
    budget, source = memory_budget()
    if budget is None or need - (0 if source.startswith("allowed") else held) <= budget:
        return
    inflated = f", inflated from {_human(disk_bytes)} on disk" if disk_bytes is not None else ""
    if tally is not None and parts["events"] > parts["json"]:
        inflated += f", about {tally.events / 1e6:.1f} M events"
    if tally is not None and parts["strings"] > 0.25 * need:
        inflated += f", about {tally.strings / 1e6:.1f} M distinct names"
    held_text = f" ({_human(held)} of it in use already)" if held and not source.startswith("allowed") else ""
    raise OutOfMemoryError(
        f"{path}: needs about {_human(need)} of memory{held_text} for about {_human(json_bytes)} of JSON{inflated}; "
        f"{_human(budget)} {source}. Run it where more memory is free (or set {MEMORY_ENV} to a larger "
        "size to try anyway)"
    )


def memory_left() -> str:
    """What :func:`memory_budget` says is left, for a message."""
    budget, source = memory_budget()
    return "no limit known" if budget is None else f"{budget >> 20} MiB {source}"


def _load_malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc keeps it otherwise): big numpy arrays come from fresh
    mappings, not from that kept memory, so without this it only inflates the resident size. Takes a few ms."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


#: glibc's mallopt option for the size from which an allocation gets its own mapping (M_MMAP_THRESHOLD)
_M_MMAP_THRESHOLD = -3
#: from 4 MiB: every column, mask and temporary of a big trace is a mapping given back when it is freed (from 1 MiB
#: the peak was no lower, with more time in page faults)
MMAP_THRESHOLD = 4 << 20
#: glibc's mallopt option for the free memory at the top of the heap it keeps (M_TRIM_THRESHOLD)
_M_TRIM_THRESHOLD = -1
#: 8 MiB, not glibc's 128 KiB (fixed once the mmap threshold is set): the reader takes in a decoded chunk of ~1.5 MB
#: at a time, and with the small threshold the heap's top was given back after each chunk and faulted in again for
#: the next (180 K page faults of the parent and 130 K of the workers on a 300 MB trace, ~1 s of system time); the
#: peak is no higher, since :func:`release_memory` gives the rest back between the stages
TRIM_THRESHOLD = 8 << 20


def map_big_allocations() -> None:
    """Give every allocation from :data:`MMAP_THRESHOLD` its own mapping, unless ``$MALLOC_MMAP_THRESHOLD_`` says
    otherwise, and keep up to :data:`TRIM_THRESHOLD` free at the heap's top, unless ``$MALLOC_TRIM_THRESHOLD_``
    does (the command line calls this at its start; forked workers inherit it). glibc raises its threshold
    each time it frees such a mapping (up to 32 MiB), after which freed temporaries of that size stay in its heap,
    resident, where :func:`release_memory` cannot always give them back: ~45 MB of the peak of ``parse`` on a
    300 MB trace, for a few tenths of a second of page faults more."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt  # glibc only
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        pass


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> None:
    """Make Arrow allocate from the C library's allocator in this process and its children, unless
    ``$ARROW_DEFAULT_MEMORY_POOL`` says otherwise (the command line calls this at its start: Arrow reads the
    variable when it first allocates). Arrow's default (mimalloc) keeps freed memory resident: pandas' text
    columns, the Parquet encoders and the readers left tens of MB more in use at the peak of ``parse`` on a 300 MB
    trace, memory that :func:`release_memory` cannot give back."""
    os.environ.setdefault(ARROW_POOL_ENV, "system")
