"""View: exposed vs overlapped communication per stage (collective kernel time, from ``comm_exposure``).

``data`` builds one row per stage with collectives (devices summed): ``overlapped_ns`` (hidden under other GPU
work on the same device), ``exposed_ns`` (the rest) and ``overlap_pct``; ``draw`` stacks them in one bar per stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profparse.base.formats import display
from profparse.base.marks import STAGES
from profparse.outputs.views._common import STAGE_COLORS, time_unit

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "communication"
TITLE = "Communication per stage: exposed vs overlapped"


def data(parsed: ParsedTrace) -> tuple[Any | None, str | None]:
    """``({"title", "stages"}, None)`` with a DataFrame per stage, or ``(None, reason)`` without collectives."""
    exposure = parsed.comm_exposure
    total = exposure[exposure["scope"] == "total"]
    if total.empty or int(total["comm_ns"].sum()) == 0:
        return None, "no collective (NCCL/RCCL) kernels in this trace"
    sums = ["comm_count", "comm_ns", "overlapped_ns", "exposed_ns"]
    frame = total.groupby("stage", observed=True, sort=True)[sums].sum().astype("int64").reset_index()
    frame["stage"] = frame["stage"].astype(str)
    frame["overlap_pct"] = 100 * frame["overlapped_ns"] / frame["comm_ns"]
    frame = frame[frame["comm_ns"] > 0].reset_index(drop=True)
    rank = f", rank {parsed.rank}" if parsed.rank is not None else ""
    return {"title": f"{TITLE}\n{display(Path(parsed.path).name)}{rank}", "stages": frame}, None


def draw(prepared: dict[str, Any]) -> Any:
    """One bar per stage: overlapped (solid, the stage colour) under exposed (hatched), overlap % on top."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    frame: pd.DataFrame = prepared["stages"]
    frame = frame.set_index("stage").reindex([s for s in STAGES if s in set(frame["stage"])]).reset_index()
    scale, unit = time_unit(float(frame["comm_ns"].max()))
    fig = Figure(figsize=(7, 5), layout="constrained")
    ax = fig.add_subplot()
    x = range(len(frame))
    colors = [STAGE_COLORS[s] for s in frame["stage"]]
    overlapped = frame["overlapped_ns"] / scale
    exposed = frame["exposed_ns"] / scale
    ax.bar(x, overlapped, color=colors, edgecolor="black", linewidth=0.5)
    ax.bar(x, exposed, bottom=overlapped, color="white", edgecolor=colors, hatch="//", linewidth=1.5)
    for i, r in enumerate(frame.itertuples(index=False)):
        ax.annotate(f"{r.overlap_pct:.0f}% overlapped", (i, (r.comm_ns) / scale), ha="center", va="bottom",
                    xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set_xticks(list(x), list(frame["stage"]))
    ax.set_ylabel(f"collective kernel time ({unit})")
    ax.set_title(prepared["title"], fontsize=11)
    ax.legend(handles=[Patch(facecolor="#888888", label="overlapped by other GPU work"),
                       Patch(facecolor="white", edgecolor="#555555", hatch="//", label="exposed")])  # fmt: skip
    return fig
