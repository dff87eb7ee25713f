"""The kernels with the most GPU time, per stage."""

from __future__ import annotations

from typing import Any

from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import top_data, top_draw, with_title

KIND = "top_kernels"
TITLE = "Top GPU kernels per stage"


def data(parsed: Any) -> tuple[Prepared | None, str | None]:
    kernels = parsed.kernels
    if kernels.empty or not kernels["dur_ns"].sum():
        return None, "no GPU activity in this trace"
    return with_title(top_data(kernels, "dur_ns", "GPU time", TITLE, kernel=True), parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
