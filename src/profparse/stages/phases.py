"""The step phase model: where load, forward, backward and optimizer run on the main thread, from evidence.

The rules that need no phases (marks, module calls, autograd-recording ops, the autograd engine, ``Optimizer.*``
ranges, loading frames, ...) decide first. Their decisions are the evidence: the outermost host spans they gave
``load``/``forward``/``optimizer`` on the main thread, and ``backward`` on any thread (the autograd engine runs
on its own threads while the main thread waits). Inside each window (a step, or the time before, between and
after steps) the evidence, in time order, forms *runs* of one stage: forward F, backward B, optimizer O. A run
is a phase, from its first evidence's start to its last evidence's end. Gradient accumulation gives F B F B O,
``zero_grad`` first gives O F B O.

Main-thread events that start inside a run are in that phase; the others lie in a *gap* between two runs (or a
run and the window's edge), and the gap's neighbours say what it is: before a forward run (batch preparation),
between forward and backward (the loss-gradient seed), between backward and optimizer (gradient clipping,
unscaling), before the trace's first forward (loading). :func:`phase_conditions` turns this into the boolean
row masks that rules name in their ``when``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profparse.base.arrays import grouped
from profparse.trace.link import Links, kind_mask

SPANS = ("cpu_op", "user_annotation", "python_function")
RUN_STAGES = ("load", "forward", "backward", "optimizer")
PHASE_CONDITIONS = (
    "load_phase",
    "forward_phase",
    "backward_phase",
    "optimizer_phase",
    "before_forward",
    "between_forward_and_backward",
    "between_backward_and_optimizer",
    "after_forward",
    "after_backward",
    "after_optimizer",
    "before_first_forward",
    "in_step",
    "no_training",
)
# Ops that model loading does before a first forward: weight initialisation and storages filled from a
# checkpoint (torch.load / safetensors set_) are proof; parameter copies are proof only before the first
# ProfilerStep window that trains (without ProfilerStep, a trace that starts mid-training starts with a batch copy).
OPERATOR = re.compile(r"^\w+::\w")
LOAD_INIT = re.compile(r"^aten::(normal_|uniform_|kaiming_\w+|xavier_\w+|trunc_normal_|orthogonal_|set_)$")
LOAD_COPY = re.compile(r"^aten::(copy_|_to_copy|to|lift_fresh|detach_)$")


def windows(ts: np.ndarray, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per timestamp: its window key (``2k+1`` inside step window ``k``, ``2k`` in the gap before it) and
    whether it is inside a step window."""
    if steps.empty:
        return np.zeros(len(ts), dtype=np.int64), np.zeros(len(ts), dtype=bool)
    starts = steps["start_ns"].to_numpy()
    ends = steps["end_ns"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = idx >= 0
    inside[inside] &= ts[inside] < ends[idx[inside]]
    return np.where(inside, 2 * idx + 1, 2 * (idx + 1)).astype(np.int64), inside


def find_runs(
    events: pd.DataFrame, links: Links, stage: np.ndarray, stages: tuple[str, ...], main: int, window: np.ndarray
) -> pd.DataFrame:
    """The phase runs: window, stage (index into ``RUN_STAGES``), start_ns, end_ns; sorted, not overlapping.

    ``stage`` is the stage code per row decided by the evidence rules (codes index ``stages``; -1: undecided)."""
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    label = np.full(len(stage), -1, dtype=np.int64)
    for i, name in enumerate(RUN_STAGES):
        label[stage == stages.index(name)] = i
    spans = links.host & kind_mask(events, set(SPANS))
    on_main = links.thread == main
    evidence = spans & (label >= 0) & (on_main | (label == RUN_STAGES.index("backward")))
    # an operator the rules left undecided around main-thread evidence (aten::linear around the autograd-recording
    # aten::addmm) starts the phase: climb to the outermost such operator (namespaced: aten::, prims::, ...), never
    # to a range (ProfilerStep#N, or a user's record_function, both cpu_op in 2021-style traces)
    names = events["name"].cat.categories
    operator = np.fromiter((OPERATOR.match(str(x)) is not None for x in names), bool, len(names))
    climbable = (label < 0) & operator[events["name"].cat.codes.to_numpy()]
    cur = np.flatnonzero(evidence & on_main)
    for _ in range(int(links.depth.max()) if len(cur) else 0):
        anc = links.enclosing_op[cur]
        ok = anc >= 0
        ok[ok] &= climbable[anc[ok]]
        if not ok.any():
            break
        label[anc[ok]] = label[cur[ok]]
        evidence[anc[ok]] = True
        cur = np.where(ok, anc, cur)
    # the outermost evidence only: a different stage nested inside evidence (a recomputed forward inside the
    # engine's node, a .to() inside a module) is decided by its own rule and must not split the phase
    parent = links.parent
    nested = np.zeros(len(stage), dtype=bool)
    rows = np.flatnonzero(evidence & (parent >= 0))
    nested[rows] = evidence[parent[rows]]
    rows = np.flatnonzero(evidence & ~nested)
    if len(rows) == 0:
        return pd.DataFrame({"window": [], "stage": [], "start_ns": [], "end_ns": []}, dtype=np.int64)
    rows = rows[np.lexsort((ts[rows], window[rows]))]
    w, lab = window[rows], label[rows]
    new = np.concatenate([[True], (w[1:] != w[:-1]) | (lab[1:] != lab[:-1])])
    run = np.cumsum(new) - 1
    firsts = {"window": (w, "first"), "stage": (lab, "first")}
    spans = {"start_ns": (ts[rows], "min"), "end_ns": (end[rows], "max")}
    runs = grouped({"run": run}, {**firsts, **spans}, sort=True).drop(columns="run")
    # backward evidence from another thread may outlast the next main-thread run: a run ends where the next starts
    ends = runs["end_ns"].to_numpy().copy()
    ends[:-1] = np.minimum(ends[:-1], runs["start_ns"].to_numpy()[1:])
    runs["end_ns"] = ends
    return runs


def phase_conditions(
    events: pd.DataFrame,
    links: Links,
    stage: np.ndarray,
    stages: tuple[str, ...],
    main: int,
    steps: pd.DataFrame,
    real_steps: bool,
) -> dict[str, np.ndarray]:
    """Boolean row masks for the phase conditions of the rule table (see the module docstring).

    ``stage``: stage codes (into ``stages``, -1 where undecided) decided by the rules that need no phases;
    ``real_steps``: the step windows are ``ProfilerStep`` ranges (not guessed from optimizer boundaries)."""
    n = len(events)
    ts = events["ts_ns"].to_numpy()
    window, in_window = windows(ts, steps)
    runs = find_runs(events, links, stage, stages, main, window)
    # every condition holds on main-thread host rows only: computed on those rows (a third to a half of a GPU
    # trace's rows) and scattered into full-length masks: less than half the CPU of computing them on every row
    main_rows = np.flatnonzero(links.host & (links.thread == main))
    out = {name: np.zeros(n, dtype=bool) for name in PHASE_CONDITIONS}
    out["in_step"][main_rows] = in_window[main_rows] if not steps.empty else True
    code = {name: i for i, name in enumerate(RUN_STAGES)}
    if runs.empty:
        return out
    has = set(runs["stage"].tolist())
    inference = code["forward"] in has and code["backward"] not in has and code["optimizer"] not in has
    out["no_training"][main_rows] = inference

    ts, window = ts[main_rows], window[main_rows]
    r_start = runs["start_ns"].to_numpy()
    r_end = runs["end_ns"].to_numpy()
    r_window = runs["window"].to_numpy()
    r_stage = runs["stage"].to_numpy()
    k = np.searchsorted(r_start, ts, side="right") - 1
    prev_ok = k >= 0
    kc = k.clip(0, len(runs) - 1)
    inside = prev_ok & (ts < r_end[kc]) & (r_window[kc] == window)
    for name in RUN_STAGES:
        out[f"{name}_phase"][main_rows] = inside & (r_stage[kc] == code[name])

    # a gap event lies wholly in its gap: a long frame around the phases (``<module>``, ``train()``) is not in one
    end = ts + events["dur_ns"].to_numpy()[main_rows]
    gap = ~inside & ((k + 1 >= len(runs)) | (end <= r_start[(k + 1).clip(0, len(runs) - 1)]))
    prev_stage = np.where(prev_ok & (r_window[kc] == window), r_stage[kc], -1)
    k_next = (k + 1).clip(0, len(runs) - 1)
    next_stage = np.where((k + 1 < len(runs)) & (r_window[k_next] == window), r_stage[k_next], -1)
    out["before_forward"][main_rows] = gap & (next_stage == code["forward"])
    # the seed comes right before the engine starts, after the last forward op; a zero_grad may sit in between
    out["between_forward_and_backward"][main_rows] = (
        gap & (next_stage == code["backward"]) & (prev_stage != code["backward"])
    )
    for name in ("forward", "backward", "optimizer"):
        out[f"after_{name}"][main_rows] = gap & (prev_stage == code[name])
    out["between_backward_and_optimizer"][main_rows] = (
        gap & (prev_stage == code["backward"]) & (next_stage == code["optimizer"])
    )

    forward = np.flatnonzero(r_stage == code["forward"])
    if len(forward):
        first = forward[0]
        early = gap & (ts < r_start[first])
        if real_steps and r_window[first] % 2 == 1:
            early &= window != r_window[first]  # the first training step's own batch preparation is not loading
        names = events["name"].cat.categories
        proof = (LOAD_INIT, LOAD_COPY) if real_steps else (LOAD_INIT,)
        evidence = np.fromiter((any(p.search(str(x)) for p in proof) for x in names), bool, len(names))
        ops = kind_mask(events, {"cpu_op"})[main_rows]
        if (early & ops & evidence[events["name"].cat.codes.to_numpy()[main_rows]]).any():
            out["before_first_forward"][main_rows] = early
    return out
