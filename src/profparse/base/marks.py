"""The names profparse's capture gives its own ``record_function`` ranges.

A stage range is named ``profparse.stage:<stage>`` (``load``, ``forward``, ``backward``, ``optimizer``). Loading
sub-steps inside the load range are named ``profparse.load:<substep>``. Attribution reads these first; any user can
emit the same names from their own training loop to get exact stages.
"""

from __future__ import annotations

STAGES: tuple[str, ...] = ("load", "forward", "backward", "optimizer", "other")
TRAINING_STAGES: tuple[str, ...] = ("load", "forward", "backward", "optimizer")

STAGE_MARK_PREFIX = "profparse.stage:"
LOAD_MARK_PREFIX = "profparse.load:"


def stage_mark(stage: str) -> str:
    """The ``record_function`` name that marks ``stage``."""
    if stage not in TRAINING_STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {TRAINING_STAGES}")
    return STAGE_MARK_PREFIX + stage


def load_mark(substep: str) -> str:
    """The ``record_function`` name that marks a loading sub-step."""
    return LOAD_MARK_PREFIX + substep
