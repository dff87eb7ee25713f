"""A package's names imported on first use (PEP 562): ``import profparse`` pulls in no pandas, and a Ctrl-C while
the heavy modules load reaches the command line's handler."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(
    package: str, where: dict[str, str], before: Callable[[], None] | None = None
) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``where`` (name -> module) on first use,
    after ``before()`` (a check that must pass first), and keeps it in the package's namespace."""

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
