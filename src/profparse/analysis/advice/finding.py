"""A finding and the table of findings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis.advice.kinds import KINDS
from profparse.base.intervals import union_pieces

COLUMNS = (
    "kind",
    "stage",
    "steps",
    "step_count",
    "saving_ns_per_step",
    "saving_share",
    "confidence",
    "message",
    "fix",
    "evidence",
)
#: a finding that would save less than this share of a step is not reported
MIN_SHARE = 0.01
CONFIDENCES = ("high", "medium", "low")


@dataclass
class WhatIf:
    """A fix as a change of the step's graph (replayed without the profiler, :mod:`.simulate`): host time removed
    (trace-time intervals, each ``host_share`` of it), GPU activity (event rows) running ``gpu_factor`` of its
    time, blocking calls (event rows) that no longer wait."""

    host: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    host_share: float = 1.0
    gpu_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpu_factor: float = 1.0
    call_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        # the time they cover is all a replay reads of them: kept as their union, which for a stage's host events
        # (launch_bound: every op and the ops inside it) is a fraction of them, and findings are held until replayed
        self.host = np.stack(union_pieces(self.host[:, 0], self.host[:, 1]), axis=1)


@dataclass
class Finding:
    """One thing to change: its kind, where, what it saves per step, and the numbers that show it."""

    kind: str
    stage: str  # the stage it concerns; several joined by ","
    steps: list[int]
    saving_ns_per_step: float
    step_ns: float  # mean step time the share is taken of
    confidence: str
    message: str  # what was found, with its numbers, in a line
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    what_if: WhatIf | None = None  # the fix, simulated: the saving is replayed (not in the table)
    template: str = ""  # the message with ``{saving}`` and ``{share}`` left to fill once simulated
    #: the median steady step's part of the saving over the mean's (1: the same in every step): a finding is
    #: listed only when the typical step, not one stalled step lifting the mean, meets its threshold
    typical: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"unknown confidence {self.confidence!r}")
        self.fix = self.fix or KINDS[self.kind].fix

    @property
    def saving_share(self) -> float:
        return self.saving_ns_per_step / self.step_ns if self.step_ns > 0 else 0.0

    def threshold_ns(self, step_ns: float) -> float:
        """The saving from which it is listed in a step of ``step_ns``: :data:`MIN_SHARE` and its kind's own
        bounds, met by its typical step."""
        kind = KINDS[self.kind]
        return max(max(MIN_SHARE, kind.min_share) * step_ns, kind.min_ns) / max(self.typical, 1e-9)


def steps_text(steps: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    parts: list[str] = []
    for s in sorted(set(steps)):
        if parts and "-" not in parts[-1].split(",")[-1] and int(parts[-1]) == s - 1:
            parts[-1] = f"{parts[-1]}-{s}"
        elif parts and "-" in parts[-1] and int(parts[-1].rsplit("-", 1)[1]) == s - 1:
            parts[-1] = f"{parts[-1].rsplit('-', 1)[0]}-{s}"
        else:
            parts.append(str(s))
    return ",".join(parts)


def parse_steps(text: str) -> list[int]:
    """The inverse of :func:`steps_text`."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def frame(found: list[Finding]) -> pd.DataFrame:
    """The findings table, biggest saving first. ``steps`` is text (``"1-3,5"``); ``evidence`` is a JSON object."""
    found = sorted(found, key=lambda f: (-f.saving_ns_per_step, f.kind, f.stage))
    rows = {
        "kind": [f.kind for f in found],
        "stage": [f.stage for f in found],
        "steps": [steps_text(f.steps) for f in found],
        "step_count": pd.array([len(set(f.steps)) for f in found], dtype="int64"),
        "saving_ns_per_step": pd.array([round(f.saving_ns_per_step) for f in found], dtype="int64"),
        "saving_share": pd.array([f.saving_share for f in found], dtype="float64"),
        "confidence": [f.confidence for f in found],
        "message": [f.message for f in found],
        "fix": [f.fix for f in found],
        "evidence": [json.dumps(f.evidence, sort_keys=True, default=_plain) for f in found],
    }
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("kind", "stage", "steps", "confidence", "message", "fix", "evidence"):
        out[column] = out[column].astype(object)
    return out


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON: {type(value).__name__}")
