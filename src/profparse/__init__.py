"""profparse: where a PyTorch training step's time goes, stage by stage (load, forward, backward, optimizer)."""

from __future__ import annotations

from profparse.api import ParsedTrace, load, parse
from profparse.marks import STAGES

__all__ = ["ParsedTrace", "STAGES", "load", "parse", "summarize"]
__version__ = "0.1.0"


def summarize(path: str, fmt: str = "text", **kwargs) -> str:
    """The stage summary of a trace as text (``fmt``: text, json, csv or markdown)."""
    from profparse.outputs.summary import render_summary

    return render_summary(parse(path, **kwargs), fmt=fmt)
