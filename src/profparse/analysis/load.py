"""Loading sub-steps: which part of model loading the ``load`` stage's time went to.

:func:`load_substeps` applies the rule table of :mod:`profparse.analysis.load_rules` to the load-stage events
(one sub-step and deciding rule per row); :func:`load_breakdown` sums them into one row per sub-step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profparse.analysis.load_rules import SUBSTEPS, UNATTRIBUTED, LoadRule, load_rules
from profparse.base.intervals import union_length
from profparse.base.marks import STAGES
from profparse.stages.attribute import Attribution
from profparse.tables.host_time import HOST_SPAN_KINDS, mixed_containers
from profparse.tables.host_time import host_time as host_time_of
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import Links, kind_mask, names_matching

LOAD = STAGES.index("load")
_DEPTH_BITS = 12
_RULE_BITS = 12
BREAKDOWN_COLUMNS = (
    "substep",
    "time_ns",
    "share",
    "wall_ns",
    "event_count",
    "op_count",
    "python_count",
    "gpu_time_ns",
    "gpu_count",
    "rule",
)


@dataclass
class LoadSubsteps:
    """Per-row sub-step of the load stage (``-1`` = not a load-stage row) and the rule that decided it."""

    substep: np.ndarray  # int8 codes into SUBSTEPS, -1 outside the load stage
    rule: np.ndarray  # int16 codes into rule_names, -1 where no rule decided (unattributed, or not load)
    rule_names: list[str]
    active: bool  # the load stage has Python frames, so a breakdown is meaningful

    def substage_column(self, rows: slice | np.ndarray = slice(None)) -> pd.Categorical:
        return pd.Categorical.from_codes(self.substep[rows], categories=list(SUBSTEPS))

    def rule_column(self, rows: slice | np.ndarray = slice(None)) -> pd.Categorical:
        return pd.Categorical.from_codes(self.rule[rows], categories=self.rule_names)


def load_substeps(
    events: pd.DataFrame, links: Links, attribution: Attribution, rules: list[LoadRule] | None = None
) -> LoadSubsteps:
    """Give every load-stage row a sub-step (and its rule); rows of other stages get ``-1``."""
    rules = load_rules() if rules is None else rules
    names = [r.name for r in rules]
    n = len(events)
    substep = np.full(n, -1, dtype=np.int8)
    rule = np.full(n, -1, dtype=np.int16)
    load = attribution.stage == LOAD
    host_load = load & links.host
    active = bool((host_load & kind_mask(events, {"python_function"})).any())
    if not load.any():
        return LoadSubsteps(substep, rule, names, active)

    rows = np.flatnonzero(host_load)
    name_codes = events["name"].cat.codes.to_numpy()[rows]
    categories = events["name"].cat.categories
    kinds = events["kind"].cat.codes.to_numpy()[rows]
    depth = links.depth[rows].astype(np.int64).clip(0, (1 << _DEPTH_BITS) - 1)
    own = np.zeros(len(rows), dtype=np.int64)
    for index in range(len(rules) - 1, -1, -1):  # lowest priority first, so higher ones overwrite
        r = rules[index]
        kind_ok = np.isin(kinds, [events["kind"].cat.categories.get_loc(k) for k in r.kinds])
        mask = kind_ok & names_matching(categories, r.pattern)[name_codes]
        key = (r.priority + 1) << (_DEPTH_BITS + _RULE_BITS)
        own[mask] = key + (depth[mask] << _RULE_BITS) + index

    # inherit down the nesting tree (only through load-stage parents), level by level
    position = np.full(n, -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    parent_pos = np.full(len(rows), -1, dtype=np.int64)
    has_parent = links.parent[rows] >= 0
    parent_pos[has_parent] = position[links.parent[rows][has_parent]]
    best = own.copy()
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(int(depth.max(initial=0)) + 2))
    for d in range(1, len(bounds) - 1):
        level = by_depth[bounds[d] : bounds[d + 1]]
        p = parent_pos[level]
        ok = p >= 0
        level, p = level[ok], p[ok]
        best[level] = np.maximum(best[level], best[p])

    matched = best > 0
    rule_of = (best & ((1 << _RULE_BITS) - 1)).astype(np.int16)
    substep_of_rule = np.array([SUBSTEPS.index(r.substep) for r in rules], dtype=np.int8)
    host_rule = np.where(matched, rule_of, -1).astype(np.int16)
    rule[rows] = host_rule
    substep[rows] = np.where(matched, substep_of_rule[np.maximum(rule_of, 0)], SUBSTEPS.index(UNATTRIBUTED))

    # GPU activity (and anything else of the load stage off the host) takes its launching call's sub-step
    off_host = np.flatnonzero(load & ~links.host)
    substep[off_host] = SUBSTEPS.index(UNATTRIBUTED)
    launched = off_host[links.launch[off_host] >= 0]
    if launched.size:
        via = links.launch[launched]
        ok = substep[via] >= 0
        substep[launched[ok]] = substep[via[ok]]
        rule[launched[ok]] = rule[via[ok]]
    return LoadSubsteps(substep, rule, names, active)


def load_breakdown(
    events: pd.DataFrame,
    links: Links,
    attribution: Attribution,
    substeps: LoadSubsteps,
    host_time: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per sub-step (all of them, in loading order, ``unattributed`` last); empty without Python frames.

    ``time_ns`` of a sub-step is exclusive host time: the self time of its host spans, over the same spans as
    ``stage_summary.host_wall_ns``; ``unattributed`` is the rest of the load stage's host wall time, so the rows add
    up to it. ``wall_ns`` is the wall-clock time covered by the sub-step's spans (nested work of other sub-steps
    included). ``host_time`` is :func:`profparse.tables.host_time.host_time`'s result where the caller has it already.
    """
    if not substeps.active:
        return _empty_breakdown()
    n_sub = len(SUBSTEPS)
    code = substeps.substep.astype(np.int64)
    load = code >= 0
    ts = events["ts_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    spans = load & kind_mask(events, HOST_SPAN_KINDS) & links.host & (dur > 0)
    spans &= ~mixed_containers(links.parent, links.depth, attribution.stage)
    ops = load & kind_mask(events, {"cpu_op"}) & links.host
    python = load & kind_mask(events, {"python_function"}) & links.host
    activity = load & kind_mask(events, GPU_ACTIVITY_KINDS)

    def total(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        w = None if weights is None else weights[mask]
        return np.bincount(code[mask], weights=w, minlength=n_sub).astype(np.int64)

    time_ns = total(spans, links.self_ns)
    host = host_time_of(events, links, attribution) if host_time is None else host_time
    load_code = STAGES.index("load")
    whole = int(host.loc[(host["scope"] == "total") & (host["stage_code"] == load_code), "host_wall_ns"].sum())
    rest = SUBSTEPS.index(UNATTRIBUTED)
    time_ns[rest] = max(whole - (time_ns.sum() - time_ns[rest]), 0)
    frame = pd.DataFrame(
        {
            "substep": pd.Categorical(list(SUBSTEPS), categories=list(SUBSTEPS)),
            "time_ns": time_ns,
            "share": time_ns / whole if whole else np.zeros(n_sub),
            "wall_ns": union_length(code[spans], ts[spans], ts[spans] + dur[spans], n_sub),
            "event_count": total(load & links.host & (dur > 0)),
            "op_count": total(ops),
            "python_count": total(python),
            "gpu_time_ns": total(activity, dur),
            "gpu_count": total(activity),
            "rule": _rules_by_substep(code, substeps, spans, links.self_ns),
        }
    )
    return frame


def _rules_by_substep(code: np.ndarray, substeps: LoadSubsteps, spans: np.ndarray, self_ns: np.ndarray) -> list[str]:
    """Per sub-step: the deciding rules, most time first, comma-separated."""
    decided = spans & (substeps.rule >= 0)
    out = [""] * len(SUBSTEPS)
    if not decided.any():
        return out
    frame = pd.DataFrame({"substep": code[decided], "rule": substeps.rule[decided], "ns": self_ns[decided]})
    sums = frame.groupby(["substep", "rule"])["ns"].sum().reset_index()
    sums = sums.sort_values(["substep", "ns", "rule"], ascending=[True, False, True], kind="stable")
    for s, group in sums.groupby("substep"):
        out[int(s)] = ", ".join(substeps.rule_names[int(r)] for r in group["rule"])
    return out


def _empty_breakdown() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "substep": pd.Categorical([], categories=list(SUBSTEPS)),
            **{c: np.array([], np.float64 if c == "share" else np.int64) for c in BREAKDOWN_COLUMNS[1:-1]},
            "rule": np.array([], dtype=object),
        }
    )
