"""One module per chart: ``KIND``, ``TITLE``, ``data(parsed) -> (prepared | None, why)``, ``draw(prepared)``.

``data`` builds the plot data from :class:`~profparse.api.ParsedTrace`'s public tables only (plain DataFrames,
dicts, arrays); ``draw`` turns it into a matplotlib figure (``profparse plot``; matplotlib is imported there, not
here), and ``profparse report`` renders the same data in the browser. Adding a view is its module plus its name
in :data:`KINDS`; ``plot``, ``report`` and the command line pick it up.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Iterable
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

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


#: view -> the tables that no other view reads: a caller that gives tables back once read (``report``, ``plot``)
#: gives these back after the view is made
READ_ONLY_BY: dict[str, tuple[str, ...]] = {
    "critical_path": ("critical_path",),
    "roofline": ("flops", "flop_counts"),
    "top_kernels": ("kernels",),
    "top_ops": ("ops",),
}
#: the views such a caller makes first, in this order: those whose temporaries are the biggest, while the least is
#: held (the process' heap only grows a little with each view made, but it grows)
MADE_FIRST: tuple[str, ...] = ("critical_path", "timeline", "roofline", "top_ops", "top_kernels")


def release_order(kinds: Iterable[str]) -> list[str]:
    """``kinds`` in the order a caller that gives tables back makes them: :data:`MADE_FIRST`'s first."""
    kinds = list(kinds)
    return [k for k in MADE_FIRST if k in kinds] + [k for k in kinds if k not in MADE_FIRST]


def give_back(parsed: ParsedTrace, kind: str, held: Collection[str]) -> None:
    """After view ``kind`` is made: forget what only it reads (:data:`READ_ONLY_BY`), but what is in ``held``."""
    parsed.forget(name for name in READ_ONLY_BY.get(kind, ()) if name not in held)


@cache
def views() -> dict[str, ModuleType]:
    """kind -> view module, in :data:`KINDS` order (each module imported on first use)."""
    return {kind: importlib.import_module(f"{__name__}.{kind}") for kind in KINDS}
