"""Every detector, in one list: each takes the :class:`AdviceContext` and returns findings."""

from __future__ import annotations

from collections.abc import Callable

from profparse.analysis.advice import gpu, host, training, waits
from profparse.analysis.advice.context import AdviceContext
from profparse.analysis.advice.finding import Finding

DETECTORS: tuple[Callable[[AdviceContext], list[Finding]], ...] = (
    host.data_loading,
    host.between_steps,
    waits.sync_in_step,
    host.allocator_churn,
    training.grad_zeroing,
    training.optimizer_not_batched,
    training.recompute,
    gpu.exposed_communication,
    gpu.launch_bound,
    gpu.fp32_matmul,
    waits.unpinned_copy,
)
