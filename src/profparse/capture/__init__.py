"""Capture a profiled Hugging Face load + training session (needs the ``capture`` extra: torch, transformers).

Importing this package does not import torch; :func:`run_capture` does.
"""

from __future__ import annotations

from profparse.capture.model import cache_root, ensure_model, model_spec
from profparse.capture.options import (
    DEFAULT_MODEL_CONFIG,
    DEFAULT_MODEL_NAME,
    PRESETS,
    CaptureOptions,
    CaptureResult,
)
from profparse.capture.run import EXTRA_HINT, CaptureDependencyError, run_capture, summary_text

__all__ = [
    "DEFAULT_MODEL_CONFIG",
    "DEFAULT_MODEL_NAME",
    "EXTRA_HINT",
    "PRESETS",
    "CaptureDependencyError",
    "CaptureOptions",
    "CaptureResult",
    "cache_root",
    "ensure_model",
    "model_spec",
    "run_capture",
    "summary_text",
]
