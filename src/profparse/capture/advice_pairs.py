"""Before/after CPU captures for ``profparse advise``: each pair is a training pattern and the same run with the
fix, so a finding's estimated saving can be checked against the step time the fix really saved.

Every run trains the capture's Qwen2 architecture (:data:`profparse.capture.options.DEFAULT_MODEL_CONFIG` with
the pair's size overrides, :data:`MODELS`): :data:`WARMUP_STEPS` unprofiled step(s), then :data:`STEPS` profiled
steps under a profiler schedule, so each step is a ``ProfilerStep#N``. No stage marks. The models are built
(seeded) once per process and copied for each run, so both sides of a pair start from the same weights.

The pairs (:data:`PAIRS`); ``good`` is always the plain loop (:data:`CLEAN`) on the pair's model and data:

- ``data_loading``: ``DataLoader(num_workers=0)`` whose ``__getitem__`` reads (a sleep standing for the I/O) and
  tokenises each sample in the training process, vs the same loader with four persistent worker processes;
- ``between_steps``: per-step bookkeeping after ``zero_grad``: every parameter's norm read with ``.item()``, a
  JSON metrics line appended to a log, ``torch.save`` of the model's and optimizer's ``state_dict``; vs none;
- ``grad_zeroing``: ``zero_grad(set_to_none=False)`` (a ``zero_`` per gradient, and backward then accumulates
  into the kept gradients) vs ``set_to_none=True``;
- ``optimizer_not_batched``: ``AdamW(foreach=False)`` (``_single_tensor_adamw``: a dozen ops per parameter) vs
  ``AdamW(fused=True)``; on the CPU ``foreach=True`` saves nothing measurable (the CPU ``_foreach_*`` ops loop
  over the tensors), the fused kernel does;
- ``recompute``: ``gradient_checkpointing_enable()`` (the decoder layers' forward runs again inside backward) vs
  no checkpointing.

:func:`measure` gives the step times of a pair from the traces (``profparse.parse(...).steps``). torch and
transformers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from profparse.capture.model import INIT_SEED
from profparse.capture.options import DEFAULT_MODEL_CONFIG
from profparse.capture.run import export_gzipped

WARMUP_STEPS = 1  # unprofiled: lazy initialisation, DataLoader workers, optimizer state
STEPS = 6  # profiled, each a ProfilerStep#N
LR = 1e-3
CLEAN = "clean"
READ_S = 0.040  # data_loading: the time one sample's read takes (a sleep standing for file or network I/O)
TOKENS_PER_WORD = 4  # data_loading: words of the synthetic text line per token kept

#: Size overrides of the default tiny Qwen2, per model. ``deep``: many small parameters, so per-parameter host
#: costs (optimizer ops, recompute) are clearly measurable; ``mid``: a short step, so a fixed host cost (a batch's
#: reads, a checkpoint) is a large share of it and the shared machine's noise a small one; ``wide``: big
#: gradients (large vocabulary), so memory traffic (zeroing, accumulating) is.
MODELS: dict[str, dict[str, Any]] = {
    "deep": {"num_hidden_layers": 56},
    "mid": {"num_hidden_layers": 12},
    "wide": {"vocab_size": 32768, "hidden_size": 256, "intermediate_size": 512},
}


@dataclass(frozen=True)
class Pair:
    """One kind's pair: the pattern (``bad``) and the same run with the fix (``good``), on ``model``."""

    kind: str
    model: str  # a key of MODELS
    batch: int
    seq_len: int
    bad: str
    good: str
    #: record Python stacks: the checkpoint's pack and unpack hooks run outside any op, so only their frames show
    #: what checkpointing costs beyond the recomputation
    with_stack: bool = False


PAIRS: dict[str, Pair] = {
    pair.kind: pair
    for pair in (
        Pair(
            "data_loading",
            "mid",
            2,
            16,
            "DataLoader(num_workers=0); __getitem__ reads (sleep) and tokenises each sample in the training process",
            "DataLoader(num_workers=4, persistent_workers=True): workers prepare the next batches",
        ),
        Pair(
            "between_steps",
            "mid",
            2,
            16,
            "per step: every parameter norm .item(), a JSON metrics line, torch.save of model + optimizer state",
            "no per-step bookkeeping",
        ),
        Pair(
            "grad_zeroing",
            "wide",
            1,
            8,
            "optimizer.zero_grad(set_to_none=False)",
            "optimizer.zero_grad(set_to_none=True)",
        ),
        Pair(
            "optimizer_not_batched",
            "deep",
            2,
            16,
            "AdamW(foreach=False): _single_tensor_adamw",
            "AdamW(fused=True)",
        ),
        Pair(
            "recompute",
            "deep",
            2,
            16,
            "model.gradient_checkpointing_enable()",
            "no activation checkpointing",
            with_stack=True,
        ),
    )
}
KINDS: tuple[str, ...] = tuple(PAIRS)
CLEAN_PAIR = Pair(CLEAN, "deep", 2, 16, "", "the plain loop: batches in memory, AdamW(fused=True), set_to_none=True")


def trace_name(kind: str, bad: bool) -> str:
    """``KIND_bad.json.gz`` / ``KIND_good.json.gz``; the clean run is ``clean.json.gz``."""
    return f"{kind}.json.gz" if kind == CLEAN else f"{kind}_{'bad' if bad else 'good'}.json.gz"


# -- the models ------------------------------------------------------------------------------------------------

_BUILT: dict[str, Any] = {}


def build_model(name: str) -> Any:
    """The seeded Qwen2 of :data:`MODELS` ``name``, built once per process; callers get a copy."""
    if name not in _BUILT:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(**{**DEFAULT_MODEL_CONFIG, **MODELS[name]})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            _BUILT[name] = Qwen2ForCausalLM(config)
    model = copy.deepcopy(_BUILT[name])
    model.train()
    return model


# -- the training loop -----------------------------------------------------------------------------------------


class TrainingLoop:
    """One training step per call: next batch, forward, backward, ``optimizer.step()``, ``zero_grad``, then the
    optional ``after_step(model, optimizer, loss)`` (host work between this step and the next)."""

    def __init__(
        self,
        model: Any,
        batches: Iterator[Any],
        optimizer: Any,
        set_to_none: bool = True,
        after_step: Callable[[Any, Any, Any], None] | None = None,
    ) -> None:
        self.model, self.batches, self.optimizer = model, batches, optimizer
        self.set_to_none, self.after_step = set_to_none, after_step

    def __call__(self) -> None:
        ids = next(self.batches)
        loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        if self.after_step is not None:
            self.after_step(self.model, self.optimizer, loss)


def _adamw(model: Any, batched: bool = True) -> Any:
    import torch

    if batched:
        return torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    return torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)


def _batches_in_memory(pair: Pair, vocab: int) -> Iterator[Any]:
    """Seeded random token ids, as many batches as any run asks for."""
    import torch

    gen = torch.Generator().manual_seed(0)
    while True:
        yield torch.randint(0, vocab, (pair.batch, pair.seq_len), generator=gen)


def plain_loop(pair: Pair, **loop_options: Any) -> TrainingLoop:
    """The plain good loop on the pair's model: batches in memory, fused AdamW, ``set_to_none=True``."""
    model = build_model(pair.model)
    return TrainingLoop(model, _batches_in_memory(pair, model.config.vocab_size), _adamw(model), **loop_options)


class TextSamples:
    """A dataset whose ``__getitem__`` does what a real one does on the host: read a sample (``READ_S`` of sleep
    standing for the file or network I/O) and tokenise a text line in Python (a CRC of each word)."""

    def __init__(self, vocab: int, seq_len: int, size: int) -> None:
        self.vocab, self.seq_len, self.size = vocab, seq_len, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        import torch

        time.sleep(READ_S)
        words = [f"w{index}-{i}" for i in range(self.seq_len * TOKENS_PER_WORD)]
        ids = [zlib.crc32(w.encode()) % self.vocab for w in words][::TOKENS_PER_WORD]
        return torch.tensor(ids, dtype=torch.long)


def _data_loading(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    from torch.utils.data import DataLoader

    model = build_model(pair.model)
    samples = TextSamples(model.config.vocab_size, pair.seq_len, pair.batch * (WARMUP_STEPS + steps))
    workers = {} if bad else {"num_workers": 4, "persistent_workers": True, "prefetch_factor": 2}
    with warnings.catch_warnings():  # more workers than this small machine's cores: they mostly wait on reads
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        loader = DataLoader(samples, batch_size=pair.batch, **workers)
        batches = iter(loader)  # workers start here, before the profiler
    stack.callback(getattr(batches, "_shutdown_workers", lambda: None))
    return TrainingLoop(model, batches, _adamw(model))


def log_and_checkpoint(folder: Path) -> Callable[[Any, Any, Any], None]:
    """Per-step bookkeeping as training scripts write it: every parameter's norm read with ``.item()``, a JSON
    metrics line appended to ``folder/metrics.jsonl``, the model's and the optimizer's ``state_dict`` saved to
    ``folder/last.pt``."""
    import torch

    def bookkeeping(model: Any, optimizer: Any, loss: Any) -> None:
        norms = {name: p.detach().norm().item() for name, p in model.named_parameters()}
        record = {"loss": loss.item(), "param_norm": math.sqrt(sum(v * v for v in norms.values())), "norms": norms}
        with open(folder / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "last.pt")

    return bookkeeping


def _between_steps(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    if not bad:
        return plain_loop(pair)
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="profparse-advice-")))
    return plain_loop(pair, after_step=log_and_checkpoint(folder))


def _grad_zeroing(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    return plain_loop(pair, set_to_none=not bad)


def _optimizer_not_batched(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    model = build_model(pair.model)
    return TrainingLoop(model, _batches_in_memory(pair, model.config.vocab_size), _adamw(model, batched=not bad))


def _recompute(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    loop = plain_loop(pair)
    if bad:
        with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing_enable
            warnings.simplefilter("ignore", FutureWarning)
            loop.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return loop


def _clean(pair: Pair, bad: bool, stack: contextlib.ExitStack, steps: int) -> TrainingLoop:
    return plain_loop(pair)


_SETUPS: dict[str, Callable[[Pair, bool, contextlib.ExitStack, int], TrainingLoop]] = {
    "data_loading": _data_loading,
    "between_steps": _between_steps,
    "grad_zeroing": _grad_zeroing,
    "optimizer_not_batched": _optimizer_not_batched,
    "recompute": _recompute,
    CLEAN: _clean,
}


# -- capturing -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """One intra-op thread: step times on a small shared machine vary far less than with a thread per core."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Collect, then freeze what is alive (torch, transformers, the model) out of the garbage collector's reach:
    else a full collection of that heap (over a second) lands in whichever profiled step crosses the collector's
    threshold (with checkpointing's many small objects, the sixth) and swamps the pair's difference."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _profiler(with_stack: bool, steps: int) -> Any:
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*won't be using warmup.*")
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1)
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        record_shapes=True,
        profile_memory=True,
        with_stack=with_stack,
    )


def capture_run(kind: str, bad: bool, out_path: str | Path, with_stack: bool = False, steps: int = STEPS) -> Path:
    """Capture one side of ``kind``'s pair (or the clean run, ``kind=CLEAN``) into ``out_path`` (``.json.gz``):
    :data:`WARMUP_STEPS` unprofiled steps, then ``steps`` profiled ones."""
    if kind not in _SETUPS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {(*KINDS, CLEAN)}")
    pair = CLEAN_PAIR if kind == CLEAN else PAIRS[kind]
    with_stack = with_stack or pair.with_stack
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with one_intra_op_thread(), contextlib.ExitStack() as stack:
        step = _SETUPS[kind](pair, bad, stack, steps)
        for _ in range(WARMUP_STEPS):
            step()
        stack.enter_context(_frozen_heap())
        prof = _profiler(with_stack, steps)
        with prof:
            for _ in range(steps):
                step()
                prof.step()
    return export_gzipped(prof, out)


def capture_pair(kind: str, out_dir: str | Path, with_stack: bool = False, steps: int = STEPS) -> tuple[Path, Path]:
    """Capture ``kind``'s pattern and fix into ``out_dir``: (``KIND_bad.json.gz``, ``KIND_good.json.gz``)."""
    folder = Path(out_dir)
    bad = capture_run(kind, True, folder / trace_name(kind, True), with_stack, steps)
    good = capture_run(kind, False, folder / trace_name(kind, False), with_stack, steps)
    return bad, good


def capture_clean(out_dir: str | Path, with_stack: bool = False, steps: int = STEPS) -> Path:
    """Capture the clean run (the plain good loop) into ``out_dir/clean.json.gz``."""
    return capture_run(CLEAN, False, Path(out_dir) / trace_name(CLEAN, False), with_stack, steps)


# -- measuring -------------------------------------------------------------------------------------------------


class Measurement(NamedTuple):
    """The step times (ns) of both sides of a pair, the first profiled step left out (profiler start-up)."""

    bad_step_ns: np.ndarray
    good_step_ns: np.ndarray

    @property
    def bad_mean_ns(self) -> float:
        return float(self.bad_step_ns.mean())

    @property
    def good_mean_ns(self) -> float:
        return float(self.good_step_ns.mean())

    @property
    def difference_ns(self) -> float:
        """The measured saving per step: mean bad step minus mean good step."""
        return self.bad_mean_ns - self.good_mean_ns

    @property
    def median_difference_ns(self) -> float:
        """The difference of the median steps: less moved than the means by a step another process slowed."""
        return float(np.median(self.bad_step_ns) - np.median(self.good_step_ns))

    @property
    def fast_half_difference_ns(self) -> float:
        """The difference of each side's fastest half of steps (their means): other processes only ever slow a
        step down, so the fast half is the least disturbed, and a mean of several steps moves less than one."""
        return _fast_half_mean(self.bad_step_ns) - _fast_half_mean(self.good_step_ns)

    @property
    def fastest_difference_ns(self) -> float:
        """The difference of the fastest steps: other processes only ever slow a step down, so on a shared
        machine the fastest step of each side is the least disturbed."""
        return float(self.bad_step_ns.min() - self.good_step_ns.min())


def step_times_ns(trace: str | Path) -> np.ndarray:
    """The durations (ns) of a trace's ``ProfilerStep#N`` windows after the first."""
    import profparse

    steps = profparse.parse(trace).steps
    durations = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.int64)
    return durations[1:]


def _fast_half_mean(step_ns: np.ndarray) -> float:
    fast = np.sort(step_ns)[: max(1, (len(step_ns) + 1) // 2)]
    return float(fast.mean())


def measure(bad_trace: str | Path, good_trace: str | Path) -> Measurement:
    """Both sides' step times; ``.difference_ns`` is the measured per-step saving of the fix."""
    return Measurement(step_times_ns(bad_trace), step_times_ns(good_trace))
