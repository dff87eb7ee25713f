"""Findings: what to change next, and what it will save per step.

Each detector (a function named as its kind, in one module per family, registered in
:mod:`~profparse.analysis.advice.kinds`) reads the parsed trace and its critical path
and returns :class:`Finding` objects of the kinds in :mod:`profparse.analysis.advice.kinds`. A finding's saving is
the time on the critical path that its fix removes, per step, not the total time of the pattern: work that other
work hides saves nothing. Findings below :data:`MIN_SHARE` of a step (or their kind's ``min_share``) are dropped:
noise on a clean run; the threshold is met by the median steady step's part of the saving, so that one stalled step
(a GC pause, a preempted process) does not list a finding for all. So are findings in no more than half the
steady steps: a one-off (an iterator starting its workers, a first allocation) is no per-step saving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from profparse.analysis.advice import detectors
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import COLUMNS, MIN_SHARE, Finding, frame
from profparse.analysis.advice.kinds import KINDS
from profparse.analysis.advice.simulate import simulate
from profparse.trace.budget import release_memory

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

__all__ = ["COLUMNS", "KINDS", "MIN_SHARE", "Finding", "findings"]


def findings(parsed: ParsedTrace) -> pd.DataFrame:
    """One row per finding, the biggest saving first (columns: :data:`COLUMNS`)."""
    ctx = AdviceContext.of(parsed)
    found: list[Finding] = []
    if ctx is not None:
        recurring = len(ctx.steps) // 2 + 1  # in most steady steps
        for detect in detectors.registered():
            # a one-off is dropped before the replays: it is neither replayed nor applied before the listed fixes
            found.extend(f for f in detect(ctx) if len(set(f.steps)) >= recurring)
        ctx.release()  # the replay model's memory in place of the path's
        release_memory()
        simulate(ctx, found)  # every fix with a what-if: replayed without the profiler
        if parsed.attribution.warm_notes:  # measured in warm-up alone: a first call's cost may be what it saw
            for f in found:
                f.confidence = "low"
                f.evidence["measured_in"] = "warm-up only (check warm_up_only)"
    return frame([f for f in found if f.step_ns > 0 and f.saving_ns_per_step >= f.threshold_ns(f.step_ns)])
