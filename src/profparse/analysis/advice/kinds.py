"""The vocabulary of findings, as data: what each kind catches, the one change that fixes it, and its detector.

A new finding kind is one :class:`Kind` entry in :data:`KINDS` plus its detector: a function named as the kind, in
its family's module (``host``, ``waits``, ``training``, ``gpu``), marked with :func:`detector`. The detectors run in
:data:`KINDS` order (:func:`profparse.analysis.advice.detectors.registered`). docs/advice.md has a paragraph per kind
(trigger, how the saving is estimated, the fix); a test checks both lists name the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profparse.analysis.advice.context import AdviceContext

#: a detector: the context in, that kind's findings out (Finding objects; finding.py imports this module)
Detector = Callable[["AdviceContext"], list[Any]]


@dataclass(frozen=True)
class Kind:
    """One kind of finding."""

    name: str
    catches: str  # what the pattern is, in a line
    fix: str  # the concrete change, naming the API or flag
    min_share: float = 0.01  # reported from this share of a step on
    min_ns: float = 0.0  # and from this saving per step on
    across_ranks: bool = False  # found by comparing ranks (profparse.ranks.advice), not by a detector on one trace

    @property
    def detector(self) -> Detector | None:
        """The function that finds this kind in one trace (registered with :func:`detector`)."""
        return _DETECTORS.get(self.name)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "data_loading",
            "the host waits for the next batch on the critical path",
            "load batches in worker processes: DataLoader(num_workers=N, pin_memory=True, persistent_workers=True),"
            " and keep __getitem__ / collate_fn light",
        ),
        Kind(
            "between_steps",
            "host work between the optimizer step and the next forward on the critical path",
            "move logging, metrics and checkpoint bookkeeping off the step: log every N steps, read scalars with"
            " .item() once per log, save checkpoints asynchronously (torch.distributed.checkpoint.async_save)",
            # a few ms between steps is the interpreter freeing the step's tensors, the loop and the profiler's own
            # step bookkeeping (untraced): 5% of a profiled step, about 6% of the step without the profiler
            min_share=0.06,
            min_ns=1e6,
        ),
        Kind(
            "sync_in_step",
            "device synchronisations inside the step that stall the host",
            "remove .item(), print(tensor), tensor.cpu() and torch.cuda.synchronize() from the step; keep metrics on"
            " the device and read them every N steps",
        ),
        Kind(
            "allocator_churn",
            "cudaMalloc/cudaFree (hipMalloc/hipFree) inside steps",
            "let the caching allocator keep its blocks: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or"
            " PYTORCH_HIP_ALLOC_CONF), avoid torch.cuda.empty_cache() in the loop, keep shapes stable",
        ),
        Kind(
            "exposed_communication",
            "collectives that no computation overlaps",
            "overlap communication with backward: DDP(bucket_cap_mb=..., gradient_as_bucket_view=True), FSDP"
            " backward_prefetch=BACKWARD_PRE and forward_prefetch=True",
        ),
        Kind(
            "launch_bound",
            "the GPU idles between small kernels while the host launches them",
            "launch fewer, larger kernels: torch.compile(model, mode='reduce-overhead') or CUDA graphs"
            " (torch.cuda.graphs), bigger batches",
        ),
        Kind(
            "grad_zeroing",
            "gradients zeroed with memsets / zero_ instead of being dropped",
            "optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0)",
        ),
        Kind(
            "optimizer_not_batched",
            "the optimizer runs its math one parameter at a time",
            "batch the optimizer over all parameters: torch.optim.AdamW(..., fused=True) (CPU and GPU), or"
            " foreach=True",
        ),
        Kind(
            "recompute",
            "activation checkpointing runs the forward again inside backward",
            "if memory allows, turn checkpointing off (model.gradient_checkpointing_disable()) or checkpoint fewer"
            " layers; the evidence gives the memory it saves",
        ),
        Kind(
            "fp32_matmul",
            "fp32 matmuls without TF32/bf16 on a GPU that has faster math modes",
            "torch.backends.cuda.matmul.allow_tf32 = True (torch.set_float32_matmul_precision('high')), or"
            " torch.autocast(device_type='cuda', dtype=torch.bfloat16)",
        ),
        Kind(
            "unpinned_copy",
            "host-to-device copies from pageable memory on the critical path",
            "copy from pinned memory without blocking: DataLoader(pin_memory=True) and"
            " tensor.to(device, non_blocking=True)",
        ),
        Kind(
            "late_rank",
            "a rank the others wait for in collectives",
            "balance the late rank's work (data, sequence lengths, host load) or find what slows it in its own"
            " findings",
            across_ranks=True,
        ),
    )
}

_DETECTORS: dict[str, Detector] = {}


def detector(function: Detector) -> Detector:
    """Mark ``function`` as the detector of the kind it is named after (it takes the :class:`AdviceContext` and
    returns that kind's findings)."""
    kind = KINDS.get(function.__name__)
    if kind is None or kind.across_ranks:
        raise ValueError(f"{function.__qualname__}: no single-trace finding kind named {function.__name__!r} in KINDS")
    _DETECTORS[kind.name] = function
    return function
