"""The CPU ops with the most host self time, per stage."""

from __future__ import annotations

from typing import Any

from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import top_data, top_draw, with_title

KIND = "top_ops"
TITLE = "Top CPU ops per stage"


def data(parsed: Any) -> tuple[Prepared | None, str | None]:
    ops = parsed.ops
    if ops.empty or not ops["self_ns"].sum():
        return None, "no CPU ops in this trace"
    return with_title(top_data(ops, "self_ns", "host self time", TITLE, kernel=False), parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
