"""Findings of a folder of ranks: each rank's own findings (the ``findings`` table, with its rank), plus one
``late_rank`` finding per stage where a rank arrives last at the collectives and the others wait for it.

A late rank's saving is what the other ranks wait for it, per step: the sum over the collectives of that stage
where it arrived last of its delay (its start minus the median start of the others, :mod:`profparse.ranks.late`),
divided by the steps of the run; steady steps only, as the detectors count them (the ``steady`` column of the
``steps`` table). Every finding is one row with a ``rank`` column; all are sorted by saving.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.advice import MIN_SHARE, Finding
from profparse.analysis.advice.finding import COLUMNS, frame
from profparse.ranks import late
from profparse.ranks.dataset import is_rank_dataset, read_table
from profparse.ranks.results import RankResult
from profparse.stages.attribute import WARM_UP_FROM

DELAYS_SHOWN = 20  # per-collective delays kept in a late_rank finding's evidence (the largest)


def ranks_findings(
    results: Sequence[RankResult],
    matches: pd.DataFrame | None,
    folder: str | Path | None = None,
    late_data: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Every rank's findings and the late ranks', one frame with ``rank`` first, the biggest saving first.

    A dataset written by ``parse DIR`` is read for the per-rank findings and steps; results parsed now carry them.
    ``late_data`` (``late.late_data``): the late rank's kernels and ops that moved, as the finding's top events."""
    ok = [r for r in results if r.ok]
    own, steps = _from_dataset(folder) if folder is not None and is_rank_dataset(folder) else _from_results(ok)
    late_rows = late_rank_frame(matches, steps, late_data)
    parts = [f for f in (*own, late_rows) if f is not None and len(f)]
    if not parts:
        return _empty()
    merged = pd.concat(parts, ignore_index=True)
    order = np.lexsort((merged["rank"].to_numpy(), -merged["saving_ns_per_step"].to_numpy(dtype=np.int64)))
    return merged.iloc[order].reset_index(drop=True)[["rank", *COLUMNS]]


def _empty() -> pd.DataFrame:
    out = frame([])
    out.insert(0, "rank", pd.array([], dtype="int64"))
    return out


def _with_rank(findings: pd.DataFrame | None, rank: int) -> pd.DataFrame | None:
    if findings is None or not len(findings):
        return None
    return findings[list(COLUMNS)].assign(rank=int(rank))


def _from_results(results: Sequence[RankResult]) -> tuple[list[pd.DataFrame | None], dict[int, pd.DataFrame]]:
    """(each rank's findings with its rank, each rank's steps) from results parsed in this run."""
    own = [_with_rank(getattr(r, "findings", None), r.rank) for r in results]
    steps = {r.rank: s for r in results if (s := getattr(r, "steps", None)) is not None}
    return own, steps


def _from_dataset(folder: str | Path) -> tuple[list[pd.DataFrame | None], dict[int, pd.DataFrame]]:
    """The same from a dataset's ``findings`` and ``steps`` tables (absent in a dataset written before them)."""
    root = Path(folder)
    own: list[pd.DataFrame | None] = []
    if (root / "findings").is_dir():
        table = read_table(root, "findings")
        own = [_with_rank(part.drop(columns="rank"), int(rank)) for rank, part in table.groupby("rank")]
    steps: dict[int, pd.DataFrame] = {}
    if (root / "steps").is_dir():
        table = read_table(root, "steps")  # small; ``steady`` is absent in a dataset written before it
        steps = {int(rank): part for rank, part in table.groupby("rank")}
    return own, steps


# -- late_rank -------------------------------------------------------------------------------------------------------


def steady_steps(steps: pd.DataFrame | None) -> pd.DataFrame | None:
    """A rank's steady steps, as the detectors count them (the ``steady`` column of its ``steps`` table; without
    it, the first of :data:`~profparse.stages.attribute.WARM_UP_FROM` or more is warm-up)."""
    if steps is None or not len(steps):
        return None
    ordered = steps.sort_values("start_ns", kind="stable")
    if "steady" in ordered.columns:
        return ordered[ordered["steady"].astype(bool).to_numpy()]
    return ordered.iloc[1:] if len(ordered) >= WARM_UP_FROM else ordered


def late_rank_findings(
    matches: pd.DataFrame | None, steps: dict[int, pd.DataFrame], late_data: dict[str, Any] | None = None
) -> list[tuple[int, Finding]]:
    """One ``late_rank`` finding per stage with a late rank (the rank the finding concerns, the finding)."""
    if matches is None or matches.empty:
        return []
    moved = {s["stage"]: s.get("differences") or {} for s in (late_data or {}).get("stages") or []}
    out = []
    for row in late.late_ranks(matches).to_dict("records"):
        if pd.isna(row["late_rank"]):
            continue
        rank, stage = int(row["late_rank"]), str(row["stage"])
        lasts = matches[(matches["match_stage"] == stage) & matches["is_last"] & (matches["rank"] == rank)]
        steady = steady_steps(steps.get(rank))
        if steady is not None:  # the waits in the steady steps, per steady step (the late rank's steps)
            lasts = lasts[lasts["step"].isin(steady["step"]).fillna(False).to_numpy(dtype=bool)]
        if not len(lasts):
            continue
        n_steps = len(steady) if steady is not None else 0
        step_ns = float((steady["end_ns"] - steady["start_ns"]).mean()) if steady is not None else 0.0
        found_steps = sorted({int(s) for s in lasts["step"].dropna()})
        per_step = float(lasts["delay_ns"].sum()) / max(n_steps or len(found_steps), 1)
        finding = Finding(
            "late_rank",
            stage,
            found_steps,
            per_step,
            step_ns,
            _confidence(int(row["times_last"]), int(row["collectives"])),
            f"rank {rank} arrives last at {int(row['times_last'])} of {int(row['collectives'])} {stage} collectives, "
            f"{row['mean_delay_ns'] / 1e6:,.2f} ms after the others on average: they wait {per_step / 1e6:,.2f} ms "
            "per step for it",
            _evidence(row, lasts, n_steps, moved.get(stage) or {}),
        )
        if step_ns <= 0 or finding.saving_share >= MIN_SHARE:
            out.append((rank, finding))
    return out


def late_rank_frame(
    matches: pd.DataFrame | None, steps: dict[int, pd.DataFrame], late_data: dict[str, Any] | None = None
) -> pd.DataFrame | None:
    """:func:`late_rank_findings` as findings rows with their ``rank``."""
    found = late_rank_findings(matches, steps, late_data)
    if not found:
        return None
    return pd.concat([frame([f]).assign(rank=rank) for rank, f in found], ignore_index=True)


def _confidence(times_last: int, collectives: int) -> str:
    """high: last at every collective of the stage; medium: at most of them; low otherwise."""
    if collectives and times_last == collectives:
        return "high"
    return "medium" if 2 * times_last > collectives else "low"


def _evidence(row: dict[str, Any], lasts: pd.DataFrame, n_steps: int, moved: dict[str, list]) -> dict[str, Any]:
    """The numbers behind a late_rank finding: its delays per collective (largest first) and what it did more."""
    biggest = lasts.sort_values("delay_ns", ascending=False, kind="stable").head(DELAYS_SHOWN)
    delays = [
        {
            "collective": str(r.collective),
            "process_group": str(r.pg_name),
            "seq": int(r.seq),
            "step": None if pd.isna(r.step) else int(r.step),
            "delay_ns": int(r.delay_ns),
        }
        for r in biggest.itertuples(index=False)
    ]
    top = [
        {"name": d["name"], "extra_ns": d["delta_ns"], "rank_ns": d["rank_ns"], "median_ns": d["median_ns"]}
        for kind in ("kernels", "ops")
        for d in moved.get(kind) or []
        if d.get("delta_ns") and d["delta_ns"] > 0
    ]
    return {
        "late_rank": int(row["late_rank"]),
        "collectives": int(row["collectives"]),
        "times_last": int(row["times_last"]),
        "mean_delay_ns": int(row["mean_delay_ns"]),
        "max_delay_ns": int(row["max_delay_ns"]),
        "waiting_ns": int(row["waiting_ns"]),
        "steps_counted": int(n_steps),
        "delays": delays,
        "top_events": sorted(top, key=lambda d: -d["extra_ns"])[:5],
    }
