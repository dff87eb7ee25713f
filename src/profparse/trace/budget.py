"""How much memory a trace needs and how much there is: the early refusal of a trace too large for the machine."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from profparse.base.errors import OutOfMemoryError, UsageError

MEMORY_ENV = "PROFPARSE_MEMORY_LIMIT"
# peak memory ~ NEED_PER_JSON_BYTE x the JSON + NEED_FIXED: the peak that docs/performance.md reports, on top of
# what Python, pandas and pyarrow take themselves
NEED_PER_JSON_BYTE = 1.5
NEED_FIXED = 128 << 20
# ... or, for events smaller than ~170 bytes of JSON, per event: the tables hold every event whatever its size
# (a100 tile: ~270 bytes per event in all; 0.9 M one-field events: ~730), so this floor never exceeds a real trace's
NEED_PER_EVENT = 250
BYTES_PER_EVENT = 200  # Kineto events take 200-250 bytes of JSON: sizes the event table before reading


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


def check_memory(path: str, json_bytes: float, disk_bytes: int | None = None, events: float = 0) -> None:
    """Raise :class:`OutOfMemoryError` when ``json_bytes`` of JSON (about ``events`` events, 0: not known yet)
    need more memory than there is; ``disk_bytes``: the size of the compressed file they are inflated from, for
    the message."""
    need = max(NEED_PER_JSON_BYTE * json_bytes, NEED_PER_EVENT * events) + NEED_FIXED
    budget, source = memory_budget()
    if budget is None or need <= budget:
        return
    inflated = f", inflated from {_human(disk_bytes)} on disk" if disk_bytes is not None else ""
    inflated += (
        f", about {events / 1e6:.1f} M events" if NEED_PER_EVENT * events > NEED_PER_JSON_BYTE * json_bytes else ""
    )
    raise OutOfMemoryError(
        f"{path}: needs about {_human(need)} of memory for about {_human(json_bytes)} of JSON{inflated}; "
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


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> None:
    """Make Arrow allocate from the C library's allocator in this process and its children, unless
    ``$ARROW_DEFAULT_MEMORY_POOL`` says otherwise (the command line calls this at its start: Arrow reads the
    variable when it first allocates). Arrow's default (mimalloc) keeps freed memory resident: pandas' text
    columns, the Parquet encoders and the readers left tens of MB more in use at the peak of ``parse`` on a 300 MB
    trace, memory that :func:`release_memory` cannot give back."""
    os.environ.setdefault(ARROW_POOL_ENV, "system")
