"""What a capture is asked to do (:class:`CaptureOptions`) and what it produced (:class:`CaptureResult`).

Nothing here imports torch: the core package installs and imports without the ``capture`` extra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The default model: the Qwen2 architecture (the seed profiles Qwen2.5-7B-Instruct), made small enough that a
#: CPU capture of load + 3 steps takes seconds and its gzipped trace stays small. Keys are ``Qwen2Config``
#: arguments.
DEFAULT_MODEL_NAME = "qwen2-tiny"
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
}

#: Real layer shapes of released models, built with random weights and ``--layers N`` decoder layers.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-7b": {
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 131072,
        "max_window_layers": 28,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
}

#: Dtype saved on disk for a built model: the tiny default in fp32, presets in bf16 as released.
PRESET_SAVE_DTYPE = "bf16"
DEFAULT_SAVE_DTYPE = "fp32"

DTYPES = ("bf16", "fp32")


@dataclass
class CaptureOptions:
    """Options of one capture; the fields mirror ``scripts/capture.py``'s flags."""

    model: str | None = None
    """A local Hugging Face causal-LM folder; ``None`` builds (once) and uses the default tiny Qwen2 model."""
    preset: str | None = None
    """Build a model with a released model's real layer shapes (see :data:`PRESETS`), random weights."""
    layers: int | None = None
    """Decoder layers of a preset model (default: the preset's own count)."""
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str | None = None
    """``bf16`` or ``fp32``; ``None``: fp32 on cpu, bf16 on cuda."""
    steps: int = 3
    batch: int = 2
    seq_len: int = 64
    out: str | None = None
    """Run folder; ``None``: ``runs/<timestamp>`` under the current directory."""
    force: bool = False
    """Replace an existing run folder (only one a capture wrote: it holds profparse's output marker)."""
    with_stack: bool = True
    record_shapes: bool = True
    profile_memory: bool = True
    stage_marks: bool = True
    """Emit profparse's own ``record_function`` stage ranges (see :mod:`profparse.base.marks`)."""
    warm: bool = True
    """Load the model once, unprofiled, before the profiler starts, so the profiled load is a warm one. A cold
    (first-in-process) ``from_pretrained`` in transformers 5.x also imports the model's code and builds the
    library-wide checkpoint conversion mapping (regex compiles): ~700k more Python events, a ~10x bigger
    trace."""
    sync_load: bool = False
    """Set ``HF_DEACTIVATE_ASYNC_LOAD=1`` around the loads: transformers 5.x otherwise copies the weights out of
    the safetensors file on a thread pool that the profiler does not record (no Python frames, no ops)."""
    seed: int = 0
    lr: float = 1e-4
    quiet: bool = False
    cache_dir: str | None = None
    """Where built models are kept (under ``models/<name>``); ``None``: the trace cache's folder
    (``$PROFPARSE_CACHE_DIR``, else ``~/.cache/profparse``; docs/cache.md)."""

    def __post_init__(self) -> None:
        if self.model is not None and self.preset is not None:
            raise ValueError("give either model or preset, not both")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        if self.layers is not None and self.preset is None:
            raise ValueError("layers applies to a preset only")
        if self.layers is not None and self.layers < 1:
            raise ValueError("layers must be >= 1")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        for name in ("steps", "batch", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CaptureResult:
    run_dir: Path
    trace_path: Path
    manifest_path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
