"""Every detector, in one list: each takes the :class:`AdviceContext` and returns findings."""

from __future__ import annotations

from collections.abc import Callable

from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding

DETECTORS: tuple[Callable[[AdviceContext], list[Finding]], ...] = ()
