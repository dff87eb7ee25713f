"""The stage summary users read: per stage totals, per step, top kernels and ops per stage, the analyses' sections.

``summary_data`` collects plain data from a :class:`~profparse.api.ParsedTrace`; the renderers only format it
(text for terminals, markdown, csv, json). Every section shown is one :class:`Section` of :data:`SECTIONS`, in the
order shown; a new section is one more entry (its functions in a module of ``outputs/summary/``).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.analysis.profiler_cost import (
    path_without_profiler,
    without_profiler,
    without_profiler_basis,
    without_profiler_text,
)
from profparse.analysis.quality import gpu_devices
from profparse.base.arrays import grouped
from profparse.base.formats import (
    STEP_ROWS,
    Column,
    Table,
    display,
    md_code,
    ms_text,
    path_text,
    render_as,
    share_text,
    tables_csv,
    tables_markdown,
    tables_text,
    total_bytes_text,
)
from profparse.base.marks import STAGES
from profparse.base.names import unique_labels
from profparse.outputs.summary import analyses
from profparse.outputs.summary.communication import communication_data, communication_tables
from profparse.outputs.summary.critical_path import critical_path_data, critical_path_tables
from profparse.outputs.summary.efficiency import efficiency_data, efficiency_tables
from profparse.outputs.summary.findings import findings_data, findings_markdown, findings_tables, summary_findings_text
from profparse.outputs.summary.memory_categories import memory_categories_data, memory_categories_tables
from profparse.outputs.summary.runtime import runtime_calls_tables, top_calls
from profparse.outputs.summary.top import stage_top_table
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

FORMATS = ("text", "json", "csv", "markdown")
HOST_COLUMNS = frozenset({"host_wall_ns", "host_op_ns"})
TOP_N = 5
LABEL_WIDTH = 60  # the kernel/op column of a text line of at most 100 characters
TOTAL_COLUMNS = (
    ("host_wall_ns", "host wall"),
    ("host_op_ns", "host ops"),
    ("gpu_time_ns", "GPU time"),
    ("gpu_busy_ns", "GPU busy"),
    ("gpu_overlap_ns", "GPU overlap"),
    ("gpu_idle_ns", "GPU idle"),
    ("kernel_count", "kernels"),
    ("launch_count", "launches"),
    ("memcpy_bytes", "memcpy"),
)


def _top(frame: pd.DataFrame, value: str, n: int, kernel: bool) -> dict[str, list[dict[str, Any]]]:
    """Per stage, the ``n`` names with the most ``value``: full name, a short distinct label, count, total, share.

    Summed by (stage, name) codes with numpy (pandas' groupby, head and split were ~7 ms per call on a trace of a
    few events, two calls per summary); ``value`` is an int64 column without NULL (the internal kernels and ops
    tables)."""
    if frame.empty:
        return {s: [] for s in STAGES}
    stage, name = frame["stage"], frame["name"]
    stage_codes, name_codes = stage.cat.codes.to_numpy(), name.cat.codes.to_numpy()
    values = frame[value].to_numpy(np.int64)
    stages = [str(s) for s in stage.cat.categories.tolist()]
    staged = stage_codes >= 0
    totals = np.zeros(len(stages), dtype=np.int64)
    np.add.at(totals, stage_codes[staged], values[staged])
    keep = staged & (name_codes >= 0)  # as groupby: rows without a stage or a name are in no group
    if not keep.any():
        return {s: [] for s in STAGES}
    sums = grouped(
        {"stage": stage_codes[keep], "name": name_codes[keep]},
        {"sum": (values[keep], "sum"), "count": (values[keep], "size")},
    )
    group_stage, total, count = (sums[c].to_numpy() for c in ("stage", "sum", "count"))
    texts = [str(t) for t in name.cat.categories[sums["name"].to_numpy()].tolist()]
    # by stage, the most first, equal sums by name: the same order whatever order the file wrote them in
    rank = np.empty(len(texts), dtype=np.int64)
    rank[sorted(range(len(texts)), key=texts.__getitem__)] = np.arange(len(texts))
    ranked = np.lexsort((rank, -total, group_stage))
    first = np.searchsorted(group_stage[ranked], group_stage[ranked])  # each group's stage's first place
    shown: dict[str, list[int]] = {s: [] for s in STAGES}
    for i in ranked[np.arange(len(ranked)) - first < n].tolist():
        shown.get(stages[group_stage[i]], []).append(i)
    names = list(dict.fromkeys(texts[i] for rows in shown.values() for i in rows))
    labels = dict(zip(names, unique_labels(names, LABEL_WIDTH, kernel=kernel), strict=True))
    total_of = {s: float(totals[stages.index(s)]) if s in stages else 0.0 for s in STAGES}
    return {
        s: [
            {
                "name": texts[i],
                "label": labels[texts[i]],
                "count": int(count[i]),
                "total_ns": int(total[i]),
                "share": (float(total[i]) / total_of[s]) if total_of[s] else 0.0,
            }
            for i in rows
        ]
        for s, rows in shown.items()
    }


def _step_totals(per_step: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per step: its stages' host wall and GPU busy added up, its window (end - start in ``parsed.steps``) and
    whether it is steady (past warm-up: the ``steady`` column of ``parsed.steps``)."""
    sums = per_step.groupby("step")[["host_wall_ns", "gpu_busy_ns"]].sum()
    out = []
    for r in steps.itertuples(index=False):
        host, busy = (int(v) for v in sums.loc[r.step]) if r.step in sums.index else (0, 0)
        window = int(r.end_ns - r.start_ns)
        steady = bool(getattr(r, "steady", True))
        out.append({"step": int(r.step), "host_wall_ns": host, "gpu_busy_ns": busy, "window_ns": window,
                    "steady": steady})  # fmt: skip
    return out


def _hostless_text(steps: list[Any]) -> str:
    """The footer's line for steps with only GPU work in the trace (no window), or nothing."""
    if not steps:
        return ""
    named = ", ".join(str(s) for s in steps)
    return (
        f";\n  {'step' if len(steps) == 1 else 'steps'} {named}: only GPU work in the trace (no window: its host part"
        " ran outside it,\n  e.g. a step's kernels still running when the trace began)"
    )


STEADY_COLUMNS = ("host_wall_ns", "gpu_busy_ns", "gpu_overlap_ns", "gpu_idle_ns")


def _steady_totals(per_step: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per stage, its host wall and GPU split added up over the steady steps, with its share of their host wall
    (the headline's scope); empty without steady steps."""
    steady = steps.loc[steps["steady"].astype(bool), "step"] if "steady" in steps.columns else steps["step"]
    rows = per_step[per_step["step"].isin(steady)]
    if rows.empty:
        return []
    sums = rows.groupby("stage", observed=True)[list(STEADY_COLUMNS)].sum()
    whole = float(sums["host_wall_ns"].sum())
    out = []
    for stage in STAGES:
        values = {c: int(sums.loc[stage, c]) if stage in sums.index else 0 for c in STEADY_COLUMNS}
        out.append({"stage": stage, **values, "share": values["host_wall_ns"] / whole if whole else 0.0})
    return out


def summary_data(
    parsed: ParsedTrace, top: int = TOP_N, release: bool = False, keep: Collection[str] = ()
) -> dict[str, Any]:
    """Everything the summary shows, as plain JSON-ready data. ``release``: the big tables and values this
    computes are forgotten once read (as ``parse`` gives back what it wrote), but for those in ``keep`` (that the
    caller reads next); computed again if asked for later.

    The findings and the replays come first, before the op and kernel tables are held: the replays hold the
    most, and with ``release`` what only they read (the path, the replay model, the FLOP counts) is given back
    before the tops are made."""
    held = parsed.computed() | set(keep)

    def done(*names: str) -> None:
        if release:
            parsed.forget(name for name in names if name not in held)

    def lend(name: str) -> None:
        if release and name not in held:
            parsed.lend(name)

    findings, critical_path, unprofiled = _replayed(parsed, done, lend)
    # the sections before the op and kernel tables are made: a caller that keeps those (``keep``) does not hold
    # them under the sections' stage levels and memory categories
    analyses = _sections_data(parsed)
    efficiency = efficiency_data(parsed)
    memory_categories = memory_categories_data(
        parsed.table("memory_peak_categories"), parsed.table("memory_categories")
    )
    tops = _tops(parsed, top, done)
    summary = parsed.stage_summary
    totals = summary[summary["scope"] == "total"]
    per_step = summary[summary["scope"] == "step"]
    steps = parsed.steps
    total_rows = _records(totals)
    whole = sum(r["host_wall_ns"] or 0 for r in total_rows)
    for r in total_rows:  # share of all stages' host wall (steps and outside them): the shares add up to 1
        r["share"] = (r["host_wall_ns"] or 0) / whole if whole else 0.0
    return {
        "trace": path_text(parsed.path),  # json writes a name that is not UTF-8 with \xNN, not a lone surrogate
        "events": int(len(parsed.raw.events)),
        "steps": {
            "count": int(len(steps)),
            "source": str(steps["source"].iloc[0]) if len(steps) else None,
            "numbers": [int(s) for s in steps["step"]] if len(steps) else [],
        },
        "devices": gpu_devices(parsed),
        "rank": parsed.rank,
        "findings": findings,
        "gpu_activity_ns": tops["gpu_activity_ns"],
        "totals": total_rows,
        "per_step": _records(per_step),
        "step_totals": _step_totals(per_step, steps),
        "steady_totals": _steady_totals(per_step, steps),
        "critical_path": critical_path,
        "without_profiler": unprofiled,
        "top_kernels": tops["top_kernels"],
        "top_ops": tops["top_ops"],
        "gpu_time_by_rule": tops["gpu_time_by_rule"],
        "op_time_by_rule": tops["op_time_by_rule"],
        "runtime_calls": top_calls(parsed.table("runtime_calls"), top),
        "communication": communication_data(
            parsed.table("collectives"),
            parsed.table("comm_exposure"),
            [int(x) for x in steps.loc[steps["steady"].astype(bool), "step"]] if "steady" in steps.columns else None,
        ),
        "warnings": parsed.warnings.to_dict("records"),
        "analyses": analyses,
        "efficiency": efficiency,
        "memory_categories": memory_categories,
        "report": {
            "truncated": parsed.raw.report.truncated,
            "dropped": dict(parsed.raw.report.dropped),
        },
    }


def _replayed(
    parsed: ParsedTrace, done: Callable[..., None], lend: Callable[[str], None]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The findings, the critical path (with its replay without the profiler) and the steps replayed without
    the profiler; ``done`` is told what is read for the last time, ``lend`` what only the findings read next.

    The path's section and the flops table (what the efficiency section reads) are made before the findings, so
    that neither the path nor the FLOP counts are held under the findings' replays (~100 MiB on a 300 MB trace)."""
    parsed.table("flops")
    done("flop_counts")
    critical_path = critical_path_data(parsed.table("critical_path"))
    lend("critical_path")  # given back once the findings' detectors have read it, before their replays
    findings = findings_data(parsed.table("findings"))  # what to change first (profparse advise)
    done("critical_path")
    critical_path["without_profiler"] = path_without_profiler(parsed)  # the steady steps' path, replayed without it
    unprofiled = without_profiler(parsed)  # the steps replayed without the profiler's own cost
    done("replay_model")
    return findings, critical_path, unprofiled


def _tops(parsed: ParsedTrace, top: int, done: Callable[..., None]) -> dict[str, Any]:
    """GPU activity time, the top kernels and ops per stage, time per stage rule; ``done`` as in :func:`_replayed`."""
    kernels = parsed.table("kernels")  # internal: the columns read here hold no NULL, and a public copy is ~as big
    ops = parsed.table("ops")
    rules = kernels.groupby("stage_rule", observed=True)["dur_ns"].sum() if len(kernels) else pd.Series()
    op_rules = ops.groupby("stage_rule", observed=True)["self_ns"].sum() if len(ops) else pd.Series()
    out = {
        "gpu_activity_ns": int(kernels["dur_ns"].sum()) if len(kernels) else 0,
        "top_kernels": _top(kernels, "dur_ns", top, kernel=True),
        "top_ops": _top(ops, "self_ns", top, kernel=False),
        "gpu_time_by_rule": {str(k): int(v) for k, v in rules.items() if v},
        "op_time_by_rule": {str(k): int(v) for k, v in op_rules.items() if v},
    }
    del kernels, ops
    done("kernels", "ops")
    return out


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of a stage summary as JSON-ready dicts: NULL and NA as None, numpy integers as int, stages as text."""
    rows = []
    for r in frame.to_dict("records"):
        clean = {}
        for k, v in r.items():
            if k == "scope":
                continue
            if v is pd.NA or (isinstance(v, int | np.integer) and v == NULL):
                clean[k] = None
            elif isinstance(v, np.integer):
                clean[k] = int(v)
            else:
                clean[k] = str(v) if k == "stage" else v
        rows.append(clean)
    return rows


def _cell(column: str, value: Any) -> str:
    if column.endswith("_ns"):
        return ms_text(value)
    if column.endswith("_bytes"):
        return total_bytes_text(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def _totals_tables(data: dict[str, Any]) -> list[Table]:
    has_gpu = data["gpu_activity_ns"] > 0
    overlap = any(r.get("gpu_overlap_ns") for r in data["totals"])  # shown only where stages ran at once on a GPU
    columns = [(c, label) for c, label in TOTAL_COLUMNS if (has_gpu or c in HOST_COLUMNS)]
    columns = [(c, label) for c, label in columns if overlap or c != "gpu_overlap_ns"]
    columns.insert(1, ("share", "share"))
    cols = [Column("stage", "stage")] + [
        Column(c, label, share_text if c == "share" else _cell_of(c)) for c, label in columns
    ]
    note = "times in ms; share: of all stages' host wall"
    return [Table("Stage totals", cols, data["totals"], note=note)]


def _cell_of(column: str) -> Any:
    return lambda value: _cell(column, value)


def _per_step_tables(data: dict[str, Any]) -> list[Table]:
    if not data["per_step"]:
        return []
    has_gpu = data["gpu_activity_ns"] > 0

    def cell(r: dict[str, Any] | None) -> str:
        if r is None or (not r["host_wall_ns"] and not r["gpu_busy_ns"]):
            return "-"
        return f"{ms_text(r['host_wall_ns'])} | {ms_text(r['gpu_busy_ns'])}" if has_gpu else ms_text(r["host_wall_ns"])

    by_step: dict[Any, dict[str, Any]] = {}
    for r in data["per_step"]:
        by_step.setdefault(r["step"], {"step": r["step"]})[r["stage"]] = r
    for t in data["step_totals"]:
        by_step.setdefault(t["step"], {"step": t["step"]}).update(total=t, window_ns=t["window_ns"])
    hostless = [s for s, row in by_step.items() if s is not None and "window_ns" not in row]
    columns = [Column("step", "step", lambda s: "outside" if s is None else str(s))]
    columns += [Column(s, s, cell) for s in STAGES] + [Column("total", "step total", cell)]
    columns.append(Column("window_ns", "window", ms_text))
    value_keys = ("host_wall_ns", "gpu_busy_ns") if has_gpu else ("host_wall_ns",)
    records = [
        {"step": r["step"], "stage": r["stage"], "column": k, "value": r[k]}
        for r in data["per_step"]
        for k in value_keys
    ]
    records += [
        {"step": t["step"], "name": "step total", "column": k, "value": t[k]}
        for t in data["step_totals"]
        for k in (*value_keys, "window_ns")
    ]
    return [
        Table(
            "Per step",
            columns,
            list(by_step.values()),
            note="host wall ms | GPU busy ms" if has_gpu else "host wall ms",
            footer=(
                "step total: its stages added up (stages that ran at once on two threads count twice);\n"
                "  window: the step's span (its time when no stage ran, e.g. between ops, counts in no stage)"
                + _hostless_text(hostless)
            ),
            records=records,
            text_rows=STEP_ROWS,
        )
    ]


def _top_tables(key: str, title: str, kernel: bool) -> Any:
    def tables(data: dict[str, Any]) -> list[Table]:
        rows = [{"stage": stage, **item} for stage in STAGES for item in data[key].get(stage, [])]
        if not rows:
            return []
        label = "kernel" if kernel else "op"
        return [stage_top_table(title, rows, label, ("label", "total_ns", "share", "count"), "per stage")]

    return tables


def _checks_tables(data: dict[str, Any]) -> list[Table]:
    if not data["warnings"]:
        return []
    columns = [Column("check", "check"), Column("severity", "severity"), Column("message", "message")]
    return [Table("Checks", columns, data["warnings"], last_left=True)]


def _rules_tables(data: dict[str, Any]) -> list[Table]:
    if not (data["gpu_time_by_rule"] or data["op_time_by_rule"]):
        return []
    has_gpu = data["gpu_activity_ns"] > 0
    names = sorted(set(data["gpu_time_by_rule"]) | set(data["op_time_by_rule"]))
    rows = [
        {"rule": n, "host_op_ns": data["op_time_by_rule"].get(n, 0), "gpu_ns": data["gpu_time_by_rule"].get(n, 0)}
        for n in names
    ]
    columns = [Column("rule", "rule"), Column("host_op_ns", "host ops", ms_text)]
    columns += [Column("gpu_ns", "GPU", ms_text)] if has_gpu else []
    note = "host op self time, GPU time; ms" if has_gpu else "host op self time; ms"
    return [Table("Which rules decided", columns, rows, note=note)]


@dataclass(frozen=True)
class Section:
    """One section of the summary: ``tables`` turns the summary data into the tables shown (none: nothing to
    show), which text, markdown and csv all render (``base/formats.py``); ``data``, when given, turns a parsed
    trace into the section's own JSON-ready entries, which the summary data holds under ``"analyses"``."""

    tables: Callable[[dict[str, Any]], list[Table]]
    data: Callable[[Any], dict[str, Any]] | None = None


#: The summary's sections, in the order shown; a new section is one more entry.
SECTIONS: list[Section] = [
    Section(_totals_tables),
    Section(_per_step_tables),
    Section(critical_path_tables),
    Section(_top_tables("top_kernels", "Top kernels", kernel=True)),
    Section(_top_tables("top_ops", "Top ops", kernel=False)),
    Section(analyses.levels_tables, analyses.levels_data),
    Section(analyses.load_tables, analyses.load_data),
    Section(analyses.modules_tables, analyses.modules_data),
    Section(analyses.memory_tables, analyses.memory_data),
    Section(memory_categories_tables),
    Section(efficiency_tables),
    Section(runtime_calls_tables),
    Section(communication_tables),
    Section(_checks_tables),
    Section(_rules_tables),
]


def _sections_data(parsed: ParsedTrace) -> dict[str, Any]:
    """The sections' own data (the summary's ``analyses``: totals; the full tables are in Parquet), merged."""
    out: dict[str, Any] = {}
    for section in SECTIONS:
        if section.data is not None:
            out.update(section.data(parsed))
    return out


def summary_tables(data: dict[str, Any]) -> list[Table]:
    """Every table the summary shows, in order (text, markdown and csv render these same tables)."""
    return [t for section in SECTIONS for t in section.tables(data)]


def steps_line(data: dict[str, Any]) -> str:
    """``4 steps (ProfilerStep): step 0 loads the model, 3 training steps``: a step that does nothing but load
    (as scripts/capture.py's step 0) is named, so the count matches what the capture announced."""
    steps = data["steps"]
    if not steps["count"]:
        return "no steps found"
    wall: dict[int, dict[str, int]] = {}
    for row in data["per_step"]:
        wall.setdefault(row["step"], {})[row["stage"]] = row["host_wall_ns"] or 0
    training = ("forward", "backward", "optimizer")
    loading = [s for s, w in wall.items() if w.get("load", 0) > 0 and not any(w.get(t, 0) for t in training)]
    line = f"{steps['count']} steps ({steps['source']})"
    if loading and len(loading) < steps["count"]:
        named = ", ".join(str(s) for s in sorted(loading))
        line += f": step {named} loads the model, " if len(loading) == 1 else f": steps {named} load the model, "
        line += f"{steps['count'] - len(loading)} training steps"
    return line


def render_text(data: dict[str, Any]) -> str:
    out = io.StringIO()
    where = steps_line(data)
    devices = ", ".join(display(d) for d in sorted(set(data["devices"]))) or "no GPU"
    rank = f", rank {data['rank']}" if data["rank"] is not None else ""
    out.write(f"profparse summary: {display(data['trace'])}\n  {data['events']:,} events, {where}, {devices}{rank}\n")
    if data["report"]["truncated"]:
        out.write("  WARNING: trace is truncated; summary covers the events before the cut\n")
    if data.get("without_profiler"):
        found = data["without_profiler"]
        basis = f"  ({without_profiler_basis(found)})"
        if len(basis) > 100:  # the cost on one line, what it rests on below it
            cost, _, rest = basis.partition("; ")
            basis = f"{cost};\n" + textwrap.fill(rest, 100, initial_indent="   ", subsequent_indent="   ")
        out.write(f"  {without_profiler_text(found)}\n{basis}\n")
    out.write(summary_findings_text(data))
    out.write(tables_text(summary_tables(data)))
    return out.getvalue()


def render_markdown(data: dict[str, Any]) -> str:
    lines = [f"# profparse summary: {md_code(Path(data['trace']).name)}"]
    if data["report"]["truncated"]:
        lines += ["", "**The trace is truncated**: the summary covers the events before the cut."]
    if data.get("without_profiler"):
        found = data["without_profiler"]
        lines += ["", f"{without_profiler_text(found)} ({without_profiler_basis(found)})"]
    lines += findings_markdown(data)
    lines += tables_markdown(summary_tables(data))
    return "\n".join(lines) + "\n"


def render_csv(data: dict[str, Any]) -> str:
    """Every section as one long csv (``step,stage,section,name,column,value``: raw numbers, exact names)."""
    return tables_csv(findings_tables(data) + summary_tables(data))


def render(data: dict[str, Any], fmt: str = "text") -> str:
    return render_as(data, fmt, {"text": render_text, "markdown": render_markdown, "csv": render_csv})


def render_summary(parsed: ParsedTrace, fmt: str = "text", top: int = TOP_N, release: bool = False) -> str:
    """Summary of one parsed trace in the given format (``release``: see :func:`summary_data`)."""
    return render(summary_data(parsed, top=top, release=release), fmt)
