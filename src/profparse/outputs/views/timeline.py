"""Stage bands on each host thread and GPU stream, step boundaries marked.

The spans are aggregated: same-stage spans of a track closer than about a pixel (1/2000 of the trace) merge into
one interval, coarser while there are more than ``MAX_RECTS``; this keeps a 2 M-event trace's timeline small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.formats import display
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.outputs.views import _common
from profparse.outputs.views._common import (
    STAGE_COLORS,
    Figure,
    Prepared,
    fmt_time,
    mark_steps,
    stage_legend,
    step_windows,
    time_unit,
    trace_title,
)

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "timeline"
TITLE = "Timeline by stage"
MAX_TRACKS = 16


def data(
    parsed: ParsedTrace, max_tracks: int = MAX_TRACKS, max_rects: int | None = None, pixels: int = 2000
) -> tuple[Prepared | None, str | None]:
    """The busiest ``max_tracks`` tracks (label, kind) and their aggregated intervals (start/end ns since the
    first interval, stage, rule, events merged; at most about ``max_rects``; spans closer than 1/``pixels`` of the
    trace merge), step boundaries, the merge gap."""
    tracks, gap = _common.timeline_intervals(parsed, max_rects, pixels)
    intervals = tracks.intervals
    if intervals.empty:
        return None, "no host spans or GPU activity"
    table = tracks.tracks
    hidden = 0
    if len(table) > max_tracks:
        keep = table.sort_values("busy_ns", ascending=False).head(max_tracks)["track"]
        hidden = len(table) - max_tracks
        table = table[table["track"].isin(keep)]
    table = table.sort_values("order").reset_index(drop=True)
    origin = int(intervals["start_ns"].min())
    span = int(intervals["end_ns"].max()) - origin
    labels = []
    for row in table.itertuples(index=False):
        prefix = "GPU" if row.kind == "gpu" else "CPU"
        label = row.label if row.label.startswith("GPU") else f"{prefix} {row.label}"
        labels.append(shorten_name(label, 40) if len(label) > 40 else display(label))
    position = pd.Series(np.arange(len(table)), index=table["track"].to_numpy())
    mine = intervals[intervals["track"].isin(table["track"])]
    spans = pd.DataFrame(
        {
            "row": position.reindex(mine["track"].to_numpy()).to_numpy(),
            "start_ns": (mine["start_ns"] - origin).to_numpy(np.int64),
            "end_ns": (mine["end_ns"] - origin).to_numpy(np.int64),
            "stage": mine["stage"].astype(str).to_numpy(),
            "rule": mine["rule"].astype(str).to_numpy() if "rule" in mine.columns else "",
            "events": mine["events"].to_numpy(np.int64) if "events" in mine.columns else 1,
        }
    )
    step_rows = step_windows(parsed.steps, origin)
    return {
        "title": trace_title(parsed),
        "tracks": pd.DataFrame({"label": labels, "kind": table["kind"].astype(str).to_numpy()}),
        "spans": spans,
        "steps": step_rows,
        "span_ns": span,
        "origin_ns": origin,
        "gap_ns": int(gap),
        "hidden_tracks": hidden,
    }, None


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    tracks, spans, span = prepared["tracks"], prepared["spans"], prepared["span_ns"]
    scale, unit = time_unit(span)
    min_width = span / 1500
    fig, ax = plt.subplots(figsize=(14, max(1.6 + 0.42 * len(tracks), 2.8)), layout="constrained")
    present: set[str] = set()
    for (row, stage), group in spans.groupby(["row", "stage"], sort=True):
        start = group["start_ns"].to_numpy().astype(float)
        width = np.maximum((group["end_ns"] - group["start_ns"]).to_numpy().astype(float), min_width)
        ax.broken_barh(
            list(zip(start / scale, width / scale, strict=True)),
            (row - 0.36, 0.72),
            facecolors=STAGE_COLORS[str(stage)],
            linewidth=0,
        )
        present.add(str(stage))
    ax.set_yticks(range(len(tracks)), list(tracks["label"]))
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    steps = prepared["steps"]
    if len(steps):
        mark_steps(ax, steps, scale, span, 1.01, alpha=0.6)
    ax.set_xlim(0, span / scale * 1.005)
    gap = fmt_time(prepared["gap_ns"])
    ax.set_xlabel(f"time since first event ({unit});  same-stage spans closer than {gap} drawn as one bar")
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)
    hidden = prepared["hidden_tracks"]
    note = f"; {hidden} quieter tracks not shown" if hidden else ""
    ax.set_title(f"Timeline by stage: {prepared['title']}{note}", pad=18)
    stage_legend(ax, [s for s in STAGES if s in present], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig
