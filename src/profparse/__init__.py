"""profparse: where a PyTorch training step's time goes, stage by stage (load, forward, backward, optimizer)."""

from __future__ import annotations

from profparse.base.lazy import lazy_exports
from profparse.base.marks import STAGES
from profparse.base.requirements import check_dependencies
from profparse.base.version import __version__

__all__ = ["ParsedTrace", "STAGES", "__version__", "load", "on_trace_ready", "parse", "summarize"]

# The library API is imported on first use: `import profparse` (and the command line's start) does not pull
# pandas and pyarrow in before any work, and a Ctrl-C while they load reaches the CLI's handler.
_LAZY = {
    "ParsedTrace": "profparse.api",
    "load": "profparse.api",
    "parse": "profparse.api",
    "on_trace_ready": "profparse.integrations.torch_profiler",  # imports no torch: the profiler hands it its own
}


__getattr__ = lazy_exports(__name__, _LAZY, before=check_dependencies)


def summarize(path: str, fmt: str = "text", **kwargs) -> str:
    """The stage summary of a trace as text (``fmt``: text, json, csv or markdown)."""
    check_dependencies()
    from profparse.api import parse
    from profparse.outputs.summary import render_summary

    return render_summary(parse(path, **kwargs), fmt=fmt, release=True)  # a trace no one else reads
