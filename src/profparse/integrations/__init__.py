"""Where users already profile: hooks that plug profparse into a training loop (docs/integrations.md).

Importing this package imports no integration (and so neither torch nor pandas): each is loaded on first use, and
``python -m profparse.integrations.torch_profiler`` (the handler's background worker) runs without a second copy.
"""

from __future__ import annotations

from profparse.base.lazy import lazy_exports

__all__ = ["TraceHandler", "on_trace_ready"]

_HANDLER = "profparse.integrations.torch_profiler"
_LAZY = {"TraceHandler": _HANDLER, "on_trace_ready": _HANDLER}


__getattr__ = lazy_exports(__name__, _LAZY)
