"""One way to turn report data into text: a renderer per format, JSON for free."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

Renderer = Callable[[dict[str, Any]], str]


def render_as(data: dict[str, Any], fmt: str, renderers: Mapping[str, Renderer]) -> str:
    """Render ``data`` with the renderer for ``fmt``; ``json`` is always available."""
    if fmt in renderers:
        return renderers[fmt](data)
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    choices = ", ".join([*renderers, "json"])
    raise ValueError(f"unknown format {fmt!r}; expected one of {choices}")


def text_table(headers: list[str], rows: list[list[str]], align_left: int = 1) -> str:
    """A plain text table: the first ``align_left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = []
    for row in [headers, *rows]:
        cells = [c.ljust(w) if i < align_left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  " + "  ".join(cells).rstrip())
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)
