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
