"""How well inferred stages agree with marked ones: the ground-truth measure of stage attribution.

``truth`` is a trace with ``profparse.stage:<stage>`` ranges parsed with marks on; ``inferred`` is the same trace
with those ranges removed (:func:`profparse.capture.patterns.strip_marks`), parsed by the rules alone. Events are
joined one to one on (pid, tid, ts, dur, name) for CPU ops and (device, stream, ts, dur, name, correlation) for GPU
activity, the n-th repeat of a key with the n-th. An event's true stage is the stage of the innermost mark it lies
in (a GPU activity: the mark of the op that launched it); an event outside every mark is truly ``other``.
Agreement is weighted by CPU op self time and by GPU activity duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.arrays import as_text
from profparse.base.marks import STAGES
from profparse.stages.rules import RULES

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

MARK_RULES = frozenset(r.name for r in RULES if r.source == "mark")
OP_KEY = ("pid", "tid", "ts_ns", "dur_ns", "name")
GPU_KEY = ("device", "stream", "ts_ns", "dur_ns", "name", "correlation")
KINDS = ("cpu_op", "gpu")


@dataclass
class Agreement:
    """Per-event truth and inferred stage, with the figures derived from them."""

    ops: pd.DataFrame  # one row per CPU op: key columns, self_ns, step, truth, stage, stage_rule, agree
    gpu: pd.DataFrame  # one row per GPU activity: key columns, dur_ns, step, truth, stage, stage_rule, agree

    def _events(self, kind: str) -> tuple[pd.DataFrame, str]:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        return (self.ops, "self_ns") if kind == "cpu_op" else (self.gpu, "dur_ns")

    @property
    def summary(self) -> pd.DataFrame:
        """Per kind (``cpu_op``: self time, ``gpu``: duration): events, total_ns, agree_ns and share (NaN if no
        time)."""
        rows = []
        for kind in KINDS:
            frame, weight = self._events(kind)
            total = int(frame[weight].sum())
            agree = int(frame.loc[frame["agree"], weight].sum())
            rows.append(
                {
                    "kind": kind,
                    "events": len(frame),
                    "total_ns": total,
                    "agree_ns": agree,
                    "share": agree / total if total else float("nan"),
                }
            )
        return pd.DataFrame(rows).set_index("kind")

    def share(self, kind: str = "cpu_op") -> float:
        """The share of ``kind`` time whose inferred stage is the true one (NaN where there is no such time)."""
        return float(self.summary.loc[kind, "share"])

    def confusion(self, kind: str = "cpu_op") -> pd.DataFrame:
        """Nanoseconds per (true stage: rows, inferred stage: columns), every stage present; sums to total_ns."""
        frame, weight = self._events(kind)
        table = frame.pivot_table(
            index="truth", columns="stage", values=weight, aggfunc="sum", fill_value=0, observed=False
        )
        return table.reindex(index=list(STAGES), columns=list(STAGES), fill_value=0).astype(np.int64)

    def disagreements(self, kind: str = "cpu_op", top: int = 10) -> pd.DataFrame:
        """The disagreeing time grouped by (name, truth, stage, stage_rule), largest first: ns, events and share
        of the kind's total time."""
        frame, weight = self._events(kind)
        wrong = frame.loc[~frame["agree"], ["name", "truth", "stage", "stage_rule", weight]]
        wrong = wrong.astype({"name": str, "truth": str, "stage": str, "stage_rule": str})
        grouped = wrong.groupby(["name", "truth", "stage", "stage_rule"], sort=False)[weight].agg(["sum", "size"])
        grouped = grouped.rename(columns={"sum": "ns", "size": "events"}).reset_index()
        total = frame[weight].sum()
        grouped["share"] = grouped["ns"] / total if total else np.nan
        return (
            grouped.sort_values(["ns", "name"], ascending=[False, True], kind="stable").head(top).reset_index(drop=True)
        )


def _truth(stage: pd.Series, rule: pd.Series) -> pd.Categorical:
    """The mark's stage where a mark rule decided the row, else ``other``."""
    marked = rule.astype(str).isin(MARK_RULES).to_numpy()
    values = np.where(marked, stage.astype(str).to_numpy(), "other")
    return pd.Categorical(values, categories=list(STAGES))


def _join(truth: pd.DataFrame, inferred: pd.DataFrame, key: tuple[str, ...], weight: str, what: str) -> pd.DataFrame:
    """One row per event present in both tables (the n-th repeat of a key with the n-th); an event in only one
    of them means the traces differ by more than their marks."""

    def keyed(frame: pd.DataFrame) -> pd.DataFrame:
        columns = list(dict.fromkeys([*key, weight, "step", "stage", "stage_rule"]))
        out = frame.loc[:, columns].copy()
        out["weight"] = out[weight]
        out["name"] = as_text(out["name"])
        for column in key:
            if column != "name":
                out[column] = out[column].astype("int64")
        out["repeat"] = out.groupby(list(key), sort=False).cumcount()
        return out

    t, i = keyed(truth), keyed(inferred)
    joined = t.merge(i, on=[*key, "repeat"], how="inner", suffixes=("_truth", ""), validate="one_to_one")
    if len(joined) != len(t) or len(joined) != len(i):
        raise ValueError(
            f"the two traces hold different {what} events ({len(t)} marked, {len(i)} stripped, {len(joined)} in "
            "both): the inferred trace must be the marked one with only its marks removed"
        )
    joined["truth"] = _truth(joined["stage_truth"], joined["stage_rule_truth"])
    joined[weight] = joined["weight_truth"]
    joined["step"] = joined["step_truth"]
    joined["agree"] = joined["truth"].astype(str).to_numpy() == joined["stage"].astype(str).to_numpy()
    return joined.loc[:, list(dict.fromkeys([*key, weight, "step", "truth", "stage", "stage_rule", "agree"]))]


def agreement(truth: ParsedTrace, inferred: ParsedTrace) -> Agreement:
    """Join a marked parse (``include_marks=True``) with the parse of its stripped copy, event by event."""
    if not truth.options.get("include_marks", True):
        raise ValueError("truth must be parsed with include_marks=True: its marks are the ground truth")
    ops = _join(truth.ops, inferred.ops, OP_KEY, "self_ns", "CPU op")
    gpu = _join(truth.kernels, inferred.kernels, GPU_KEY, "dur_ns", "GPU")
    return Agreement(ops=ops, gpu=gpu)
