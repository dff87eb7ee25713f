"""Marked CPU captures of common training patterns: the ground truth that stage attribution is measured against.

Each pattern profiles a tiny training session (the capture's tiny Qwen2 where a transformers model fits) and wraps
the true stages in ``profparse.stage:<stage>`` ranges exactly as :mod:`profparse.capture.run` does. Everything
outside the marks (data loading, batch preparation, logging, optimizer creation) is ``other``.
:func:`strip_marks` writes the same trace without the marks: attribution of the stripped copy against the marked
original is what :func:`profparse.analysis.agreement.agreement` scores.

Patterns (:data:`PATTERNS`):

- ``grad_accum``: two micro-batches (forward + backward each) per optimizer step;
- ``checkpointing``: Hugging Face ``gradient_checkpointing_enable()``; the recomputed forward runs inside
  ``loss.backward()`` and is backward;
- ``compiled``: ``torch.compile`` of the model; compilation happens in an unprofiled warm-up step (so the trace
  holds the compiled steps, not the compiler);
- ``zero_grad_first``: ``zero_grad`` before forward, fused AdamW, gradient clipping and an LR scheduler (all
  optimizer);
- ``no_profiler_step``: the profiler without a schedule and no ``prof.step()``: no ``ProfilerStep#N`` at all;
- ``plain_module``: a plain ``nn.Module`` built and filled by ``load_state_dict(torch.load(...))`` (no
  transformers);
- ``ddp``: two-process ``DistributedDataParallel`` on gloo (localhost); each rank writes its trace (rank 1's
  file name has ``.rank1`` before ``.json.gz``);
- ``dataloader``: batches from a ``DataLoader`` with two worker processes.

torch (and transformers) are imported inside the functions: importing this module does not need them.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from profparse.base import marks

PATTERNS: tuple[str, ...] = (
    "grad_accum",
    "checkpointing",
    "compiled",
    "zero_grad_first",
    "no_profiler_step",
    "plain_module",
    "ddp",
    "dataloader",
)
STEPS = 2  # optimizer steps per capture
BATCH = 2
SEQ_LEN = 16
MICRO_BATCHES = 2  # grad_accum
LR = 1e-3
COMPILE_BACKEND_ENV = "PROFPARSE_COMPILE_BACKEND"  # inductor (default) or aot_eager, eager, ...


class LateSleep(NamedTuple):
    """A rank made late on purpose: ``rank`` sleeps ``seconds`` at the start of ``stage`` in every training step."""

    rank: int
    stage: str
    seconds: float


def trace_name(pattern: str, with_stack: bool) -> str:
    """The file name of a pattern's trace: ``NAME_stack.json.gz`` / ``NAME_nostack.json.gz``."""
    return f"{pattern}_{'stack' if with_stack else 'nostack'}.json.gz"


def rank_path(path: Path, rank: int) -> Path:
    """Where rank ``rank`` of a DDP capture writes: ``path`` itself for rank 0, ``X.rank1.json.gz`` for rank 1."""
    if rank == 0:
        return path
    base = path.name[: -len(".json.gz")] if path.name.endswith(".json.gz") else path.stem
    return path.with_name(f"{base}.rank{rank}.json.gz")


# -- the profiled session --------------------------------------------------------------------------------------


class _Session:
    """torch.profiler around a pattern: stage marks, ``prof.step()`` (when scheduled) and the export."""

    def __init__(self, with_stack: bool, scheduled: bool = True, steps: int = STEPS) -> None:
        import torch

        self.torch = torch
        kwargs: dict[str, Any] = {}
        if scheduled:  # ProfilerStep#N is recorded only under a schedule (see capture/run.py)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*won't be using warmup.*")
                kwargs["schedule"] = torch.profiler.schedule(wait=0, warmup=0, active=steps + 1, repeat=1)
        self.scheduled = scheduled
        self.prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            with_stack=with_stack,
            record_shapes=True,
            profile_memory=True,
            **kwargs,
        )

    def mark(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return self.torch.profiler.record_function(marks.stage_mark(stage))

    def step(self) -> None:
        if self.scheduled:
            self.prof.step()

    @contextlib.contextmanager
    def running(self) -> Iterator[_Session]:
        with self.prof:
            yield self

    def export(self, out_path: Path) -> Path:
        """Chrome trace to a temporary .json, gzipped to a temporary name, renamed (as capture/run.py does)."""
        from profparse.capture.run import export_gzipped

        out_path.parent.mkdir(parents=True, exist_ok=True)
        return export_gzipped(self.prof, out_path)


# -- the tiny Qwen2 --------------------------------------------------------------------------------------------

_WARM: set[str] = set()


def _hf_path() -> Path:
    from profparse.capture.model import ensure_model

    return ensure_model()[0]


def _hf_start(batches: int, with_stack: bool, seed: int = 0, **session: Any) -> tuple[Path, list[Any], _Session]:
    """What every capture of the tiny Qwen2 starts with: the model built and warmed up, ``batches`` batches of
    token ids, torch's seed reset, and a profiling session (not yet running)."""
    import torch

    path = _hf_path()
    _warm_up(path)
    ids = _inputs(_vocab(path), batches, seed=seed)
    torch.manual_seed(0)
    return path, ids, _Session(with_stack, **session)


def load_pretrained(path: Path) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` of the tiny model, quietly (no progress-bar frames)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from profparse.capture.run import dtype_keyword, quiet_transformers
    from profparse.capture.run import from_pretrained_with_dtype as load

    with quiet_transformers(transformers, True):
        return load(AutoModelForCausalLM, path, torch.float32, dtype_keyword(transformers))


def _warm_up(path: Path) -> None:
    """One unprofiled load per process, so the profiled load is warm (no lazy imports in the trace)."""
    if str(path) not in _WARM:
        load_pretrained(path)
        _WARM.add(str(path))


def _inputs(vocab: int, n: int, seed: int = 0) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (BATCH, SEQ_LEN), generator=gen) for _ in range(n)]


def _vocab(path: Path) -> int:
    from profparse.capture.run import model_vocab_size

    return model_vocab_size(path)


def _hf_load(s: _Session, path: Path, prepare: Callable[[Any], Any] | None = None) -> Any:
    """The load stage: ``from_pretrained``, ``.to("cpu")`` and ``prepare(model)`` inside the load mark; then
    ``model.train()``."""
    with s.mark("load"):
        model = load_pretrained(path).to("cpu")
        if prepare is not None:
            model = prepare(model)
    model.train()
    return model


def _hf_step(s: _Session, model: Any, optimizer: Any, ids: Any, sleep: LateSleep | None = None) -> Any:
    """One plain training step: forward, backward, optimizer step + zero_grad, each in its mark; ``sleep`` first
    sleeps its seconds at the start of its stage (a rank made late by a known amount)."""
    with s.mark("forward"):
        _sleep_in(sleep, "forward")
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    with s.mark("backward"):
        _sleep_in(sleep, "backward")
        loss.backward()
    with s.mark("optimizer"):
        _sleep_in(sleep, "optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss


def _sleep_in(sleep: LateSleep | None, stage: str) -> None:
    """Sleep when ``stage`` is the sleep's: a host stall with no op, as a slow data loader or a stuck rank shows."""
    if sleep is not None and sleep.stage == stage:
        time.sleep(sleep.seconds)


def _hf_session(
    out_path: Path,
    with_stack: bool,
    prepare: Callable[[Any], Any] | None = None,
    scheduled: bool = True,
) -> Path:
    """Load (step 0, ``prepare(model)`` inside the load mark) then :data:`STEPS` plain training steps."""
    import torch

    path, ids, s = _hf_start(STEPS, with_stack, scheduled=scheduled)
    with s.running():
        model = _hf_load(s, path, prepare)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        s.step()
        for batch in ids:
            _hf_step(s, model, optimizer, batch)
            s.step()
    return s.export(out_path)


# -- the patterns ----------------------------------------------------------------------------------------------


def _grad_accum(out_path: Path, with_stack: bool) -> Path:
    import torch

    path, ids, s = _hf_start(STEPS * MICRO_BATCHES, with_stack)
    with s.running():
        model = _hf_load(s, path)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        s.step()
        for i in range(STEPS):
            for micro in ids[i * MICRO_BATCHES : (i + 1) * MICRO_BATCHES]:
                with s.mark("forward"):
                    loss = model(input_ids=micro, labels=micro, use_cache=False).loss / MICRO_BATCHES
                with s.mark("backward"):
                    loss.backward()
            with s.mark("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            s.step()
    return s.export(out_path)


def _checkpointing(out_path: Path, with_stack: bool) -> Path:
    def enable(model: Any) -> Any:
        with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing_enable
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    return _hf_session(out_path, with_stack, prepare=enable)


def _compiled(out_path: Path, with_stack: bool) -> Path:
    """Compile and run one step unprofiled (dynamo, AOT autograd, inductor), then profile load + steps of a
    freshly loaded model under the same compiled code (same class and shapes: no recompilation)."""
    import torch

    backend = os.environ.get(COMPILE_BACKEND_ENV, "inductor")
    path = _hf_path()
    ids = _inputs(_vocab(path), STEPS)
    warm = torch.compile(load_pretrained(path), backend=backend)
    warm.train()
    warm(input_ids=ids[0], labels=ids[0], use_cache=False).loss.backward()
    _WARM.add(str(path))
    del warm
    torch.manual_seed(0)
    s = _Session(with_stack)
    with s.running():
        with s.mark("load"):
            model = torch.compile(load_pretrained(path).to("cpu"), backend=backend)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        s.step()
        for batch in ids:
            _hf_step(s, model, optimizer, batch)
            s.step()
    return s.export(out_path)


def _zero_grad_first(out_path: Path, with_stack: bool) -> Path:
    import torch

    path, ids, s = _hf_start(STEPS, with_stack)
    with s.running():
        model = _hf_load(s, path)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        s.step()
        for batch in ids:
            with s.mark("optimizer"):
                optimizer.zero_grad(set_to_none=True)
            with s.mark("forward"):
                loss = model(input_ids=batch, labels=batch, use_cache=False).loss
            with s.mark("backward"):
                loss.backward()
            with s.mark("optimizer"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
            s.step()
    return s.export(out_path)


def _no_profiler_step(out_path: Path, with_stack: bool) -> Path:
    return _hf_session(out_path, with_stack, scheduled=False)


def _plain_model(vocab: int) -> Any:
    """A small language model from plain ``torch.nn`` parts: embedding, two MLP blocks, a head."""
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self, vocab: int, hidden: int = 64) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(
                nn.Sequential(
                    nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
                )
                for _ in range(2)
            )
            self.head = nn.Linear(hidden, vocab)

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids)
            for block in self.blocks:
                x = x + block(x)
            return self.head(x)

    return TinyLM(vocab)


def _plain_module(out_path: Path, with_stack: bool) -> Path:
    import tempfile

    import torch

    vocab = 1024
    ids = _inputs(vocab, STEPS)
    with tempfile.TemporaryDirectory(prefix="profparse-plain-") as tmp:
        weights = Path(tmp) / "tiny_lm.pt"
        torch.manual_seed(1)
        torch.save(_plain_model(vocab).state_dict(), weights)
        torch.manual_seed(0)
        s = _Session(with_stack)
        with s.running():
            with s.mark("load"):
                model = _plain_model(vocab)
                model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
                model = model.to("cpu")
            model.train()
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
            s.step()
            for batch in ids:
                with s.mark("forward"):
                    logits = model(batch)
                    loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), batch.view(-1))
                with s.mark("backward"):
                    loss.backward()
                with s.mark("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                s.step()
        return s.export(out_path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ddp_rank(rank: int, world: int, port: int, out_path: str, with_stack: bool, late: LateSleep | None = None) -> None:
    """One DDP rank (run by ``torch.multiprocessing.spawn``): load, wrap (load), train, write its trace; the rank
    ``late.rank`` sleeps in ``late.stage`` of every training step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        path, ids, s = _hf_start(STEPS, with_stack, seed=rank)
        with s.running():
            with s.mark("load"):
                model = DistributedDataParallel(load_pretrained(path).to("cpu"))
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
            s.step()
            for batch in ids:
                _hf_step(s, model, optimizer, batch, late if late is not None and late.rank == rank else None)
                s.step()
        s.export(rank_path(Path(out_path), rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ddp(out_path: Path, with_stack: bool) -> Path:
    return capture_ddp(out_path, with_stack)


def capture_ddp(out_path: str | os.PathLike[str], with_stack: bool = False, late: LateSleep | None = None) -> Path:
    """The ``ddp`` pattern (two gloo ranks; returns rank 0's path), optionally with one rank made late: rank
    ``late.rank`` sleeps ``late.seconds`` at the start of ``late.stage`` in every training step (the ground truth
    of the late-rank analysis, ``profparse.ranks.late``)."""
    import torch.multiprocessing as mp

    _hf_path()  # build the model once, before the ranks race to
    world = 2
    args = (world, _free_port(), str(out_path), with_stack, late)
    mp.spawn(_ddp_rank, args=args, nprocs=world, join=True)
    return Path(out_path)


def _dataloader(out_path: Path, with_stack: bool) -> Path:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    path = _hf_path()
    _warm_up(path)
    ids = torch.cat(_inputs(_vocab(path), STEPS))
    loader = DataLoader(TensorDataset(ids), batch_size=BATCH, num_workers=2)
    torch.manual_seed(0)
    s = _Session(with_stack)
    with s.running():
        model = _hf_load(s, path)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        s.step()
        for (batch,) in loader:
            _hf_step(s, model, optimizer, batch)
            s.step()
    return s.export(out_path)


_CAPTURES: dict[str, Callable[[Path, bool], Path]] = {
    "grad_accum": _grad_accum,
    "checkpointing": _checkpointing,
    "compiled": _compiled,
    "zero_grad_first": _zero_grad_first,
    "no_profiler_step": _no_profiler_step,
    "plain_module": _plain_module,
    "ddp": _ddp,
    "dataloader": _dataloader,
}


def capture_pattern(name: str, out_path: str | os.PathLike[str], with_stack: bool) -> Path:
    """Capture pattern ``name`` (one of :data:`PATTERNS`) into ``out_path`` (``.json.gz``); returns the path.

    For ``ddp`` the path is rank 0's trace; rank 1's is :func:`rank_path` (path, 1)."""
    if name not in _CAPTURES:
        raise ValueError(f"unknown pattern {name!r}; expected one of {PATTERNS}")
    return _CAPTURES[name](Path(out_path), with_stack)


# -- stripping the marks ---------------------------------------------------------------------------------------


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _event_spans(text: str) -> tuple[int, int, list[tuple[int, int, Any]]]:
    """The ``traceEvents`` array of a Chrome trace: (offset of ``[``, offset after ``]``, (start, end, event) of
    every element). Elements are located with ``raw_decode`` so their original text can be kept verbatim."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a Chrome trace object")
    i += 1
    while True:
        i = _skip_ws(text, i)
        key, i = decoder.raw_decode(text, i)
        i = _skip_ws(text, i)
        if text[i] != ":":
            raise ValueError("malformed trace object")
        i = _skip_ws(text, i + 1)
        if key != "traceEvents":
            _, i = decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            if text[i] != ",":
                raise ValueError("trace has no traceEvents array")
            i += 1
            continue
        if text[i] != "[":
            raise ValueError("traceEvents is not an array")
        open_at, i = i, _skip_ws(text, i + 1)
        spans: list[tuple[int, int, Any]] = []
        while text[i] != "]":
            event, end = decoder.raw_decode(text, i)
            spans.append((i, end, event))
            i = _skip_ws(text, end)
            if text[i] == ",":
                i = _skip_ws(text, i + 1)
        return open_at, i + 1, spans


def is_stage_mark(event: Any) -> bool:
    """A ``profparse.stage:*`` event: the host range or its GPU counterpart (``gpu_user_annotation``)."""
    return isinstance(event, dict) and str(event.get("name", "")).startswith(marks.STAGE_MARK_PREFIX)


def strip_marks(trace_in: str | os.PathLike[str], trace_out: str | os.PathLike[str]) -> int:
    """Write ``trace_in`` without its ``profparse.stage:*`` events; return how many were removed.

    Every other event keeps its exact text (times included), in the same order. Kineto gives a
    ``record_function`` range no flow events of its own; a GPU-side copy (``gpu_user_annotation``) has the same
    name and goes too. ``.gz`` names are read and written gzipped."""
    src, dest = Path(trace_in), Path(trace_out)
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt", encoding="utf-8") as f:
        text = f.read()
    open_at, close_at, spans = _event_spans(text)
    kept = [text[a:b] for a, b, event in spans if not is_stage_mark(event)]
    removed = len(spans) - len(kept)
    body = text[: open_at + 1] + "\n" + ",\n".join(kept) + "\n]" + text[close_at:]
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        out_opener = gzip.open if dest.suffix == ".gz" else open
        with out_opener(tmp, "wt", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return removed
