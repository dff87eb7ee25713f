"""The ``scope`` column that per-step tables share: ``step`` rows (one per step), ``outside_steps`` (what ran
outside every step window) and ``total`` (the whole trace), listed in that order."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.trace.kinds import NULL

SCOPES = ("step", "outside_steps", "total")
_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}


def by_scope(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (in place, and returned) with its ``step`` rows that belong to no step (``step`` NULL) relabelled
    ``outside_steps``."""
    frame.loc[(frame["scope"] == "step") & (frame["step"] == NULL), "scope"] = "outside_steps"
    return frame


def scope_rank(scope: pd.Series) -> np.ndarray:
    """Each row's place in :data:`SCOPES` order, a sort key."""
    return scope.map(_RANK).to_numpy()
