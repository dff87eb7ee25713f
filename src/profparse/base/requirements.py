"""The versions of its dependencies that profparse needs, checked before any of them is imported.

A dependency below its floor (or one built for numpy 1 under numpy 2) fails in ways a user cannot read: an
``AttributeError`` deep in a pandas call, or numpy's long "compiled using NumPy 1.x" message with a traceback.
:func:`check_dependencies` reads the installed versions from package metadata, without importing the packages, and
raises one line that names the package, the version found and the one needed. ``pyproject.toml`` declares the
same floors (tests/test_dependencies.py keeps the two in step).
"""

from __future__ import annotations

import os
import re
import sys

from profparse.base.errors import UsageError

#: the floors ``pyproject.toml`` declares
FLOORS = {
    "numpy": "1.24.1",
    "pandas": "2.0",
    "pyarrow": "14",
    "matplotlib": "3.7",
    "msgspec": "0.18",
    "tqdm": "4.60",
    "xxhash": "3.0",
}
#: floors under numpy 2: older wheels of these were built against numpy 1 and fail to import (a pip resolver cannot
#: say this in pyproject.toml, so it is checked here)
NUMPY2_FLOORS = {"pandas": "2.2.2", "pyarrow": "16", "matplotlib": "3.8.4"}


class DependencyError(UsageError):
    """A dependency is missing or older than profparse needs (exit 2)."""


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version (``"3.8.4rc1"`` -> ``(3, 8, 4)``), for comparing releases."""
    return tuple(int(part) for part in re.findall(r"\d+", re.match(r"[\d.]*", text).group(0)))


_DIST_INFO = re.compile(r"^([A-Za-z0-9_.]+)-([0-9][^-]*?)(?:-py[0-9.]+)?\.(?:dist|egg)-info$")


def installed_versions(names: list[str]) -> dict[str, str | None]:
    """The version of each of ``names`` as installed on ``sys.path`` (the first found, as import finds it), read
    from the names of ``*.dist-info`` folders: importing ``importlib.metadata`` alone costs ~100 ms, more than the
    rest of a command's start. A package found on no path entry is looked up the slow way (a missing one: None)."""
    wanted = {_normal(name): name for name in names}
    found: dict[str, str | None] = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            match = _DIST_INFO.match(item)
            name = wanted.get(_normal(match.group(1))) if match else None
            if name is not None and name not in found:
                found[name] = match.group(2)
    for name in names:
        if name not in found:
            found[name] = _metadata_version(name)
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata_version(name: str) -> str | None:
    import importlib.metadata
    import importlib.util

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "" if importlib.util.find_spec(name) is not None else None  # importable, version unknown: not judged


def problems(installed: dict[str, str | None] | None = None) -> list[str]:
    """One line per dependency that is missing or too old (``installed``: name -> version, else read here)."""
    found = installed if installed is not None else installed_versions(list(FLOORS))
    numpy = found.get("numpy")
    floors = dict(FLOORS)
    if numpy is not None and version_tuple(numpy) >= (2,):
        floors.update(NUMPY2_FLOORS)
    lines = []
    for name, floor in floors.items():
        have = found.get(name)
        under_numpy2 = " with numpy 2" if name in NUMPY2_FLOORS and floor == NUMPY2_FLOORS[name] else ""
        if have == "":
            continue
        if have is None:
            lines.append(f"{name} is not installed; profparse needs {name}>={floor} (pip install '{name}>={floor}')")
        elif version_tuple(have) < version_tuple(floor):
            lines.append(
                f"{name} {have} is installed; profparse needs {name}>={floor}{under_numpy2} "
                f"(pip install -U '{name}>={floor}')"
            )
    return lines


def check_dependencies() -> None:
    """Raise :class:`DependencyError` naming every dependency that cannot work, on one line."""
    found = problems()
    if found:
        raise DependencyError("; ".join(found))
