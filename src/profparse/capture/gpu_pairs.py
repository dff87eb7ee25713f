"""Before/after captures on a CUDA device, in the layout of ``../shared/traces/h200_pairs`` (docs/advice.md,
"GPU pairs"), so that the step without the profiler and the simulated savings can be checked on any GPU.

A ``LlamaForCausalLM`` with random weights (hidden 768, 12 layers, intermediate 2048, 12 heads, vocab 50304,
batch 8 x 512: about 162 M parameters; ``tiny``: hidden 64, 2 layers, batch 2 x 32). The well-configured step
("good"): ``torch.autocast(device, dtype=torch.bfloat16)``, ``AdamW(fused=True)``, ``clip_grad_norm_(.., 1.0)``
(no ``.item()``), ``zero_grad(set_to_none=True)``, token ids already on the device. Each pattern switches one
thing on (:data:`PATTERNS`), as h200_pairs' README says.

Per pattern, both sides are built once (a copy of the same seeded model each, their own optimizer), warmed up
(:data:`WARMUP` steps), then timed without the profiler in blocks of :data:`BLOCK_STEPS` steps in the order bad,
good, good, bad (``blocks`` per side, at least 6), each block synchronised only at its start and end (the host runs
ahead of the GPU as in training); ``measured.json`` keeps each block's mean step (``bad_blocks``, ``good_blocks``)
and their means. Then each side is profiled: CPU + CUDA activities, ``record_shapes=True``, stacks for
``recompute`` only, ``schedule(wait=1, warmup=1, active=3)``. torch and transformers are imported inside.
"""

from __future__ import annotations

import copy
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profparse.capture.run import export_gzipped

WARMUP = 3
BLOCK_STEPS = 6
MIN_BLOCKS = 6
SLEEP_S = 0.02  # between_steps: the logging a step waits for
READ_S = 0.003  # data_loading: one sample's read
#: the model sizes: ``full`` is h200_pairs' Llama; ``launch`` the tiny model whose host launches slower than the GPU
#: runs (``launch_bound``); ``tiny`` a CPU-sized stand-in for both (``--tiny``)
SIZES: dict[str, dict[str, int]] = {
    "full": {"hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 2048, "num_attention_heads": 12,
             "vocab_size": 50304, "batch": 8, "seq": 512},
    "launch": {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 512, "num_attention_heads": 4,
               "vocab_size": 50304, "batch": 2, "seq": 64},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
             "vocab_size": 512, "batch": 2, "seq": 32},
}  # fmt: skip
#: pattern -> what its bad side switches on (the good side is the clean step; ``launch_bound`` and ``clean`` have
#: one side)
PATTERNS: dict[str, str] = {
    "sync_in_step": "torch.isfinite(loss).item() after forward, float(grad_norm) before the optimizer",
    "fp32_matmul": "no autocast, TF32 off (good: no autocast, TF32 on)",
    "data_loading": "DataLoader(num_workers=0) whose __getitem__ sleeps 3 ms per sample, then .to(device)",
    "between_steps": "time.sleep(0.02) after each step",
    "optimizer_not_batched": "AdamW(foreach=False)",
    "grad_zeroing": "zero_grad(set_to_none=False)",
    "allocator_churn": "torch.cuda.empty_cache() after each step",
    "unpinned_copy": "inputs_embeds (fp32) copied from pageable memory (good: pinned, non_blocking=True)",
    "recompute": "gradient_checkpointing_enable(use_reentrant=False)",
    "launch_bound": "a tiny model (hidden 128, 4 layers, batch 2 x 64): no fix captured",
    "clean": "the good step alone",
}
ONE_SIDE = {"launch_bound": "bad", "clean": "good"}


@dataclass
class Device:
    """Where the pairs run: ``torch``, the device's name, its sync, the model size."""

    torch: Any
    name: str
    size: str
    built: dict[str, Any] = field(default_factory=dict)

    def sync(self) -> None:
        if self.name.startswith("cuda"):
            self.torch.cuda.synchronize()

    def model(self, size: str) -> Any:
        """A copy of the seeded Llama of ``size``, on the device."""
        if size not in self.built:
            from transformers import LlamaConfig, LlamaForCausalLM

            shape = {k: v for k, v in SIZES[size].items() if k not in ("batch", "seq")}
            config = LlamaConfig(
                **shape, num_key_value_heads=shape["num_attention_heads"], max_position_embeddings=1024
            )
            with self.torch.random.fork_rng(devices=[]):
                self.torch.manual_seed(0)
                self.built[size] = LlamaForCausalLM(config)
        return copy.deepcopy(self.built[size]).to(self.name).train()


class _Reads:
    """A dataset whose every sample's read takes :data:`READ_S` (sleep standing for I/O)."""

    def __init__(self, ids: Any) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Any:
        time.sleep(READ_S)
        return self.ids[i]


def _batches(dev: Device, size: str, pattern: str, bad: bool) -> Iterator[Any]:
    """The step's input: token ids on the device, or (data_loading bad) from a loader in this process."""
    torch, shape = dev.torch, SIZES[size]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape["vocab_size"], (64 * shape["batch"], shape["seq"]), generator=gen)
    if pattern == "data_loading" and bad:
        loader = torch.utils.data.DataLoader(_Reads(ids), batch_size=shape["batch"], num_workers=0)
        while True:
            yield from (batch.to(dev.name) for batch in loader)
    on_device = ids[: shape["batch"]].to(dev.name)
    while True:
        yield on_device


def make_step(dev: Device, pattern: str, bad: bool) -> Callable[[], None]:
    """One training step of ``pattern``'s ``bad`` or good side (model and optimizer built here, kept by it)."""
    torch = dev.torch
    size = dev.size if pattern != "launch_bound" or dev.size == "tiny" else "launch"
    model = dev.model(size)
    if pattern == "recompute" and bad:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fused = not (pattern == "optimizer_not_batched" and bad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {"foreach": False}))
    batches = _batches(dev, size, pattern, bad)
    autocast = pattern != "fp32_matmul"
    tf32 = not (pattern == "fp32_matmul" and bad)
    embeds = None
    if pattern == "unpinned_copy":
        shape = SIZES[size]
        embeds = torch.randn(shape["batch"], shape["seq"], shape["hidden_size"])
        embeds = embeds.pin_memory() if not bad and dev.name.startswith("cuda") else embeds
    device_type = dev.name.split(":")[0]

    def step() -> None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ids = next(batches)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            if embeds is not None:
                x = embeds.to(dev.name, non_blocking=not bad)
                loss = model(inputs_embeds=x, labels=ids, use_cache=False).loss
            else:
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        if pattern == "sync_in_step" and bad and not torch.isfinite(loss).item():
            raise FloatingPointError("loss is not finite")
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if pattern == "sync_in_step" and bad:
            float(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=not (pattern == "grad_zeroing" and bad))
        if pattern == "between_steps" and bad:
            time.sleep(SLEEP_S)
        if pattern == "allocator_churn" and bad and dev.name.startswith("cuda"):
            torch.cuda.empty_cache()

    return step


def timed_blocks(dev: Device, steps: dict[str, Callable[[], None]], blocks: int) -> dict[str, list[float]]:
    """Each side's blocks (mean ns per step), in the order bad, good, good, bad..., each synchronised only at its
    start and end."""
    order = ["bad", "good", "good", "bad"] * ((blocks + 1) // 2)
    sides = [s for s in order if s in steps] if len(steps) == 2 else [next(iter(steps))] * blocks
    out: dict[str, list[float]] = {side: [] for side in steps}
    for side in sides:
        if len(out[side]) >= blocks:
            continue
        dev.sync()
        t0 = time.perf_counter_ns()
        for _ in range(BLOCK_STEPS):
            steps[side]()
        dev.sync()
        out[side].append((time.perf_counter_ns() - t0) / BLOCK_STEPS)
    return out


def profiled(dev: Device, step: Callable[[], None], path: Path, with_stack: bool) -> None:
    """Five steps under the profiler (wait 1, warmup 1, active 3), the trace gzipped to ``path``."""
    torch = dev.torch
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.name.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3)
    with torch.profiler.profile(
        activities=activities, schedule=schedule, record_shapes=True, with_stack=with_stack
    ) as prof:
        for _ in range(5):
            step()
            prof.step()
    dev.sync()
    export_gzipped(prof, path)


def capture_pattern(dev: Device, pattern: str, out: Path, blocks: int) -> dict[str, Any]:
    """One pattern: its sides timed (ABBA blocks) then profiled; its ``measured.json`` entry."""
    sides = [ONE_SIDE[pattern]] if pattern in ONE_SIDE else ["bad", "good"]
    steps = {side: make_step(dev, pattern, side == "bad") for side in sides}
    for step in steps.values():
        for _ in range(WARMUP):
            step()
    found = timed_blocks(dev, steps, blocks)
    entry: dict[str, Any] = {}
    for side, values in found.items():
        entry[f"{side}_blocks"] = [round(v) for v in values]
        entry[f"{side}_step_ns"] = round(statistics.fmean(values))
    for side, step in steps.items():
        profiled(dev, step, out / f"{pattern}_{side}.json.gz", with_stack=pattern == "recompute")
    del steps
    gc.collect()
    if dev.name.startswith("cuda"):
        dev.torch.cuda.empty_cache()
    return entry


def capture_all(
    out: Path, device: str, tiny: bool, blocks: int, patterns: list[str], log: Callable[[str], None]
) -> Path:
    """Every pattern into ``out`` (traces and ``measured.json``, rewritten after each pattern); its path."""
    import torch

    dev = Device(torch, device, "tiny" if tiny else "full")
    out.mkdir(parents=True, exist_ok=True)
    measured: dict[str, Any] = {}
    path = out / "measured.json"
    for pattern in patterns:
        started = time.perf_counter()
        measured[pattern] = capture_pattern(dev, pattern, out, max(blocks, MIN_BLOCKS))
        path.write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
        log(f"[{pattern}: {time.perf_counter() - started:.1f} s]")
    return path
