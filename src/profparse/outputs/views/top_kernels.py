"""The kernels with the most GPU time, per stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import TOP_N, top_data, top_draw, with_title

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "top_kernels"
TITLE = "Top GPU kernels per stage"


def data(parsed: ParsedTrace, n: int = TOP_N) -> tuple[Prepared | None, str | None]:
    """Per stage, the ``n`` names with the most time."""
    kernels = parsed.kernels
    if kernels.empty or not kernels["dur_ns"].sum():
        return None, "no GPU activity in this trace"
    return with_title(top_data(kernels, "dur_ns", "GPU time", TITLE, kernel=True, n=n), parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
