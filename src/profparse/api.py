"""The library's one data path: read -> link -> attribute -> tables.

``profparse.load(path)`` runs it and returns a :class:`~profparse.tables.parsed.ParsedTrace` whose tables (those
of :data:`profparse.tables.registry.TABLES`) are pandas DataFrames.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profparse.base import phase_clock
from profparse.base.errors import TraceFormatError, UsageError
from profparse.stages.attribute import attribute
from profparse.tables.parsed import ParsedTrace
from profparse.trace.events import read_trace
from profparse.trace.link import link


def trace_path(path: Any) -> str | Path:
    """``path`` when it names a file (a ``str`` or ``os.PathLike`` of ``str``); else a UsageError (exit 2) that
    says what was given (None, bytes, a number, a list, an open file, a name with a NUL byte)."""
    if isinstance(path, str | os.PathLike) and isinstance(os.fspath(path), str):
        if "\0" not in os.fspath(path):
            return path
        raise UsageError(f"{os.fspath(path)!r}: a path cannot hold a NUL byte")
    what = "an open file: pass its name (f.name)" if hasattr(path, "read") else type(path).__name__
    raise UsageError(f"a trace path must be a str or os.PathLike, not {what}")


def parse(
    path: str | Path,
    *,
    include_marks: bool = True,
    strict: bool = False,
    progress: Any = None,
    peak_tflops: float | None = None,
) -> ParsedTrace:
    """Read, link and attribute one trace file. ``peak_tflops``: the peak MFU is measured against (default: the
    device's dense peak for the dominant dtype, from :mod:`profparse.analysis.peaks`)."""
    path = trace_path(path)
    phase_clock.startup()
    try:
        with phase_clock.phase("read"):
            raw = read_trace(path, strict=strict, progress=progress)
    except RecursionError:
        raise TraceFormatError(f"{path}: JSON nested too deeply (corrupt or hostile input)") from None
    phase = getattr(progress, "phase", None)  # a progress bar may also show the phases after reading
    if phase is not None:
        phase("linking")
    with phase_clock.phase("link"):
        links = link(raw.events)
    if phase is not None:
        phase("attributing stages")
    with phase_clock.phase("attribute"):
        attribution = attribute(raw.events, links, raw.thread_names, include_marks=include_marks)
    options = {"include_marks": include_marks, "peak_tflops": peak_tflops}
    return ParsedTrace(raw=raw, links=links, attribution=attribution, options=options)


def load(
    path: str | Path,
    *,
    cache: bool = True,
    include_marks: bool = True,
    strict: bool = False,
    progress: Any = None,
    notify: Callable[[str], None] | None = None,
    outputs: tuple[str | Path, ...] = (),
    peak_tflops: float | None = None,
) -> ParsedTrace:
    """Load a trace (``.json``/``.json.gz``) for analysis with pandas. Same options as :func:`parse`.

    With ``cache`` (default) the parsed trace comes from, or goes into, the user's cache folder
    (``docs/cache.md``): a second load of the same file content reads Arrow files instead of the JSON.
    ``notify`` receives the cache's notes and warnings (default: stderr); ``outputs``: folders the cache must
    not lie in."""
    path = trace_path(path)
    if not cache:
        return parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    from profparse.cache.keys import load_options
    from profparse.cache.store import Cache

    store = Cache.open(**({"notify": notify} if notify else {}), inputs=[path], outputs=outputs)
    options = load_options(include_marks, strict, peak_tflops)
    with phase_clock.phase("cache.key"):
        key = store.key(path, options) if store is not None else None
    if store is None or key is None:
        return parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    name, stat_id = key
    with phase_clock.phase("cache.read"):
        hit = store.get(name, path)
    if hit is not None:
        phase_clock.startup()  # (includes cache.key and cache.read: on a miss parse() says it)
        (raw, links, attribution), entry = hit
        return ParsedTrace(
            raw=raw,
            links=links,
            attribution=attribution,
            options={"include_marks": include_marks, "peak_tflops": peak_tflops},
            cache=entry,
        )
    parsed = parse(path, include_marks=include_marks, strict=strict, progress=progress, peak_tflops=peak_tflops)
    if store.unchanged(path, stat_id):  # not a file rewritten while it was parsed
        with phase_clock.phase("cache.store"):
            parsed.cache = store.put(name, parsed)
    return parsed
