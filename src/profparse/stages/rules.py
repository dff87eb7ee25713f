"""The stage rules: one table of data, read top to bottom.

Each rule matches host events by kind, name (regular expression) and thread name. A matching event and everything
nested inside it on its thread get the rule's stage, unless a rule of higher priority matches the event or one of
its ancestors; on equal priority the innermost match wins. GPU activity takes the stage (and rule) of the CPU op
that launched it. Every attributed row stores the rule's ``name`` in ``stage_rule``.

Rules whose condition names a phase (:mod:`profparse.stages.phases`) are applied in a second pass: the other
rules decide first, their decisions are the evidence that places the phases.

Conditions (``when``, several joined by commas must all hold):
  ``always``            the rule applies anywhere;
  ``before_first_step`` only to events that start before the first step window;
  ``after_last_step``   only to events that start after the last step window ended;
  ``main_thread``       only on the trace's main thread (the one that holds ``ProfilerStep#N``);
  ``autograd_thread``   only on the autograd engine's threads: named ``pt_autograd*``, or (older traces) any
                        thread other than the main one that runs autograd nodes (``*Backward*`` ops);
  ``not_autograd_thread`` the opposite;
  ``forward_linked``    only ops that recorded autograd history: they start a ``fwdbwd`` flow, or (older traces
                        without those flows) carry the ``Sequence number`` of a backward node;
  phase conditions (main thread only): ``forward_phase``, ``backward_phase``, ``optimizer_phase``,
  ``load_phase`` (inside a run of that stage's evidence), ``before_forward`` (in the gap just before a forward
  run), ``between_forward_and_backward`` (just before a backward run, after the last forward op),
  ``between_backward_and_optimizer``, ``after_forward``, ``after_backward``, ``after_optimizer`` (in the gap
  right after a run of that stage), ``before_first_forward`` (before the trace's first forward, outside the
  first training step, when that time holds loading ops), ``in_step``
  (inside a step window; anywhere when the trace has none), ``no_training`` (forward evidence but no backward or
  optimizer evidence in the whole trace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class StageRule:
    """One row of the rule table."""

    name: str
    stage: str
    priority: int
    pattern: str | None = None
    kinds: tuple[str, ...] | None = None
    thread: str | None = None
    when: str = "always"
    source: str = "pytorch"
    doc: str = ""


HOST_SPANS = ("cpu_op", "user_annotation")
PY = ("python_function",)

# fmt: off
COLLECTIVE = r"^(nccl:|c10d::|gloo:|record_param_comms$)"
SYNC = r"(?i)synchronize$"
RUNTIME = ("cuda_runtime", "cuda_driver")
RULES: tuple[StageRule, ...] = (
    # -- profparse's own marks (capture.py, or any user emitting the same record_function names) -----------
    StageRule("mark.load", "load", 100, r"^profparse\.stage:load$", HOST_SPANS, source="mark",
              doc="profparse.stage:load range"),
    StageRule("mark.forward", "forward", 100, r"^profparse\.stage:forward$", HOST_SPANS, source="mark",
              doc="profparse.stage:forward range"),
    StageRule("mark.backward", "backward", 100, r"^profparse\.stage:backward$", HOST_SPANS, source="mark",
              doc="profparse.stage:backward range"),
    StageRule("mark.optimizer", "optimizer", 100, r"^profparse\.stage:optimizer$", HOST_SPANS, source="mark",
              doc="profparse.stage:optimizer range"),
    # -- a user's own ranges with the plain stage names (e.g. '## forward ##') ------------------------------
    StageRule("user_mark.forward", "forward", 95, r"(?i)^[#\s]*forward[#\s]*$", ("user_annotation",),
              source="user_mark", doc="user range named forward"),
    StageRule("user_mark.backward", "backward", 95, r"(?i)^[#\s]*backward[#\s]*$", ("user_annotation",),
              source="user_mark", doc="user range named backward"),
    StageRule("user_mark.optimizer", "optimizer", 95, r"(?i)^[#\s]*optimi[sz]er([ _.]step)?[#\s]*$",
              ("user_annotation",), source="user_mark", doc="user range named optimizer"),
    # -- well-known words in a user's range names (evidence, kept with --no-marks) ---------------------------
    StageRule("user_range.zero_grad", "optimizer", 92, r"(?i)^(?!Optimizer\.).*zero_grad", ("user_annotation",),
              doc="user range whose name holds zero_grad"),
    # -- what PyTorch records by itself ---------------------------------------------------------------------
    StageRule("optimizer.range", "optimizer", 90, r"^Optimizer\.(step|zero_grad)#", HOST_SPANS,
              doc="Optimizer.step#<Class>.step / Optimizer.zero_grad#<Class>.zero_grad"),
    StageRule("optimizer.python", "optimizer", 90,
              r"torch/optim/[\w/]+\.py\(\d+\): (step|zero_grad)$|torch/optim/optimizer\.py\(\d+\): wrapper$"
              r"|torch/nn/modules/module\.py\(\d+\): zero_grad$|torch/nn/utils/clip_grad\.py\(\d+\): "
              r"clip_grad_(norm|value)_$",
              PY, doc="optimizer and LR scheduler step / zero_grad, Module.zero_grad, gradient clipping frames"),
    StageRule("optimizer.fused_op", "optimizer", 88, r"^aten::_fused_(adamw?|sgd|adagrad)_$", ("cpu_op",),
              doc="fused optimizer kernels' ops (outside an Optimizer.step range)"),
    StageRule("backward.engine", "backward", 80, r"^autograd::engine::evaluate_function: ", HOST_SPANS,
              doc="autograd engine node wrapper"),
    StageRule("backward.python", "backward", 80,
              r"torch/(_tensor\.py|autograd/__init__\.py|autograd/graph\.py)\(\d+\): (backward|_engine_run_backward)$",
              PY, doc="Tensor.backward / torch.autograd.backward Python frames"),
    StageRule("backward.node", "backward", 75, r"(Backward\d*|^torch::autograd::AccumulateGrad)$", ("cpu_op",),
              doc="autograd node ops (legacy traces without evaluate_function wrappers)"),
    StageRule("backward.ddp_reducer", "backward", 78, r"^torch\.distributed\.ddp\.reducer::", ("cpu_op",),
              doc="DDP's reducer finishing the backward pass (bucket copies to .grad) on the main thread"),
    StageRule("backward.thread", "backward", 70, None, None, when="autograd_thread",
              doc="anything on the autograd engine's thread (named pt_autograd*, or a side thread running "
                  "autograd nodes)"),
    StageRule("load.from_pretrained", "load", 60,
              r": (from_pretrained|_from_config|from_config)$|\(\d+\): (load_state_dict|_load_pretrained_model"
              r"|load_checkpoint|load_model|load_file|safe_open|_load_state_dict_into_meta_model)$|"
              r"torch/serialization\.py\(\d+\): load$",
              PY, doc="model loading Python frames (transformers, safetensors, torch.load)"),
    StageRule("load.module_to", "load", 60, r"torch/nn/modules/module\.py\(\d+\): (to|cuda|to_empty)$", PY,
              doc="nn.Module.to / .cuda Python frames"),
    StageRule("other.optimizer_init", "other", 55, r"torch/optim/[\w/]+\.py\(\d+\): __init__$", PY,
              doc="creating an optimizer or LR scheduler"),
    StageRule("other.data", "other", 50,
              r"^enumerate\(DataLoader\)#|dataloader\.py\(\d+\): __next__$", HOST_SPANS + PY,
              doc="DataLoader iteration"),
    StageRule("other.data.user_range", "other", 50,
              r"(?i)^(?!.*dataparallel).*(data|batch)", ("user_annotation",),
              doc="user range whose name holds data or batch (dataloader, load_batch, copy_batch_to_gpu, ...)"),
    StageRule("other.metrics.user_range", "other", 50, r"(?i)metric|(^|[^a-z])log(s|ging)?([^a-z]|$)",
              ("user_annotation",), doc="user range whose name holds metric(s) or log"),
    StageRule("load.h2d_copy", "load", 40, r"^aten::(to|_to_copy|copy_)$", ("cpu_op",),
              when="before_first_step", doc="host-to-device copies before the first step"),
    StageRule("forward.module", "forward", 30,
              r"^nn\.Module: |^(DistributedDataParallel|FullyShardedDataParallel)\.forward$", HOST_SPANS + PY,
              doc="nn.Module calls and DDP/FSDP forward ranges"),
    StageRule("forward.compiled", "forward", 30, r"^TorchDynamo Cache Lookup$|^Torch-Compiled Region",
              HOST_SPANS, when="not_autograd_thread",
              doc="entering torch.compile'd code off the autograd threads (inside the engine, backward wins)"),
    StageRule("forward.autograd_op", "forward", 25, None, ("cpu_op",), when="forward_linked,not_autograd_thread",
              doc="an op that recorded autograd history (linked to its backward node)"),
    # -- the step phase model (second pass: the rules above are its evidence) -------------------------------
    StageRule("backward.loss_seed", "backward", 18,
              r"^aten::(ones_like|empty_like|fill_|empty_strided|ones|new_ones|full_like)$", ("cpu_op",),
              when="between_forward_and_backward",
              doc="the loss-gradient seed loss.backward() makes before the engine starts"),
    StageRule("forward.sync", "forward", 19, SYNC, RUNTIME, when="after_forward",
              doc="a device synchronize right after a forward phase waits for its work"),
    StageRule("backward.sync", "backward", 19, SYNC, RUNTIME, when="after_backward",
              doc="a device synchronize right after a backward phase waits for its work"),
    StageRule("optimizer.sync", "optimizer", 19, SYNC, RUNTIME, when="after_optimizer",
              doc="a device synchronize right after an optimizer phase waits for its work"),
    StageRule("other.sync_after_steps", "other", 19, SYNC, RUNTIME, when="after_last_step",
              doc="a device synchronize after the last step: it waits for the GPU work the steps queued (at the "
                  "end of training, or before the profiler stops)"),
    StageRule("optimizer.before_step", "optimizer", 17, None, None, when="between_backward_and_optimizer",
              doc="between backward and the optimizer step: gradient clipping, unscaling"),
    StageRule("load.before_first_forward", "load", 16, None, None, when="before_first_forward",
              doc="before the first forward, outside the first training step, when that time holds weight "
                  "initialisation, checkpoint or copy ops"),
    StageRule("other.data.batch_copy", "other", 15, r"^aten::(to|_to_copy|copy_)$", ("cpu_op",),
              when="before_forward", doc="copies just before a forward: the batch to the device"),
    StageRule("other.data.distribution", "other", 15, COLLECTIVE, HOST_SPANS, when="before_forward",
              doc="collectives just before a forward: input redistribution"),
    StageRule("load.phase", "load", 12, None, None, when="load_phase", doc="inside the loading phase"),
    StageRule("forward.phase", "forward", 12, None, None, when="forward_phase",
              doc="inside a forward phase (collectives included)"),
    StageRule("backward.phase", "backward", 12, None, None, when="backward_phase",
              doc="inside a backward phase (collectives included)"),
    StageRule("optimizer.phase", "optimizer", 12, None, None, when="optimizer_phase",
              doc="inside an optimizer phase (collectives included)"),
    StageRule("other.communication", "other", 10, COLLECTIVE, HOST_SPANS, doc="collectives outside every phase"),
    StageRule("forward.inference", "forward", 7, None, None, when="no_training",
              doc="forward evidence but no backward and no optimizer in the whole trace: the main thread runs "
                  "inference"),
    StageRule("other.step", "other", 6, None, None, when="in_step",
              doc="the rest of a step on the main thread (outside every phase); with no steps, of the main thread"),
)
# fmt: on

UNCLASSIFIED = "other.unclassified"
GPU_UNLINKED = "other.gpu_unlinked"
NOT_ACTIVITY = "other.not_activity"
# a collective kernel (NCCL, RCCL, MSCCL) with no launching runtime call takes the stage and step of the c10d op
# (COLLECTIVE host spans) it matches: by Seq and process group, else External id, else order within its process
# group and stream (stages/collective_match.py)
COLLECTIVE_MATCH = "gpu.collective_match"
COLLECTIVE_KERNEL = re.compile(r"(?i)nccl|rccl|msccl")  # what counts as a collective kernel, everywhere
#: the NCCL and RCCL kernels whose name names the collective (group 1): ``ncclKernel_AllReduce_RING_LL_Sum_float``,
#: ``ncclDevKernel_SendRecv``; a subset of :data:`COLLECTIVE_KERNEL`
NAMED_COLLECTIVE_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
# a collective kernel launched before the trace began (no launch, no c10d op in the file): the stage at its position
# in the stream's collective sequence of the later steps, else of the GPU work beside it on other streams
# (stages/collective_order.py)
COLLECTIVE_ORDER = "gpu.collective_order"
COLLECTIVE_NEIGHBOURS = "gpu.collective_neighbours"


@dataclass(frozen=True)
class GpuRule:
    """A rule that stages GPU activity from device-side evidence rather than host nesting: its name (stored in
    ``stage_rule``) and what it means (docs/stages.md explains each)."""

    name: str
    doc: str


# CUDA / HIP graphs: one runtime call replays every kernel of the graph, all under its one correlation id
GRAPH_LAUNCH = r"^(cuda|hip|cu)GraphLaunch"
GRAPH_CAPTURE_BEGIN = r"^(cuda|hip|cu)StreamBeginCapture"
GRAPH_CAPTURE_END = r"^(cuda|hip|cu)StreamEndCapture"
# runtime calls that a capture records as graph nodes (kernel launches, copies, sets); a graph launch is not one
GRAPH_NODE_CALL = r"(?i)launch\w*kernel|memcpy|memset"
GRAPH_RULES: tuple[GpuRule, ...] = (
    GpuRule(
        "gpu.graph_capture",
        "a kernel replayed by a graph launch takes the stage of the launch at its position in the graph's capture "
        "(a StreamBeginCapture..EndCapture window holding as many launches without GPU activity)",
    ),
    GpuRule(
        "gpu.graph_sequence",
        "a graph-replayed kernel whose run of names on its device repeats among eagerly launched kernels takes the "
        "stage of the kernel it aligns with (gpu.sequence_match's matching)",
    ),
    GpuRule(
        "gpu.graph_launch",
        "a graph-replayed kernel with no capture and no eager match: the stage of the graph launch call",
    ),
    GpuRule(
        "gpu.graph_launch_op",
        "a graph-replayed kernel without a capture whose launch call lies in an op with positive stage evidence "
        "(CompiledFunction / CompiledFunctionBackward, an autograd engine node, Optimizer.step, a user's mark) and "
        "whose graph does not span stages: that op's stage",
    ),
)
# a graph spans stages when windows of at least this many runs of its names align with eager activity of two or
# more stages (GRAPH_SPAN_SHARE of its so aligned activities each, and at least 2): a whole step captured as one graph
GRAPH_SPAN_WINDOW = 8
GRAPH_SPAN_SHARE = 0.1


def rules_table(include_marks: bool = True) -> list[StageRule]:
    """The active rules, highest priority first; ``include_marks=False`` drops the mark-based rules."""
    rules = [r for r in RULES if include_marks or r.source not in ("mark", "user_mark")]
    return sorted(rules, key=lambda r: -r.priority)


def rules_markdown() -> str:
    """The rule table as Markdown (docs/stages.md embeds it; a test keeps the two in sync)."""
    lines = [
        "| priority | rule | stage | kinds | name pattern | condition | what it is |",
        "|---:|---|---|---|---|---|---|",
    ]
    for r in rules_table():
        kinds = ", ".join(r.kinds) if r.kinds else "any"
        pattern = f"`{r.pattern}`".replace("|", "\\|") if r.pattern else "-"
        lines.append(f"| {r.priority} | `{r.name}` | {r.stage} | {kinds} | {pattern} | {r.when} | {r.doc} |")
    return "\n".join(lines) + "\n"
