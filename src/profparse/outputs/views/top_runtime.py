"""The runtime and driver calls (launches, copies, synchronisation) with the most host time, per stage."""

from __future__ import annotations

from typing import Any

from profparse.outputs.views._common import Figure, Prepared
from profparse.outputs.views._top import TOP_N, top_data, top_draw, with_title

KIND = "top_runtime"
TITLE = "Top runtime calls per stage"
RUNTIME_KINDS = ("cuda_runtime", "cuda_driver", "cuda_sync")


def data(parsed: Any, n: int = TOP_N) -> tuple[Prepared | None, str | None]:
    """Per stage, the ``n`` names with the most time."""
    events = parsed.events
    calls = events[events["kind"].isin(RUNTIME_KINDS).to_numpy() & (events["dur_ns"] > 0).to_numpy()]
    if calls.empty:
        return None, "no runtime calls in this trace (CPU only)"
    return with_title(top_data(calls, "dur_ns", "host time", TITLE, kernel=False, n=n), parsed), None


def draw(prepared: Prepared) -> Figure:
    return top_draw(prepared)
