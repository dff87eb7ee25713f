"""Apply the rule table: give every event a ``stage``, the ``stage_rule`` that decided it, and a ``step``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profparse.base.arrays import pack_codes
from profparse.base.marks import STAGES
from profparse.stages.collective_match import COLLECTIVE_RULE_NAMES, match_collectives
from profparse.stages.collective_order import ORDER_RULE_NAMES, order_collectives
from profparse.stages.gpu_inference import INFERENCE_RULES, infer_gpu_stages
from profparse.stages.graph_launch import GRAPH_RULE_NAMES, stage_graph_kernels
from profparse.stages.phases import PHASE_CONDITIONS, phase_conditions
from profparse.stages.rules import GPU_UNLINKED, NOT_ACTIVITY, UNCLASSIFIED, StageRule, rules_table
from profparse.trace.ancestors import depth_order
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, KIND_CODE, NULL, STEP_NAME
from profparse.trace.link import Links, first_row_of, kind_mask, name_mask

STAGE_CODE = {s: i for i, s in enumerate(STAGES)}
# Step numbers are kept exact wherever they go: int64 columns, JSON outputs and the report's JavaScript (a double).
MAX_STEP_NUMBER = (1 << 53) - 1
_MAX_STEP_DIGITS = len(str(MAX_STEP_NUMBER))  # longer digit strings are never parsed (int() of 5,000 digits raises)
_NOTED_STEPS = 5  # renumbered or dropped steps named in a note; the rest are counted
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
_DEPTH_BITS = 12
_RULE_BITS = 12
_RULE_LAST = (1 << _RULE_BITS) - 1  # rule indexes are stored as _RULE_LAST - index (see _own_keys)


@dataclass
class Attribution:
    """Per-row results plus the context that produced them."""

    stage: np.ndarray  # int8 codes into profparse.base.marks.STAGES
    rule: np.ndarray  # int16 codes into rule_names
    rule_names: list[str]
    step: np.ndarray  # int64 step number, NULL outside any step
    main_thread: int  # dense host thread id (Links.thread), -1 if none
    steps: pd.DataFrame  # step, start_ns, end_ns, source
    rules: list[StageRule]
    step_notes: list[str] = field(default_factory=list)  # steps renumbered or dropped (quality warning)
    cut_notes: list[str] = field(default_factory=list)  # a last step the profiler stopped inside (quality info)
    warm_notes: list[str] = field(default_factory=list)  # the steady steps are warm-up (quality warning, findings)


def _main_thread(events: pd.DataFrame, links: Links, step_rows: np.ndarray, optimizer: np.ndarray) -> int:
    """The thread that drives training: holder of ProfilerStep, else of Optimizer.step (``optimizer``: the host
    rows named so), else the busiest. Where several threads hold them, the one with the most, then the earliest:
    not the first in the file, which a trace need not write in time order."""
    ts = events["ts_ns"].to_numpy()
    for rows in (step_rows, np.flatnonzero(optimizer)):
        if len(rows):
            thread = links.thread[rows].astype(np.int64)
            count = np.bincount(thread)[thread]
            best = np.lexsort((thread, ts[rows], -count))[0]  # most ranges, then earliest, then lowest thread
            return int(thread[best])
    ops = kind_mask(events, {"cpu_op"}) & links.host
    if not ops.any():
        return -1
    busy = np.bincount(links.thread[ops], weights=links.self_ns[ops])
    return int(np.argmax(busy))


def _step_number(name: str) -> int | None:
    """The N of ``ProfilerStep#N``, None when it is beyond :data:`MAX_STEP_NUMBER`."""
    digits = STEP_NAME.match(name).group(1)
    if len(digits) > _MAX_STEP_DIGITS:
        return None
    number = int(digits)
    return number if number <= MAX_STEP_NUMBER else None


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_NOTED_STEPS])
    return shown + (f" and {len(items) - _NOTED_STEPS} more" if len(items) > _NOTED_STEPS else "")


def _short(name: str) -> str:
    return name if len(name) <= 40 else f"{name[:30]}...({len(name)} characters)"


def _unique_steps(names: list[str], start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, list[int], list[str]]:
    """Keep apart the ``ProfilerStep#N`` ranges (in start order) that would share a step: returns the ranges kept
    (positions), their step numbers and notes for the user.

    A range with the same start and end as an earlier one is a duplicated event: dropped. A number seen before (a
    restarted counter) or beyond :data:`MAX_STEP_NUMBER` is renumbered, after the largest number kept (or into the
    lowest free numbers when that would pass the bound), so that every step window has its own number."""
    kept: list[int] = []
    dropped: list[str] = []
    seen_spans: set[tuple[int, int]] = set()
    for i in range(len(names)):
        span = (int(start[i]), int(end[i]))
        if span in seen_spans:
            dropped.append(f"#{_short(names[i].partition('#')[2])}")
            continue
        seen_spans.add(span)
        kept.append(i)
    numbers: list[int | None] = [_step_number(names[i]) for i in kept]
    used: set[int] = set()
    for position, number in enumerate(numbers):
        if number is not None and number in used:
            numbers[position] = None  # a repeat: renumbered below
        elif number is not None:
            used.add(number)
    repeats = [position for position, number in enumerate(numbers) if number is None]
    notes = []
    if dropped:
        events = "event" if len(dropped) == 1 else "events"
        notes.append(
            f"{len(dropped)} duplicated ProfilerStep {events} ignored (same start and end as an earlier step): "
            f"{_listed(dropped)}"
        )
    if repeats:
        fresh = _free_numbers(used, len(repeats))
        renamed = []
        for position, number in zip(repeats, fresh, strict=True):
            stated = names[kept[position]].partition("#")[2]
            why = "too large" if _step_number(names[kept[position]]) is None else "repeated"
            renamed.append(f"#{_short(stated)} -> {number} ({why})")
            numbers[position] = number
        ranges = "range" if len(repeats) == 1 else "ranges"
        notes.append(
            f"{len(repeats)} ProfilerStep {ranges} renumbered so that every step has its own number: {_listed(renamed)}"
        )
    return np.asarray(kept, dtype=np.int64), [int(n) for n in numbers], notes


def _free_numbers(used: set[int], count: int) -> list[int]:
    """``count`` step numbers not in ``used``: after the largest, else (near the bound) the lowest free ones."""
    top = max(used, default=-1)
    if top + count <= MAX_STEP_NUMBER:
        return list(range(top + 1, top + 1 + count))
    free = (n for n in range(MAX_STEP_NUMBER + 1) if n not in used)
    return [next(free) for _ in range(count)]


def find_steps(
    events: pd.DataFrame,
    links: Links,
    notes: list[str] | None = None,
    cut: list[str] | None = None,
    warm: list[str] | None = None,
) -> tuple[pd.DataFrame, int]:
    """Step windows from ``ProfilerStep#N`` ranges, else between successive optimizer steps; and the main thread.

    Every window gets its own step number (see :func:`_unique_steps`); what was renumbered or dropped is said in
    ``notes``. Column ``steady`` says which steps are past warm-up and complete (:func:`_steady`); a last step
    the profiler stopped inside is said in ``cut``, steady steps that are warm-up all the same in ``warm``."""
    optimizer = name_mask(events, _OPTIMIZER_STEP) & links.host
    steps, main = _step_windows(events, links, optimizer, notes)
    return steps.assign(steady=_steady(steps, events["ts_ns"].to_numpy()[optimizer], cut, warm)), main


#: with this many steps or more, and no optimizer step to tell, the first step is warm-up
WARM_UP_FROM = 3
#: a last step shorter than this share of the median step before it, without the optimizer step those hold (or
#: with none in the trace), is one the profiler stopped inside: kineto closes the open ``ProfilerStep`` range
#: when the profiler stops, and a loop that calls ``prof.step()`` after each iteration leaves one nearly empty
CUT_SHORT = 0.25


def _steady(
    steps: pd.DataFrame, optimizer_ts: np.ndarray, cut: list[str] | None = None, warm: list[str] | None = None
) -> np.ndarray:
    """Per step (in time order): past warm-up and complete. Warm-up runs up to the first step that holds an
    optimizer step (its first call makes the optimizer's state, the model's first steps grow the allocator), when
    a step is left after it; else it is the first step of :data:`WARM_UP_FROM` or more. A last step cut short
    (:data:`CUT_SHORT`) is not steady and counts for neither; its note goes to ``cut``. Where no complete step
    is left after the first optimizer step, the steps up to it stay steady (there are no others) and ``warm``
    says that they are warm-up."""
    steady = np.ones(len(steps), dtype=bool)
    window = step_window(optimizer_ts, steps)
    window = window[window >= 0]
    complete = len(steps)
    note = _cut_short(steps, window)
    if note:
        steady[-1] = False
        complete -= 1
        window = window[window < complete]
        if cut is not None:
            cut.append(note)
    if len(window) and window.min() < complete - 1:
        steady[: window.min() + 1] = False
        return steady
    if complete >= WARM_UP_FROM:
        steady[0] = False
    if len(window) and warm is not None:
        named = ", ".join(str(int(s)) for s in steps["step"].to_numpy()[steady])
        which = "step" if steady.sum() == 1 else "steps"
        warm.append(
            f"no complete step after the trace's first optimizer step: the steady {which} ({named}) may be "
            "warm-up (first calls load kernels, the optimizer makes its state, the allocator grows), so the times "
            "and findings may not hold for later steps; profile a few more steps (e.g. schedule(wait=1, warmup=1, "
            "active=3))"
        )
    return steady


def _cut_short(steps: pd.DataFrame, optimizer_window: np.ndarray) -> str:
    """Why the last of ``steps`` is one the profiler stopped inside (:data:`CUT_SHORT`), or ``""``."""
    if len(steps) < 2:
        return ""
    length = (steps["end_ns"] - steps["start_ns"]).to_numpy()
    typical = float(np.median(length[:-1]))
    last = len(steps) - 1
    if not length[-1] < CUT_SHORT * typical or last in optimizer_window:
        return ""
    return (
        f"step {int(steps['step'].iloc[-1])} left out of the steady steps: {length[-1] / 1e6:,.2f} ms with no "
        f"optimizer step, against a median of {typical / 1e6:,.2f} ms for the steps before it (the profiler stopped "
        "inside it)"
    )


def _step_windows(
    events: pd.DataFrame, links: Links, optimizer: np.ndarray, notes: list[str] | None
) -> tuple[pd.DataFrame, int]:
    """The windows and step numbers of :func:`find_steps`, and the main thread (``optimizer``: the host rows of
    optimizer steps)."""
    step_rows = np.flatnonzero(name_mask(events, STEP_NAME) & links.host)
    main = _main_thread(events, links, step_rows, optimizer)
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    if len(step_rows):
        step_rows = step_rows[links.thread[step_rows] == main]
        step_names = [str(n) for n in events["name"].iloc[step_rows].to_numpy()]
        # by start, then end, then name: ranges that start together are kept and numbered alike in any file order
        order = sorted(range(len(step_rows)), key=lambda i: (ts[step_rows[i]], end[step_rows[i]], step_names[i]))
        step_rows, step_names = step_rows[order], [step_names[i] for i in order]
        kept, numbers, step_notes = _unique_steps(step_names, ts[step_rows], end[step_rows])
        if notes is not None:
            notes.extend(step_notes)
        step_rows = step_rows[kept]
        steps = pd.DataFrame(
            {
                "step": np.asarray(numbers, dtype=np.int64),
                "start_ns": ts[step_rows],
                "end_ns": end[step_rows],
                "source": "ProfilerStep",
            }
        )
        return steps, main
    opt_rows = np.flatnonzero(optimizer & (links.thread == main))
    if len(opt_rows) == 0:
        return pd.DataFrame({"step": [], "start_ns": [], "end_ns": [], "source": []}).astype(
            {"step": np.int64, "start_ns": np.int64, "end_ns": np.int64}
        ), main
    opt_rows = opt_rows[np.argsort(ts[opt_rows], kind="stable")]
    # keep outermost optimizer ranges only (wrapping optimizers nest)
    outer = opt_rows[np.concatenate([[True], ts[opt_rows][1:] >= np.maximum.accumulate(end[opt_rows])[:-1]])]
    host_ts = ts[links.host]
    first = int(host_ts.min()) if len(host_ts) else 0
    ends = end[outer]
    starts = np.concatenate([[first], ends[:-1]])
    steps = pd.DataFrame(
        {"step": np.arange(len(outer)), "start_ns": starts, "end_ns": ends, "source": "optimizer_boundaries"}
    )
    return steps, main


def step_window(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Row of ``steps`` whose window holds each timestamp, ``-1`` outside every window."""
    out = np.full(len(ts), -1, dtype=np.int64)
    if steps.empty or len(ts) == 0:
        return out
    starts = steps["start_ns"].to_numpy()
    ends = steps["end_ns"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = idx >= 0
    ok[ok] &= ts[ok] < ends[idx[ok]]
    out[ok] = idx[ok]
    return out


def _step_of(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step number of the window containing each timestamp, ``NULL`` outside all windows."""
    window = step_window(ts, steps)
    out = np.full(len(ts), NULL, dtype=np.int64)
    inside = window >= 0
    out[inside] = steps["step"].to_numpy()[window[inside]]
    return out


_AUTOGRAD_THREAD_NAME = re.compile(r"pt_autograd")
_AUTOGRAD_NODE = re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$")


def _autograd_threads(events: pd.DataFrame, links: Links, thread_names: dict, main: int) -> np.ndarray:
    """Per host thread id (plus a trailing False for 'no thread'): is it an autograd engine thread?"""
    threads = links.threads
    named = [
        _AUTOGRAD_THREAD_NAME.search(thread_names.get((p, t), "")) is not None
        for p, t in zip(threads["pid"], threads["tid"], strict=True)
    ]
    flags = np.array(named + [False], dtype=bool)
    nodes = name_mask(events, _AUTOGRAD_NODE) & links.host & kind_mask(events, {"cpu_op"})
    runs_nodes = np.unique(links.thread[nodes])
    runs_nodes = runs_nodes[runs_nodes != main]
    flags[runs_nodes] = True
    return flags


def _starts_fwdbwd_flow(events: pd.DataFrame, links: Links) -> np.ndarray:
    """Rows whose event starts a ``fwdbwd`` flow: the flow start nests inside it, at its start time."""
    out = np.zeros(len(events), dtype=bool)
    flows = kind_mask(events, {"flow_start"}) & (events["category"] == "fwdbwd").to_numpy() & (links.parent >= 0)
    rows = np.flatnonzero(flows)
    if len(rows):
        parents = links.parent[rows]
        ts = events["ts_ns"].to_numpy()
        at_start = ts[rows] == ts[parents]
        out[parents[at_start]] = True
    return out


def _forward_linked(events: pd.DataFrame, links: Links, autograd: np.ndarray) -> np.ndarray:
    """Ops that recorded autograd history: they start a ``fwdbwd`` flow; in traces without such flows (2021 and
    older), ops off the autograd threads whose ``Sequence number`` a backward node of the same process carries."""
    out = _starts_fwdbwd_flow(events, links)
    if out.any() or (events["category"] == "fwdbwd").any():
        return out
    seq = events["sequence_number"].to_numpy()
    ops = links.host & kind_mask(events, {"cpu_op"}) & (seq != NULL)
    is_node = name_mask(events, _AUTOGRAD_NODE)
    nodes = ops & is_node
    if not nodes.any():
        return out
    rows = np.flatnonzero(ops)
    key, _ = pack_codes(events["pid"].to_numpy()[rows], seq[rows])  # sequence numbers count per process
    candidates = (~is_node & ~autograd[links.thread])[rows]
    out[rows[candidates]] = np.isin(key[candidates], np.unique(key[nodes[rows]]))
    return out


class _RowsOfNames:
    """Rows by name code (one stable sort), so that a rule whose pattern matches a few names looks at their rows
    only instead of every row: with ~40 rules, per-row gathers were most of the time the masks took."""

    def __init__(self, name_codes: np.ndarray, names: int) -> None:
        self.order = np.argsort(name_codes, kind="stable")
        self.bounds = np.searchsorted(name_codes[self.order], np.arange(names + 1))

    def rows(self, codes: np.ndarray) -> np.ndarray:
        return np.concatenate([self.order[self.bounds[c] : self.bounds[c + 1]] for c in codes.tolist()])

    def count(self, codes: np.ndarray) -> int:
        return int((self.bounds[codes + 1] - self.bounds[codes]).sum())


def _rule_mask(
    rule: StageRule,
    events: pd.DataFrame,
    links: Links,
    thread_names: dict,
    context: dict,
) -> np.ndarray:
    """The rows the rule matches. With a name pattern whose names cover few rows (the usual case), the other
    conditions are tested on those rows only."""
    n = len(links.host)
    rows = None  # candidate rows; None: every row
    if rule.pattern is not None:
        search = re.compile(rule.pattern).search
        names = context["names"]
        name_ok = np.fromiter((search(name) is not None for name in names), dtype=bool, count=len(names))
        codes = np.flatnonzero(name_ok)
        if not codes.size:
            return np.zeros(n, dtype=bool)
        by_name = context["rows_of_names"]
        if by_name.count(codes) <= n // 8:
            rows = by_name.rows(codes)

    def take(values: np.ndarray) -> np.ndarray:
        return values if rows is None else values[rows]

    mask = take(links.host).copy()
    if rule.kinds is not None:
        wanted = np.zeros(len(KIND_CODE), dtype=bool)
        wanted[[KIND_CODE[k] for k in rule.kinds]] = True
        mask &= wanted[take(context["kind_codes"])]
    if rule.pattern is not None and rows is None:
        mask &= name_ok[context["name_codes"]]
    if rule.thread is not None:
        threads = links.threads
        labels = [thread_names.get((p, t), "") for p, t in zip(threads["pid"], threads["tid"], strict=True)]
        ok = np.array([re.search(rule.thread, label) is not None for label in labels] + [False], dtype=bool)
        mask &= ok[take(links.thread)]  # thread -1 (not host) indexes the trailing False
    for condition in rule.when.split(","):
        if condition in ("before_first_step", "after_last_step"):
            mask &= take(context[condition])
        elif condition == "main_thread":
            mask &= take(links.thread) == context["main_thread"]
        elif condition == "autograd_thread":
            mask &= context["autograd_thread"][take(links.thread)]
        elif condition == "not_autograd_thread":
            mask &= ~context["autograd_thread"][take(links.thread)]
        elif condition == "forward_linked":
            mask &= take(context["forward_linked"])
        elif condition in PHASE_CONDITIONS:
            mask &= take(context[condition])
        elif condition != "always":
            raise ValueError(f"rule {rule.name}: unknown condition {condition!r}")
    if rows is None:
        return mask
    out = np.zeros(n, dtype=bool)
    out[rows[mask]] = True
    return out


def _needs_phases(rule: StageRule) -> bool:
    return any(c in PHASE_CONDITIONS for c in rule.when.split(","))


def _own_keys(masks: dict[int, np.ndarray], rules: list[StageRule], depth: np.ndarray, own: np.ndarray) -> None:
    """Put into ``own`` (in place, 0 where none) each row's best matching rule of ``masks`` as a key that orders
    rules by priority, then depth (innermost), then table order (the first rule wins a tie: its index is stored
    reversed). Taking the maximum lets the second pass add the phase rules to the first pass's keys instead of
    matching all ~40 rules again."""
    depth_term = depth.astype(np.int64).clip(0, (1 << _DEPTH_BITS) - 1) << _RULE_BITS
    for index, mask in masks.items():
        rows = np.flatnonzero(mask)
        key = ((rules[index].priority + 1) << (_DEPTH_BITS + _RULE_BITS)) + (_RULE_LAST - index)
        own[rows] = np.maximum(own[rows], depth_term[rows] + key)


def _decide(own: np.ndarray, links: Links) -> np.ndarray:
    """Per row the index of the deciding rule (highest priority over the row and its ancestors, on equal
    priority the innermost), -1 where none matched; ``own``: the rows' own keys (:func:`_own_keys`)."""
    best = own.copy()
    parent = links.parent
    if len(best):
        by_depth, bounds = depth_order(links.depth)
        for d in range(1, int(links.depth.max()) + 1):
            rows = by_depth[bounds[d] : bounds[d + 1]]
            p = parent[rows]
            ok = p >= 0
            rows, p = rows[ok], p[ok]
            best[rows] = np.maximum(best[rows], best[p])
    return np.where(best > 0, _RULE_LAST - (best & _RULE_LAST), -1)  # the low bits: the reversed index


def _rule_context(
    events: pd.DataFrame,
    links: Links,
    thread_names: dict[tuple[int, int], str],
    main: int,
    steps: pd.DataFrame | None,
) -> dict[str, Any]:
    """What the first pass's conditions read, decoded once for the ~40 rules: the category names as str, the
    per-row name and kind codes, the threads, and the rows before the first / after the last ``ProfilerStep``
    (``steps``: None without them)."""
    n, ts = len(events), events["ts_ns"].to_numpy()
    autograd = _autograd_threads(events, links, thread_names, main)
    none = np.zeros(n, dtype=bool)
    return {
        "names": [str(name) for name in events["name"].cat.categories.tolist()],
        "name_codes": events["name"].cat.codes.to_numpy(),
        "kind_codes": events["kind"].cat.codes.to_numpy(),
        "rows_of_names": _RowsOfNames(events["name"].cat.codes.to_numpy(), len(events["name"].cat.categories)),
        "autograd_thread": autograd,
        "forward_linked": _forward_linked(events, links, autograd),
        "before_first_step": none if steps is None else ts < steps["start_ns"].min(),
        "after_last_step": none if steps is None else ts >= steps["end_ns"].max(),
        "main_thread": main,
    }


def attribute(
    events: pd.DataFrame,
    links: Links,
    thread_names: dict[tuple[int, int], str],
    *,
    include_marks: bool = True,
) -> Attribution:
    """Give every row a stage, the deciding rule and a step.

    Two passes: the rules that need no phases decide first; their stages place the step phases
    (:mod:`profparse.stages.phases`); then all rules decide, the phase rules included."""
    n = len(events)
    rules = rules_table(include_marks)
    # decided after the host rules, from GPU-side evidence
    gpu_rules = [*INFERENCE_RULES, *GRAPH_RULE_NAMES, *COLLECTIVE_RULE_NAMES, *ORDER_RULE_NAMES]
    rule_names = [r.name for r in rules] + [UNCLASSIFIED, GPU_UNLINKED, NOT_ACTIVITY, *gpu_rules]
    step_notes: list[str] = []
    cut_notes: list[str] = []
    warm_notes: list[str] = []
    steps, main = find_steps(events, links, step_notes, cut_notes, warm_notes)
    ts = events["ts_ns"].to_numpy()
    real_steps = not steps.empty and bool((steps["source"] == "ProfilerStep").all())
    context = _rule_context(events, links, thread_names, main, steps if real_steps else None)
    stage_of_rule = np.array([STAGE_CODE[r.stage] for r in rules] + [STAGE_CODE["other"]] * 3, dtype=np.int8)

    own = np.zeros(n, dtype=np.int64)
    masks = {
        i: _rule_mask(r, events, links, thread_names, context) for i, r in enumerate(rules) if not _needs_phases(r)
    }
    _own_keys(masks, rules, links.depth, own)
    del masks
    first = _decide(own, links)
    evidence_stage = np.where(first >= 0, stage_of_rule[first.clip(0)], -1)
    context.update(phase_conditions(events, links, evidence_stage, STAGES, main, steps, real_steps))
    masks = {i: _rule_mask(r, events, links, thread_names, context) for i, r in enumerate(rules) if _needs_phases(r)}
    _own_keys(masks, rules, links.depth, own)
    decided = _decide(own, links)

    rule = np.full(n, rule_names.index(NOT_ACTIVITY), dtype=np.int16)
    matched = decided >= 0
    rule[matched] = decided[matched].astype(np.int16)
    rule[links.host & ~matched] = rule_names.index(UNCLASSIFIED)

    activity = kind_mask(events, GPU_ACTIVITY_KINDS)
    launched = activity & (links.launch >= 0)
    rule[launched] = rule[links.launch[launched]]
    rule[activity & ~launched] = rule_names.index(GPU_UNLINKED)
    _inherit_gpu_side(events, links, rule)

    stage = stage_of_rule[rule]
    step = _step_of(ts, steps)
    step[launched] = step[links.launch[launched]]
    evidence = frozenset(r.name for r in rules if r.stage != "other" and not _needs_phases(r))
    stage_graph_kernels(events, links, rule_names, rule, stage, evidence)  # kernels replayed by a CUDA/HIP graph
    match_collectives(events, links, rule_names, rule, stage, step)  # unlinked NCCL/RCCL kernels: their c10d op
    order_collectives(events, links, rule_names, rule, stage, step, steps)  # the rest: their place in the sequence
    infer_gpu_stages(events, links, steps, rule_names, rule, stage, step)  # unlinked GPU activity, by inference
    return Attribution(
        stage=stage,
        rule=rule,
        rule_names=rule_names,
        step=step,
        main_thread=main,
        steps=steps,
        rules=rules,
        step_notes=step_notes,
        cut_notes=cut_notes,
        warm_notes=warm_notes,
    )


def _inherit_gpu_side(events: pd.DataFrame, links: Links, rule: np.ndarray) -> None:
    """GPU-track flow ends take their runtime call's rule; GPU annotations take their host range's rule."""
    corr = events["correlation"].to_numpy()
    flow_id = events["flow_id"].to_numpy()
    runtime_rows = np.flatnonzero(links.host & (corr != NULL) & kind_mask(events, {"cuda_runtime", "cuda_driver"}))
    gpu_flow = ~links.host & kind_mask(events, {"flow_start", "flow_end"}) & (flow_id != NULL)
    if runtime_rows.size and gpu_flow.any():
        rows = np.flatnonzero(gpu_flow)
        hit = first_row_of(corr[runtime_rows], runtime_rows, flow_id[rows])
        ok = hit >= 0
        rule[rows[ok]] = rule[hit[ok]]
    ext = events["external_id"].to_numpy()
    annotations = kind_mask(events, {"gpu_user_annotation"}) & (ext != NULL)
    host_ranges = np.flatnonzero(links.host & kind_mask(events, {"user_annotation"}) & (ext != NULL))
    if annotations.any() and host_ranges.size:
        rows = np.flatnonzero(annotations)
        hit = first_row_of(ext[host_ranges], host_ranges, ext[rows])
        ok = hit >= 0
        rule[rows[ok]] = rule[hit[ok]]


__all__ = ["Attribution", "attribute", "find_steps", "KIND_CODE"]
