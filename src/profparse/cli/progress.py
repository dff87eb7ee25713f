"""Progress bars on stderr: shown only when it is a terminal, tqdm is installed and ``-q`` is not given."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def terminal_bar(quiet: bool, **options: Any) -> Any:
    """A tqdm bar (``options`` as tqdm takes them) on stderr, cleared when closed; None when none is shown."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    tqdm.monitor_interval = 0  # no monitor thread: reading forks decoding workers only from a single-threaded process
    return tqdm(leave=False, file=sys.stderr, **options)


def steps_bar(total: int, desc: str, quiet: bool, unit: str = "it") -> Any:
    """A counter of ``total`` steps, or None."""
    return terminal_bar(quiet, total=total, desc=desc, unit=unit)


def reading_bar(path: str, quiet: bool) -> Any:
    """A byte counter for reading ``path``, as the reader's ``progress(done)`` callback (with ``close()`` and
    ``phase(text)`` for after reading), or None. A gzip file's size is not its JSON's: no total then."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None
    total = None if str(path).endswith(".gz") else size
    bar = terminal_bar(quiet, total=total, unit="B", unit_scale=True, desc="reading")
    if bar is None:
        return None
    state = {"last": 0}

    def update(done: int) -> None:
        bar.update(done - state["last"])
        state["last"] = done

    update.close = bar.close  # type: ignore[attr-defined]
    update.phase = lambda text: bar.set_description_str(text)  # type: ignore[attr-defined]  # after reading
    return update
