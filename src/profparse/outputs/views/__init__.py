"""One module per chart: ``KIND``, ``TITLE``, ``data(parsed) -> (prepared | None, why)``, ``draw(prepared)``.

``data`` builds the plot data from :class:`~profparse.api.ParsedTrace`'s public tables only (plain DataFrames,
dicts, arrays); ``draw`` turns it into a matplotlib figure (``profparse plot``; matplotlib is imported there, not
here), and ``profparse report`` renders the same data in the browser. Adding a view is its module plus its name
in :data:`KINDS`; ``plot``, ``report`` and the command line pick it up.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

#: The registry: each kind is the module of that name in this package, in the order plots are listed and report
#: sections appear. Adding a view is its module plus its name here; ``plot``, ``report`` and the command line's
#: ``--kind`` choices read this tuple (importing this package imports no view, so no pandas).
KINDS: tuple[str, ...] = (
    "stages",
    "timeline",
    "critical_path",
    "top_kernels",
    "top_ops",
    "top_runtime",
    "communication",
    "roofline",
    "memory",
    "layers",
    "load",
)


@cache
def views() -> dict[str, ModuleType]:
    """kind -> view module, in :data:`KINDS` order (each module imported on first use)."""
    return {kind: importlib.import_module(f"{__name__}.{kind}") for kind in KINDS}
