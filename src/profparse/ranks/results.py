"""What the parent sends each rank task and what the task reports back (small, picklable)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class RankTask:
    """What one worker needs: the file, its rank, where to write (None: only summarise) and the parse options."""

    path: str
    rank: int
    source: str
    out_root: str | None = None
    include_marks: bool = True
    strict: bool = False
    peak_tflops: float | None = None  # --peak-tflops: the peak MFU is measured against (None: the device's)
    cache: bool = False  # through the user's parsed-trace cache (docs/cache.md), as profparse.load
    output: str | None = None  # the verb's output folder, which the cache must not lie in


@dataclass
class RankResult:
    """What one task reports back (small: no event data)."""

    path: str
    rank: int
    source: str
    ok: bool
    error: str | None = None
    exit_code: int = 0
    events: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stage_summary: pd.DataFrame | None = None
    seconds: float = 0.0
    header_rank: int | None = None
    devices: list[str] = field(default_factory=list)  # devices that ran GPU work (deviceProperties names or GPU <id>)
    collectives: pd.DataFrame | None = None  # late.collective_rows: one row per collective, matched in the parent
    stage_names: pd.DataFrame | None = None  # late.stage_name_totals: per stage, time per kernel and op name
    path_segments: pd.DataFrame | None = None  # critical_path.waiting_segments: the path inside collectives
    findings: pd.DataFrame | None = None  # the rank's findings table (ranks.advice merges them across ranks)
    steps: pd.DataFrame | None = None  # step, start_ns, end_ns, steady (a late rank's saving is per steady step)
