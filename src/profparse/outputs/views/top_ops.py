"""The CPU ops with the most host self time, per stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import TOP_N, top_data, top_draw, with_title

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "top_ops"
TITLE = "Top CPU ops per stage"


def data(parsed: ParsedTrace, n: int = TOP_N) -> tuple[Prepared | None, str | None]:
    """Per stage, the ``n`` names with the most time."""
    ops = parsed.ops
    if ops.empty or not ops["self_ns"].sum():
        return None, "no CPU ops in this trace"
    return with_title(top_data(ops, "self_ns", "host self time", TITLE, kernel=False, n=n), parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
