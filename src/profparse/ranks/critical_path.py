"""Collectives across ranks on the critical path: the part of each rank's path that waits for a later rank.

A single trace's critical path (``profparse.analysis.critical_path``) ends, at a collective, in the rank's own wait:
the host blocked in ``work.wait()`` or a synchronize, the collective kernel or its stream idle. With every rank of a
job at hand, that wait has a cause: the collective could not begin before the last rank arrived (``late.match``:
rank ``r`` waits ``[own start, own start + waiting_ns]``). That window's time on ``r``'s path is the late rank's
work, not ``r``'s communication.

Per rank (in the rank worker, :func:`waiting_segments`): the path's segments that can be such a wait
(:data:`WAIT_BOUNDS`, or a host collective op), clipped to the spans of the rank's own collectives: a few rows, sent
back to the parent. Across ranks (in the parent, :func:`path_waits`): those segments clipped to each rank's waiting
windows, summed per (rank, step, stage of the path, rank waited for). The single-trace ``critical_path`` table is
left as it is; docs/critical_path.md ("Across ranks") has the rule and its limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.base.arrays import text_codes
from profparse.base.formats import plain
from profparse.ranks.late import HOST_COLLECTIVE

#: bounds of a path segment that can be a rank waiting for the others (a blocked host, an idle or communicating
#: GPU); the rank's own work (compute, copies, launches, data loading, ops other than collectives) is not
WAIT_BOUNDS = ("python", "sync_wait", "gpu_idle", "gpu_comm")
SEGMENT_COLUMNS = ("step", "stage", "start_ns", "end_ns")
WAIT_COLUMNS = ("rank", "step", "stage", "waited_rank", "wait_ns")


def _empty_segments() -> pd.DataFrame:
    frame = pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in SEGMENT_COLUMNS})
    frame["stage"] = frame["stage"].astype(object)
    return frame


def _disjoint(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals sorted by start, each cut to begin where those before it end (an overlap goes to the earlier one).
    Returns (order, start, end); an interval left empty has start == end."""
    order = np.argsort(start, kind="stable")
    s, e = start[order].astype(np.int64), end[order].astype(np.int64)
    before = np.maximum.accumulate(np.concatenate([[np.iinfo(np.int64).min], e[:-1]])) if len(e) else e
    s = np.minimum(np.maximum(s, before), np.maximum(e, s))
    return order, s, np.maximum(e, s)


def overlaps(
    seg_start: np.ndarray, seg_end: np.ndarray, win_start: np.ndarray, win_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (segment, window) pair that overlaps, with the overlap: both sets sorted by start and disjoint, so a
    segment meets few windows and the pairs are at most segments + windows (no loop). Returns (segment position,
    window position, overlap start, overlap end)."""
    first = np.searchsorted(seg_end, win_start, side="right")  # the first segment ending after the window starts
    stop = np.searchsorted(seg_start, win_end, side="left")  # past the last one starting before it ends
    count = np.maximum(stop - first, 0)
    win = np.repeat(np.arange(len(win_start)), count)
    seg = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    lo = np.maximum(seg_start[seg], win_start[win])
    hi = np.minimum(seg_end[seg], win_end[win])
    keep = hi > lo
    return seg[keep], win[keep], lo[keep], hi[keep]


def _waiting_rows(path: pd.DataFrame) -> pd.DataFrame:
    """The path's segments that can be a wait, sorted by start, as plain int64 and text columns."""
    # each distinct bound and name tested once, the rows by their codes (the name's pattern ran on every segment)
    (bound, bounds), (name, names) = text_codes(path["bound"]), text_codes(path["name"])
    collective = np.array([HOST_COLLECTIVE.match(n) is not None for n in names], dtype=bool)
    keep = np.isin(bounds, list(WAIT_BOUNDS))[bound] | ((bounds == "cpu_op")[bound] & collective[name])
    part = path[keep]
    frame = pd.DataFrame(
        {
            "step": part["step"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64),
            "stage": part["stage"].astype(str).to_numpy(),
            "start_ns": part["start_ns"].to_numpy(dtype=np.int64),
            "end_ns": part["end_ns"].to_numpy(dtype=np.int64),
        }
    )
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


def waiting_segments(path: pd.DataFrame | None, spans: pd.DataFrame | None) -> pd.DataFrame:
    """The part of one rank's critical path that can be a wait for another rank: its segments of
    :data:`WAIT_BOUNDS` (and host collective ops), clipped to the spans (``start_ns``, ``end_ns``) of the rank's
    own collectives. Columns: step, stage, start_ns, end_ns; small (only time inside collectives)."""
    if path is None or spans is None or not len(path) or not len(spans):
        return _empty_segments()
    rows = _waiting_rows(path)
    _, w0, w1 = _disjoint(spans["start_ns"].to_numpy(dtype=np.int64), spans["end_ns"].to_numpy(dtype=np.int64))
    seg, _, lo, hi = overlaps(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(), w0, w1)
    out = rows.iloc[seg].reset_index(drop=True)
    out["start_ns"], out["end_ns"] = lo, hi
    return out[list(SEGMENT_COLUMNS)]


def _windows(matches: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, collective it waited in): ``[start, start + waiting_ns]`` and the rank it waited for (the last to
    arrive: latest start, ties to the lowest rank, as ``late.match`` decides)."""
    m = matches[["match", "rank", "start_ns", "waiting_ns"]].astype(np.int64)
    last = m.sort_values(["match", "start_ns", "rank"], ascending=[True, False, True], kind="stable")
    waited = last.drop_duplicates("match").set_index("match")["rank"]
    m = m.assign(waited_rank=waited.reindex(m["match"]).to_numpy())
    m = m[(m["waiting_ns"] > 0) & (m["rank"] != m["waited_rank"])]
    return m.assign(end_ns=m["start_ns"] + m["waiting_ns"])


def path_waits(segments: Iterable[tuple[int, pd.DataFrame | None]], matches: pd.DataFrame | None) -> pd.DataFrame:
    """Per (rank, step, stage of its path, rank waited for): the ns of the rank's critical path inside its waiting
    windows of matched collectives (:func:`waiting_segments` of each rank, ``collective_matches``)."""
    out = []
    windows = _windows(matches) if matches is not None and len(matches) else None
    for rank, rows in segments:
        if windows is None or rows is None or not len(rows):
            continue
        mine = windows[windows["rank"] == rank]
        order, w0, w1 = _disjoint(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())
        rows = rows.sort_values("start_ns", kind="stable")
        seg, win, lo, hi = overlaps(rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64), w0, w1)
        part = pd.DataFrame(
            {
                "rank": int(rank),
                "step": rows["step"].to_numpy(np.int64)[seg],
                "stage": rows["stage"].to_numpy()[seg],
                "waited_rank": mine["waited_rank"].to_numpy(np.int64)[order][win],
                "wait_ns": hi - lo,
            }
        )
        out.append(part.groupby(["rank", "step", "stage", "waited_rank"], sort=True, as_index=False)["wait_ns"].sum())
    if not out:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "stage" else np.int64) for c in WAIT_COLUMNS})
    return pd.concat(out, ignore_index=True)[list(WAIT_COLUMNS)]


def segments_from_dataset(out_dir: str | Path, matches: pd.DataFrame | None) -> dict[int, pd.DataFrame]:
    """Per rank, :func:`waiting_segments` from a written dataset's ``critical_path`` partitions, clipped to the
    rank's collectives in ``collective_matches`` ({} without either table: a dataset of an older profparse)."""
    from profparse.ranks.dataset import read_table

    if matches is None or not (Path(out_dir) / "critical_path").is_dir():
        return {}
    path = read_table(out_dir, "critical_path", ["step", "stage", "bound", "start_ns", "end_ns", "name"])
    spans = matches[["rank", "start_ns", "end_ns"]]
    return {
        int(rank): waiting_segments(part, spans[spans["rank"] == rank])
        for rank, part in path.groupby("rank", sort=True)
    }


def path_wait_data(waits: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (rank, stage, rank waited for): ns on the path in total, the steps it happened in, and the mean per such
    step (plain, JSON-ready)."""
    if not len(waits):
        return []
    g = waits.groupby(["rank", "stage", "waited_rank"], sort=True)
    table = g.agg(wait_ns=("wait_ns", "sum"), steps=("step", "nunique")).reset_index()
    table["per_step_ns"] = table["wait_ns"] / table["steps"]
    return [{k: plain(v) for k, v in row.items()} for row in table.to_dict("records")]


def summary_waits(
    results: Sequence[Any], matches: pd.DataFrame | None, folder: str | Path | None
) -> list[dict[str, Any]]:
    """What the multi-rank summary shows: :func:`path_wait_data` from the segments the rank tasks sent back, else
    (a written dataset) from its ``critical_path`` partitions."""
    from profparse.ranks.dataset import is_rank_dataset

    sent = [(r.rank, r.path_segments) for r in results if r.ok and r.path_segments is not None]
    if not sent and folder is not None and is_rank_dataset(folder):
        sent = list(segments_from_dataset(folder, matches).items())
    return path_wait_data(path_waits(sent, matches))
