"""What ``pip install profparse`` and each extra install, and their size on disk (docs/integrations.md).

The list: ``pip install --dry-run --ignore-installed --report`` of this checkout (asks the package index; nothing
is installed). The sizes: each distribution's files as its ``RECORD`` lists them, from this venv; a distribution
this venv lacks (the CUDA libraries of PyPI's torch, where this venv holds the CPU build) is named, not counted.

    python scripts/install_sizes.py [base capture dask]
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def installed_size(name: str) -> int | None:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    total = 0
    for entry in dist.files or []:
        try:
            total += os.path.getsize(dist.locate_file(entry))
        except OSError:
            pass
    return total


def resolved(extra: str) -> list[str]:
    """The distributions ``pip install .[extra]`` would install into an empty environment."""
    target = f"{REPO}[{extra}]" if extra != "base" else str(REPO)
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report"]
        subprocess.run([*command, str(report), target], check=True, capture_output=True)
        return [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]


def main() -> None:
    for extra in sys.argv[1:] or ["base", "capture", "dask"]:
        names = resolved(extra)
        sizes = {name: installed_size(name) for name in names}
        counted = sum(size for size in sizes.values() if size)
        missing = sorted(name for name, size in sizes.items() if size is None)
        largest = sorted(((size or 0, name) for name, size in sizes.items()), reverse=True)[:4]
        print(f"{extra}: {len(names)} distributions, {counted / 1e6:,.0f} MB on disk")
        print("  largest: " + ", ".join(f"{name} {size / 1e6:,.0f} MB" for size, name in largest))
        if missing:
            print(f"  not in this venv, not counted ({len(missing)}): {', '.join(missing)}")


if __name__ == "__main__":
    main()
