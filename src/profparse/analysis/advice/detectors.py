"""Every detector, derived from the kinds: each takes the :class:`AdviceContext` and returns findings.

A detector registers itself with :func:`profparse.analysis.advice.kinds.detector`; importing the family modules here
is what registers them (a new family module is one more name in that import).
"""

from __future__ import annotations

from profparse.analysis.advice import gpu, host, training, waits  # noqa: F401  (importing registers the detectors)
from profparse.analysis.advice.kinds import KINDS, Detector


def registered() -> tuple[Detector, ...]:
    """The detector of every single-trace kind, in :data:`~profparse.analysis.advice.kinds.KINDS` order."""
    missing = [k.name for k in KINDS.values() if not k.across_ranks and k.detector is None]
    if missing:
        raise LookupError(f"finding kinds without a detector: {missing}")
    return tuple(k.detector for k in KINDS.values() if k.detector is not None)
