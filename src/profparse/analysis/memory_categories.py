"""What each allocation holds (parameter, gradient, optimizer state, activation, temporary, input), from the trace.

torch labels tensors only inside a live profiler (``torch.profiler._memory_profiler``, which needs the Python
tracer). The JSON trace keeps enough to label every ``[memory]`` allocation without it: the ops around the
allocation (``AccumulateGrad``, ``Optimizer.step``), its stage and step, and its lifetime, found by pairing it with
the next free of the same address on the same device (stage and step of the free; whether the free falls inside
the allocating op or optimizer step). Each allocation takes the category of the first rule of
:data:`MEMORY_RULES` whose features all hold (and whose excluded features do not); ``rule`` says which one.
Python stacks are not needed: the features come from ops and record-function ranges only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.analysis.memory import counted_bytes
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.rows import stage_categorical
from profparse.trace.ancestors import innermost_ancestor_of_kind, outermost_ancestor_of_kind
from profparse.trace.kinds import NULL
from profparse.trace.link import Links, kind_mask

CATEGORIES: tuple[str, ...] = (
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "temporary",
    "input",
    "before_trace",  # allocated before the trace began: the device's Total Allocated before its first event
    "other",
)
CATEGORY_COLUMNS = (
    "trace_index",
    "ts_ns",
    "free_ts_ns",
    "device",
    "bytes",
    "category",
    "rule",
    "alloc_stage",
    "alloc_step",
    "free_stage",
    "free_step",
    "op_name",
)


@dataclass(frozen=True)
class MemoryRule:
    """One way to recognise a category: every feature in ``requires`` holds and none in ``excludes``."""

    name: str
    category: str
    requires: tuple[str, ...]
    excludes: tuple[str, ...]
    doc: str


# First match wins. Feature names are those of allocation_features().
MEMORY_RULES: tuple[MemoryRule, ...] = (
    MemoryRule(
        "allocator.reserve",
        "other",
        ("reserve_only",),
        (),
        "moved Total Reserved but not Total Allocated: a pool the allocator reserved, not a tensor",
    ),
    MemoryRule(
        "no_address",
        "other",
        ("no_address",),
        (),
        "the event has no Addr (legacy traces): no free to pair with, so no lifetime to judge",
    ),
    MemoryRule(
        "grad.accumulate",
        "gradient",
        ("in_accumulate_grad",),
        ("freed_in_op",),
        "made by AccumulateGrad and alive after it: the .grad it stores",
    ),
    MemoryRule(
        "optimizer.temporary",
        "temporary",
        ("in_optimizer_step", "freed_in_optimizer_step"),
        (),
        "made and freed inside one Optimizer.step (AdamW's denominators, foreach scratch)",
    ),
    MemoryRule(
        "optimizer.state",
        "optimizer_state",
        ("in_optimizer_step",),
        (),
        "made by Optimizer.step and alive after it (exp_avg, exp_avg_sq, momentum buffers, step counts)",
    ),
    MemoryRule(
        "op.temporary", "temporary", ("freed_in_op",), (), "freed before the outermost op around its allocation ends"
    ),
    MemoryRule(
        "backward.gradient",
        "gradient",
        ("alloc_backward",),
        ("freed_in_backward",),
        "made in backward and alive after it: a gradient AccumulateGrad kept without a copy",
    ),
    MemoryRule(
        "backward.temporary",
        "temporary",
        ("alloc_backward",),
        (),
        "made and freed in the same backward: gradients flowing between autograd nodes",
    ),
    MemoryRule(
        "forward.activation",
        "activation",
        ("alloc_forward", "freed_in_backward"),
        (),
        "made in forward, freed in the backward of the same step: saved for backward",
    ),
    MemoryRule(
        "forward.intermediate",
        "activation",
        ("alloc_forward", "freed_in_forward"),
        (),
        "made and freed in the same forward, outside the op that made it: an intermediate activation",
    ),
    MemoryRule(
        "forward.output",
        "activation",
        ("alloc_forward",),
        (),
        "made in forward and alive past its backward (outputs, the loss)",
    ),
    MemoryRule(
        "load.parameter",
        "parameter",
        ("before_first_forward", "alive_at_end"),
        (),
        "made before the first forward and alive past the last step: the model's weights",
    ),
    MemoryRule(
        "step.input",
        "input",
        ("alive_into_forward",),
        (),
        "made outside forward, backward and optimizer and alive when a forward starts: the batch",
    ),
    MemoryRule(
        "stage.temporary", "temporary", ("freed_in_alloc_stage",), (), "made and freed in the same stage and step"
    ),
    MemoryRule("unknown", "other", (), (), "no rule above holds"),
)


_ACCUMULATE_GRAD = re.compile(r"AccumulateGrad")
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
# ops with a schema (aten::mm, c10d::allreduce_) and autograd nodes (MmBackward0): torch's memory profiler calls a
# tensor made and freed inside the outermost of these a temporary; user ranges and ProfilerStep#N are not ops here
_SCHEMA_OP = re.compile(r"^\w+(?:::\w+)+$|^\w+Backward\d*$")
_FORWARD, _BACKWARD, _OPTIMIZER = (STAGES.index(s) for s in ("forward", "backward", "optimizer"))


def _name_rows(events: pd.DataFrame, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean per event: its name matches ``pattern``."""
    names = events["name"].cat.categories
    hit = np.fromiter((pattern.search(str(n)) is not None for n in names), dtype=bool, count=len(names))
    codes = events["name"].cat.codes.to_numpy()
    return np.where(codes >= 0, hit[np.maximum(codes, 0)], False)


def pair_frees(timeline: pd.DataFrame, addresses: np.ndarray) -> np.ndarray:
    """For each row of the memory timeline: the row of the free that ends it (allocations only), else -1.

    The free of an allocation is the next event on the same device and address when that event frees as many
    bytes. Events without an address (legacy traces) pair with nothing.
    """
    n = len(timeline)
    device = timeline["device"].cat.codes.to_numpy()
    order = np.lexsort((timeline["trace_index"].to_numpy(), timeline["ts_ns"].to_numpy(), addresses, device))
    nbytes = timeline["bytes"].to_numpy()
    nxt = np.full(n, -1, dtype=np.int64)
    same = (device[order[1:]] == device[order[:-1]]) & (addresses[order[1:]] == addresses[order[:-1]])
    pairs = same & (nbytes[order[:-1]] > 0) & (nbytes[order[1:]] == -nbytes[order[:-1]])
    pairs &= addresses[order[:-1]] != NULL  # legacy traces without Addr: no lifetimes
    nxt[order[:-1][pairs]] = order[1:][pairs]
    return nxt


def allocation_features(
    events: pd.DataFrame, links: Links, attribution: Attribution, timeline: pd.DataFrame
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Boolean features per allocation (rows of ``timeline`` with bytes > 0), those rows, and their frees."""
    row_of = pd.Index(events["trace_index"].to_numpy()).get_indexer(timeline["trace_index"].to_numpy())
    addresses = events["mem_addr"].to_numpy()[row_of] if "mem_addr" in events else np.full(len(row_of), NULL)
    free_of = pair_frees(timeline, addresses)
    alloc = np.flatnonzero(timeline["bytes"].to_numpy() > 0)
    free = free_of[alloc]
    has_free = free >= 0
    a_row, f_row = row_of[alloc], np.where(has_free, row_of[np.maximum(free, 0)], -1)
    stage, step = attribution.stage, attribution.step
    a_stage, a_step = stage[a_row], step[a_row]
    f_stage = np.where(has_free, stage[np.maximum(f_row, 0)], -1)
    f_step = np.where(has_free, step[np.maximum(f_row, 0)], NULL)
    ts = timeline["ts_ns"].to_numpy()
    a_ts, f_ts = ts[alloc], np.where(has_free, ts[np.maximum(free, 0)], np.iinfo(np.int64).max)
    ends = events["ts_ns"].to_numpy() + np.maximum(events["dur_ns"].to_numpy(), 0)
    op = outermost_ancestor_of_kind(
        links.parent, links.depth, kind_mask(events, {"cpu_op"}) & _name_rows(events, _SCHEMA_OP)
    )[a_row]
    op_end = np.where(op >= 0, ends[np.maximum(op, 0)], np.iinfo(np.int64).min)
    opt = innermost_ancestor_of_kind(links.parent, links.depth, _name_rows(events, _OPTIMIZER_STEP))
    acc = innermost_ancestor_of_kind(links.parent, links.depth, _name_rows(events, _ACCUMULATE_GRAD))
    a_opt = opt[a_row]
    f_opt = np.where(has_free, opt[np.maximum(f_row, 0)], -1)
    # timsort ("stable"): the events come nearly in time order, where quicksort took 30x longer
    forward_starts = np.sort(events["ts_ns"].to_numpy()[(stage == _FORWARD) & links.host], kind="stable")
    first_forward = forward_starts[0] if len(forward_starts) else np.iinfo(np.int64).max
    same_step = f_step == a_step
    features = {
        "reserve_only": counted_bytes(timeline)[alloc] == 0,
        "no_address": addresses[alloc] == NULL,
        "in_accumulate_grad": acc[a_row] >= 0,
        "in_optimizer_step": a_opt >= 0,
        "freed_in_optimizer_step": has_free & (a_opt >= 0) & (f_opt == a_opt),
        "freed_in_op": has_free & (op >= 0) & (f_ts <= op_end),
        "alloc_forward": a_stage == _FORWARD,
        "alloc_backward": a_stage == _BACKWARD,
        "freed_in_backward": has_free & same_step & (f_stage == _BACKWARD),
        "freed_in_forward": has_free & same_step & (f_stage == _FORWARD),
        "before_first_forward": a_ts < first_forward,
        "alive_at_end": f_ts >= _last_step_end(attribution),
        "alive_into_forward": _next_start(forward_starts, a_ts) < f_ts,
        "freed_in_alloc_stage": has_free & same_step & (f_stage == a_stage),
    }
    return features, alloc, free


def _last_step_end(attribution: Attribution) -> int:
    """The end of the last step (frees after it are the program ending); int64 max without steps."""
    ends = attribution.steps["end_ns"].to_numpy() if len(attribution.steps) else np.zeros(0, np.int64)
    return int(ends.max()) if len(ends) else int(np.iinfo(np.int64).max)


def _next_start(starts: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The first of the sorted ``starts`` at or after each ``ts`` (int64 max where none)."""
    padded = np.append(starts, np.iinfo(np.int64).max)
    return padded[np.searchsorted(starts, ts)]


def apply_memory_rules(features: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The index into :data:`MEMORY_RULES` of the first rule that holds for each allocation."""
    decided = np.full(n, -1, dtype=np.int16)
    for index, rule in enumerate(MEMORY_RULES):
        holds = np.ones(n, dtype=bool)
        for name in rule.requires:
            holds &= features[name]
        for name in rule.excludes:
            holds &= ~features[name]
        decided[(decided < 0) & holds] = index
    return decided


def memory_categories(
    events: pd.DataFrame, links: Links, attribution: Attribution, memory: pd.DataFrame
) -> pd.DataFrame:
    """One row per allocation: its category, the rule that decided it, where it was made and freed."""
    features, alloc, free = allocation_features(events, links, attribution, memory)
    decided = apply_memory_rules(features, len(alloc))
    rule_names = [rule.name for rule in MEMORY_RULES]
    category_of_rule = np.array([CATEGORIES.index(rule.category) for rule in MEMORY_RULES], dtype=np.int8)
    has_free = free >= 0
    free_at = np.maximum(free, 0)
    column = {c: memory[c].to_numpy() for c in ("trace_index", "ts_ns", "bytes", "step")}
    free_stage = np.where(has_free, memory["stage"].cat.codes.to_numpy()[free_at], -1)
    return pd.DataFrame(
        {
            "trace_index": column["trace_index"][alloc],
            "ts_ns": column["ts_ns"][alloc],
            "free_ts_ns": np.where(has_free, column["ts_ns"][free_at], NULL),
            "device": memory["device"].array.take(alloc),
            "bytes": column["bytes"][alloc],
            "category": pd.Categorical.from_codes(category_of_rule[decided], categories=list(CATEGORIES)),
            "rule": pd.Categorical.from_codes(decided, categories=rule_names),
            "alloc_stage": memory["stage"].array.take(alloc),
            "alloc_step": column["step"][alloc],
            "free_stage": stage_categorical(free_stage),
            "free_step": np.where(has_free, column["step"][free_at], NULL),
            # categoricals as the table's other text columns (the op names' over every event name: only those used)
            "op_name": memory["op_name"].array.take(alloc).remove_unused_categories(),
        }
    )


PEAK_COLUMNS = ("step", "stage", "device", "category", "live_bytes", "peak_allocated_bytes", "peak_ts_ns")


def live_by_category(events: pd.DataFrame, memory: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Bytes live per category after each event of the memory timeline (rows of ``memory``; one column per
    :data:`CATEGORIES`).

    An allocation adds its bytes to its category and its free takes them back. What was already allocated when
    the trace began (a device's Total Allocated before its first event: the parameters of a model loaded before
    profiling) is ``before_trace``, and frees of memory allocated before the trace (a free with no allocation of
    its address in the trace) take from it. Bytes are those that moved Total Allocated
    (:func:`~profparse.analysis.memory.counted_bytes`), so the columns add up to it.
    """
    n = len(memory)
    other, before_trace = CATEGORIES.index("other"), CATEGORIES.index("before_trace")
    code = np.full(n, other, dtype=np.int64)
    if n == 0:
        return np.zeros((0, len(CATEGORIES)), dtype=np.int64)
    row_of = pd.Index(events["trace_index"].to_numpy()).get_indexer(memory["trace_index"].to_numpy())
    addresses = events["mem_addr"].to_numpy()[row_of]
    free_of = pair_frees(memory, addresses)
    position = pd.Index(memory["trace_index"].to_numpy()).get_indexer(table["trace_index"].to_numpy())
    category = table["category"].cat.codes.to_numpy().astype(np.int64)
    code[position] = category
    freed = free_of[position]
    code[freed[freed >= 0]] = category[freed >= 0]
    counted = counted_bytes(memory)
    paired = np.zeros(n, dtype=bool)
    paired[position] = True
    paired[freed[freed >= 0]] = True
    # a free whose allocation came before the trace; one without an address (legacy traces) is no such evidence:
    # its allocation is ``other`` (rule no_address), and so is the free, or each step's frees would pile up below
    # zero in before_trace and its allocations above the peak in other
    code[(counted < 0) & ~paired & (addresses != NULL)] = before_trace
    delta = np.zeros((n, len(CATEGORIES)), dtype=np.int64)
    delta[np.arange(n), code] = counted
    device = memory["device"].cat.codes.to_numpy()
    first = np.flatnonzero(np.r_[True, device[1:] != device[:-1]])  # rows are in time order within each device
    delta[first, before_trace] += memory["allocated_bytes"].to_numpy()[first] - counted[first]
    live = np.cumsum(delta, axis=0)
    start_of_row = np.repeat(first, np.diff(np.r_[first, n]))
    before = np.where(start_of_row[:, None] > 0, live[np.maximum(start_of_row - 1, 0)], 0)
    return live - before


def memory_peak_categories(events: pd.DataFrame, memory: pd.DataFrame, memory_categories: pd.DataFrame) -> pd.DataFrame:
    """Per (step, stage, device): the bytes live in each category at the group's highest Total Allocated."""
    if memory.empty:
        return pd.DataFrame({c: np.array([], np.int64) for c in PEAK_COLUMNS}).assign(
            stage=stage_categorical(np.array([], np.int8)),
            device=pd.Categorical([]),
            category=pd.Categorical([], categories=list(CATEGORIES)),
        )
    live = live_by_category(events, memory, memory_categories)
    keys = pd.DataFrame(
        {
            "step": memory["step"].to_numpy(),
            "stage": memory["stage"].cat.codes.to_numpy(),
            "device": memory["device"].cat.codes.to_numpy(),
            "allocated": memory["allocated_bytes"].to_numpy(),
        }
    )
    peaks = keys.groupby(["step", "stage", "device"], sort=True)["allocated"].idxmax().to_numpy()
    groups, width = len(peaks), len(CATEGORIES)
    return pd.DataFrame(
        {
            "step": np.repeat(keys["step"].to_numpy()[peaks], width),
            "stage": stage_categorical(np.repeat(keys["stage"].to_numpy()[peaks], width)),
            "device": pd.Categorical.from_codes(
                np.repeat(keys["device"].to_numpy()[peaks], width), dtype=memory["device"].dtype
            ),
            "category": pd.Categorical.from_codes(np.tile(np.arange(width), groups), categories=list(CATEGORIES)),
            "live_bytes": live[peaks].reshape(-1),
            "peak_allocated_bytes": np.repeat(keys["allocated"].to_numpy()[peaks], width),
            "peak_ts_ns": np.repeat(memory["ts_ns"].to_numpy()[peaks], width),
        }
    )
