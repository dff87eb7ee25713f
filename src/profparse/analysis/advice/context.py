"""What every detector reads: the trace's rows, the steps, and the critical path by event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace


@dataclass
class AdviceContext:
    """The parsed trace plus the step windows and the critical path, read once for all detectors."""

    parsed: ParsedTrace
    steps: pd.DataFrame
    path: pd.DataFrame

    @classmethod
    def of(cls, parsed: ParsedTrace) -> AdviceContext | None:
        steps = parsed.attribution.steps
        if steps.empty:
            return None
        return cls(parsed, steps, parsed.table("critical_path"))
