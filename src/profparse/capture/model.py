"""Build the capture's model once and keep it in a cache folder, so that every capture profiles a real
``from_pretrained`` of safetensors weights.

A built model folder holds ``config.json``, ``model.safetensors`` and ``profparse_model.json`` (what it was
built from). A folder is reused when that record matches; a build goes to a hidden temporary folder beside the
final one and is renamed into place, so a killed build never leaves a half model under the final name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profparse.capture.options import (
    DEFAULT_MODEL_CONFIG,
    DEFAULT_MODEL_NAME,
    DEFAULT_SAVE_DTYPE,
    PRESET_SAVE_DTYPE,
    PRESETS,
)

RECORD_NAME = "profparse_model.json"
RECORD_FORMAT = 1
INIT_SEED = 0
_STALE_TMP_S = 24 * 3600


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else the trace cache's folder (``$PROFPARSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/profparse``,
    else ``~/.cache/profparse``): one setting for both, the models under its ``models/`` (docs/cache.md)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from profparse.cache.store import cache_root as trace_cache_root

    return trace_cache_root().expanduser()


def model_spec(preset: str | None = None, layers: int | None = None) -> tuple[str, dict[str, Any], str]:
    """The (folder name, ``Qwen2Config`` arguments, saved dtype) of the default model or of a preset."""
    if preset is None:
        return DEFAULT_MODEL_NAME, dict(DEFAULT_MODEL_CONFIG), DEFAULT_SAVE_DTYPE
    config = dict(PRESETS[preset])
    if layers is not None:
        config["num_hidden_layers"] = layers
        config["max_window_layers"] = min(config.get("max_window_layers", layers), layers)
    return f"{preset}-L{config['num_hidden_layers']}", config, PRESET_SAVE_DTYPE


def _record(config: dict[str, Any], save_dtype: str) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "architecture": "Qwen2ForCausalLM",
        "config": config,
        "save_dtype": save_dtype,
        "init_seed": INIT_SEED,
    }


def _matches(path: Path, record: dict[str, Any]) -> bool:
    try:
        stored = json.loads((path / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return False
    if stored != json.loads(json.dumps(record)):
        return False
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _clean_stale(parent: Path, name: str) -> None:
    """Remove the build folders a killed build left (``.NAME.tmp-PID-HEX8``, ``.NAME.old-PID-HEX8``): only those
    exact names, only real folders (never a link) of this user, older than a day; anything else is the user's."""
    generated = re.compile(rf"\.{re.escape(name)}\.(?:tmp|old)-\d{{1,10}}-[0-9a-f]{{8}}")
    now = time.time()
    for p in parent.glob(f".{name}.*"):
        try:
            info = p.lstat()
            if (
                generated.fullmatch(p.name)
                and stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.getuid()
                and now - info.st_mtime > _STALE_TMP_S
            ):
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _save(path: Path, config_kwargs: dict[str, Any], save_dtype: str) -> None:
    """Build the model with seeded random weights and ``save_pretrained`` it (safetensors) into ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dtype = torch.bfloat16 if save_dtype == "bf16" else torch.float32
    config = Qwen2Config(**config_kwargs)
    config.architectures = ["Qwen2ForCausalLM"]
    old_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        torch.set_default_dtype(dtype)
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(old_dtype)
    model.save_pretrained(path)
    del model


def _save_in_subprocess(path: Path, config_kwargs: dict[str, Any], save_dtype: str) -> None:
    """Run :func:`_save` in a fresh interpreter: the capturing process then has not imported the model's code
    yet, whether the model was built just now or reused (a ``--cold`` capture profiles that lazy import)."""
    payload = json.dumps({"path": str(path), "config": config_kwargs, "save_dtype": save_dtype})
    code = "import sys; from profparse.capture.model import _save_main; _save_main(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"building the model failed (exit {proc.returncode}):\n{tail}")


def _save_main(payload: str) -> None:
    args = json.loads(payload)
    _save(Path(args["path"]), args["config"], args["save_dtype"])


def ensure_model(
    preset: str | None = None,
    layers: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, bool]:
    """The folder of the default (or preset) model, built and saved on first use.

    Returns (path, whether it was built now)."""
    name, config_kwargs, save_dtype = model_spec(preset, layers)
    record = _record(config_kwargs, save_dtype)
    parent = cache_root(cache_dir) / "models"
    final = parent / name
    if _matches(final, record):
        if log:
            log(f"reusing model {final}")
        return final, False

    parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(parent, name)
    if log:
        log(f"building {'default' if preset is None else preset} model -> {final}")
    tmp = parent / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _save_in_subprocess(tmp, config_kwargs, save_dtype)
        (tmp / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        old = None
        if final.exists():
            if _matches(final, record):  # another process finished the same build meanwhile
                return final, False
            old = parent / f".{name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except OSError:
            if _matches(final, record):
                return final, False
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final, True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
