"""Stragglers: per stage, the time on each rank, the slowest rank and its lead over the median."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from profparse.base.marks import STAGES
from profparse.ranks.results import RankResult

METRICS = {
    "host_wall": ("host_wall_ns", "host wall"),
    "host_ops": ("host_op_ns", "host ops"),
    "gpu_time": ("gpu_time_ns", "GPU time"),
    "gpu_busy": ("gpu_busy_ns", "GPU busy"),
    "gpu_idle": ("gpu_idle_ns", "GPU idle"),
}
DEFAULT_METRIC = "host_wall"


def per_rank_totals(results: Iterable[RankResult]) -> pd.DataFrame:
    """One row per (rank, stage) of the ranks that were read: the whole-trace stage totals."""
    frames = []
    for r in results:
        if not r.ok or r.stage_summary is None:
            continue
        totals = r.stage_summary[r.stage_summary["scope"] == "total"].drop(columns=["scope", "step"])
        frames.append(totals.assign(rank=r.rank))
    if not frames:
        return pd.DataFrame(columns=["rank", "stage"])
    out = pd.concat(frames, ignore_index=True)
    out["stage"] = pd.Categorical(out["stage"].astype(str), categories=list(STAGES))
    columns = ["rank", "stage"] + [c for c in out.columns if c not in ("rank", "stage")]
    return out[columns].sort_values(["rank", "stage"], kind="stable").reset_index(drop=True)


def stragglers(per_rank: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Per stage: median, fastest and slowest rank, and the slowest rank's lead over the median (ns and share).

    Ties go to the lowest rank; a stage where every rank has 0 has no slowest rank.
    """
    column = METRICS[metric][0]
    rows = []
    for stage in STAGES:
        part = per_rank[per_rank["stage"] == stage].sort_values("rank", kind="stable")
        values = part[column].astype("int64").to_numpy() if len(part) else np.array([], dtype=np.int64)
        if not len(values):
            continue
        median = int(round(float(np.median(values))))  # whole ns: an even count can fall between two values
        slow = int(np.argmax(values))
        fast = int(np.argmin(values))
        top = int(values[slow])
        lead = top - median
        rows.append(
            {
                "stage": stage,
                "ranks": int(len(values)),
                "median_ns": median,
                "min_ns": int(values[fast]),
                "fastest_rank": int(part["rank"].iloc[fast]) if top > 0 else None,
                "max_ns": top,
                "slowest_rank": int(part["rank"].iloc[slow]) if top > 0 else None,
                "lead_ns": lead,
                "lead_share": (lead / median) if median > 0 else None,
            }
        )
    frame = pd.DataFrame(
        rows,
        columns=[
            "stage",
            "ranks",
            "median_ns",
            "min_ns",
            "fastest_rank",
            "max_ns",
            "slowest_rank",
            "lead_ns",
            "lead_share",
        ],
    )
    for column in ("fastest_rank", "slowest_rank"):
        frame[column] = frame[column].astype("Int64")
    return frame
