"""Compare two parsed traces: per stage and level, and the kernels and ops whose time moved most.

Every change is ``B - A`` (positive = B spent more), with the relative change ``(B - A) / A`` (None when A is 0).
``diff_data`` returns plain JSON-ready data; ``render`` formats it as text, markdown or JSON. What is compared of
each trace is small (:class:`Side`): ``profparse diff`` reads one trace, keeps its side and gives the trace back
before reading the other, so that it holds one trace at a time.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.analysis.critical_path import BOUNDS
from profparse.analysis.memory_categories import CATEGORIES
from profparse.analysis.profiler_cost import without_profiler
from profparse.analysis.quality import gpu_devices
from profparse.base.arrays import as_text, category_codes
from profparse.base.formats import bytes_text, count_text, display, md_code, render_as, text_table
from profparse.base.marks import STAGES

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

FORMATS = ("text", "json", "markdown")
TOP_N = 10

#: (column, label) of the per-stage levels, from Python down to the device. ``stage_levels`` columns are used when
#: the analyses provide them; ``stage_summary`` columns otherwise. Counts and bytes come last.
LEVELS: tuple[tuple[str, str, str], ...] = (
    ("stage_summary", "host_wall_ns", "host wall"),
    ("stage_levels", "python_ns", "Python"),
    ("stage_levels", "op_ns", "ops"),
    ("stage_summary", "host_op_ns", "ops"),
    ("stage_levels", "runtime_ns", "runtime"),
    ("stage_levels", "sync_ns", "synchronize"),
    ("stage_levels", "wait_ns", "waiting"),
    ("stage_summary", "gpu_time_ns", "GPU time"),
    ("stage_summary", "gpu_busy_ns", "GPU busy"),
    ("stage_summary", "gpu_overlap_ns", "GPU overlap"),
    ("stage_summary", "gpu_idle_ns", "GPU idle"),
    ("stage_summary", "kernel_count", "kernels"),
    ("stage_summary", "launch_count", "launches"),
    ("stage_summary", "memcpy_bytes", "memcpy bytes"),
)


def _optional(parsed: ParsedTrace, name: str) -> pd.DataFrame | None:
    from profparse.outputs.plots import optional_table

    return optional_table(parsed, name)


def _stage_values(parsed: ParsedTrace, per_step: bool) -> tuple[dict[str, dict[str, float]], list[tuple[str, str]]]:
    """{stage: {column: value}} and the (column, label) levels available for this trace."""
    tables: dict[str, pd.DataFrame] = {"stage_summary": parsed.stage_summary}
    levels = _optional(parsed, "stage_levels")
    if levels is not None and "scope" in levels.columns:
        tables["stage_levels"] = levels
    columns: list[tuple[str, str]] = []
    values: dict[str, dict[str, float]] = {s: {} for s in STAGES}
    labels_done: set[str] = set()
    for source, column, label in LEVELS:
        table = tables.get(source)
        if table is None or column not in table.columns or label in labels_done:
            continue
        labels_done.add(label)
        columns.append((column, label))
        if per_step:
            rows = table[table["scope"] == "step"]
            sums = rows.groupby("stage", observed=False)[column].sum() / max(len(parsed.steps), 1)
        else:
            rows = table[table["scope"] == "total"]
            sums = rows.groupby("stage", observed=False)[column].sum()
        for stage in STAGES:
            values[stage][column] = float(sums.get(stage, 0) or 0)
    return values, columns


def _change(a: float, b: float) -> dict[str, Any]:
    """A's and B's value, the change and the change in percent of A (``pct``, as every ``_pct`` value of
    profparse: 100 x delta / a; None where A is 0)."""
    delta = b - a
    return {"a": a, "b": b, "delta": delta, "pct": _percent(delta, a)}


def _percent(delta: float, a: float) -> float | None:
    return 100 * delta / a if a else None


def _change_in(a: int, b: int, unit: str) -> dict[str, Any]:
    """A's and B's value, the change and its percent of A (None where A is 0), keyed ``a_<unit>`` and so on."""
    change = _change(a, b)
    return {f"a_{unit}": a, f"b_{unit}": b, f"delta_{unit}": change["delta"], "pct": change["pct"]}


def moved_pairs(a: pd.DataFrame, b: pd.DataFrame, value: str, top: int, per_step: tuple[int, int] | None) -> list[dict]:
    """The (stage, name) pairs whose total ``value`` changed most, by absolute change."""
    sa, sb = per_step if per_step is not None else (1, 1)
    return moved_totals(
        name_totals(a, value, sa, per_step is not None), name_totals(b, value, sb, per_step is not None), top
    )


def name_totals(frame: pd.DataFrame, value: str, steps: int = 1, in_steps: bool = False) -> pd.DataFrame:
    """Per (stage, name): the total ``value`` and the row count, each divided by ``steps`` (rows in a step only,
    with ``in_steps``), sorted by stage and name."""
    if frame.empty:  # typed as a filled frame's columns are: text keys (an untyped empty column is float64 on
        # pandas 3, which will not merge with text) and float totals (object ones: pandas 2.2 warns on filling them)
        text = pd.Series([], dtype=str)
        return pd.DataFrame({"stage": text, "name": text, "total": np.zeros(0), "count": np.zeros(0)})
    if in_steps:
        frame = frame[frame["step"].notna()]
    # grouped by the columns themselves (categoricals: by their codes, much cheaper than by their text), then the
    # few keys made text and sorted as the text keys were
    g = frame.groupby(["stage", "name"], observed=True, sort=False)[value]
    out = g.agg(total="sum", count="count").reset_index()
    out.columns = ["stage", "name", "total", "count"]
    out["stage"], out["name"] = out["stage"].astype(str), as_text(out["name"])
    out = out.sort_values(["stage", "name"], kind="stable", ignore_index=True)
    out["total"] = out["total"].astype(float) / max(steps, 1)
    out["count"] = out["count"].astype(float) / max(steps, 1)
    return out


def moved_totals(a: pd.DataFrame, b: pd.DataFrame, top: int) -> list[dict]:
    """The ``top`` (stage, name) pairs of two :func:`name_totals` whose total changed most, by absolute change."""
    merged = a.merge(b, on=["stage", "name"], how="outer", suffixes=("_a", "_b"))
    if merged.empty:
        return []
    merged = merged.fillna({"total_a": 0.0, "total_b": 0.0, "count_a": 0.0, "count_b": 0.0})
    merged["delta"] = merged["total_b"] - merged["total_a"]
    merged = merged[merged["delta"] != 0]
    merged = merged.reindex(merged["delta"].abs().sort_values(ascending=False, kind="stable").index).head(top)
    rows = []
    for r in merged.itertuples(index=False):
        rows.append(
            {
                "stage": r.stage,
                "name": r.name,
                "a_ns": r.total_a,
                "b_ns": r.total_b,
                "delta_ns": r.delta,
                "pct": _percent(r.delta, r.total_a),
                "a_count": r.count_a,
                "b_count": r.count_b,
            }
        )
    return rows


def _path_make_up(parsed: ParsedTrace, per_step: bool) -> dict[tuple[str, str], float]:
    """{(stage, bound): ns on the critical path}, all steps summed (or their mean per step), in the order the pairs
    first come on the path."""
    path = parsed.table("critical_path")  # internal: a public copy, or a frame of every segment grouped, was
    if path.empty:  # this verb's peak on a big trace
        return {}
    ns = path["end_ns"].to_numpy() - path["start_ns"].to_numpy()
    (codes_s, stages), (codes_b, bounds) = category_codes(path["stage"]), category_codes(path["bound"])
    key = codes_s.astype(np.int64)
    key *= len(bounds)
    key += codes_b
    sums = np.bincount(key, weights=ns)  # ns sums: exact below 2^53
    steps = max(len(parsed.steps), 1) if per_step else 1
    return {(stages[k // len(bounds)], bounds[k % len(bounds)]): float(sums[k]) / steps for k in pd.unique(key)}


def path_changes(a: ParsedTrace, b: ParsedTrace, per_step: bool = False) -> list[dict[str, Any]]:
    """Per stage, the ns on the critical path by bound in A and B and the change; ``all`` bounds is the stage's
    path time, the ``all`` stage sums the stages. Pairs on neither path are left out."""
    return _path_rows([_path_make_up(x, per_step) for x in (a, b)])


def _path_rows(made: list[dict[tuple[str, str], float]]) -> list[dict[str, Any]]:
    rows = []
    for stage in (*STAGES, "all"):
        for bound in (*BOUNDS, "all"):
            x, y = (sum(v for (s, bd), v in m.items() if stage in ("all", s) and bound in ("all", bd)) for m in made)
            if x or y:
                rows.append({"stage": stage, "bound": bound, **_change_in(x, y, "ns")})
    return rows


def _peak_categories(parsed: ParsedTrace) -> dict[str, dict[str, int]]:
    """{device: {category: bytes live at the device's highest Total Allocated (its first), "all": that peak}}."""
    peak = _optional(parsed, "memory_peak_categories")
    if peak is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for device, group in peak.groupby("device", observed=True, sort=True):
        highest = group["peak_allocated_bytes"].max()
        first = group.loc[group["peak_allocated_bytes"] == highest, "peak_ts_ns"].min()
        at = group[(group["peak_ts_ns"] == first) & (group["peak_allocated_bytes"] == highest)]
        live = {str(c): int(b) for c, b in zip(at["category"], at["live_bytes"], strict=True)}
        out[str(device)] = {**live, "all": int(highest)}
    return out


def memory_peak_changes(a: ParsedTrace, b: ParsedTrace) -> list[dict[str, Any]]:
    """Per device, the bytes live in each category at the device's highest Total Allocated in A and in B, and the
    change; ``all`` is that peak (the categories add up to it). A peak is no sum, so per step or not it is the
    same. Categories empty in both are left out."""
    return _peak_rows([_peak_categories(x) for x in (a, b)])


def _peak_rows(peaks: list[dict[str, dict[str, int]]]) -> list[dict[str, Any]]:
    rows = []
    for device in sorted(set(peaks[0]) | set(peaks[1])):
        for category in (*CATEGORIES, "all"):
            x, y = (p.get(device, {}).get(category, 0) for p in peaks)
            if x or y:
                rows.append({"device": device, "category": category, **_change_in(x, y, "bytes")})
    return rows


def _describe(parsed: ParsedTrace) -> dict[str, Any]:
    steps = parsed.steps
    return {
        "trace": str(parsed.path),
        "events": int(len(parsed.raw.events)),
        "steps": int(len(steps)),
        "devices": sorted(set(gpu_devices(parsed))),
    }


@dataclass
class Side:
    """What ``diff`` compares of one trace (:func:`side`): a few small tables and numbers."""

    described: dict[str, Any]
    values: dict[str, dict[str, float]]  # {stage: {column: value}}
    columns: list[tuple[str, str]]  # the (column, label) levels this trace has
    steps: int
    has_kernels: bool
    kernels: pd.DataFrame  # name_totals of the kernels (dur_ns)
    ops: pd.DataFrame  # name_totals of the ops (self_ns)
    path: dict[tuple[str, str], float]  # {(stage, bound): ns on the critical path}
    peaks: dict[str, dict[str, int]]  # {device: {category: bytes at the peak}}
    step: dict[str, Any]  # the steady steps' mean, profiled and without the profiler (summarize's headline)


def side(parsed: ParsedTrace, per_step: bool = False, release: bool = False) -> Side:
    """What :func:`compare` reads of ``parsed`` (``per_step``: as :func:`diff_data`). ``release``: the big tables
    this makes are given back once read (the path first, made while the least is held), but those held before."""
    held = parsed.computed()

    def done(name: str) -> None:
        if release and name not in held:
            parsed.forget([name])

    path = _path_make_up(parsed, per_step)
    done("critical_path")
    step = without_profiler(parsed)
    for name in ("replay", "replay_model", "efficiency", "flops"):
        done(name)
    steps = max(len(parsed.steps), 1)
    divide = steps if per_step else 1
    kernels = parsed.kernels
    has_kernels = bool(len(kernels))
    kernels = name_totals(kernels, "dur_ns", divide, per_step)
    done("kernels")
    ops = name_totals(parsed.ops, "self_ns", divide, per_step)
    done("ops")
    values, columns = _stage_values(parsed, per_step)
    return Side(
        described=_describe(parsed),
        values=values,
        columns=columns,
        steps=steps,
        has_kernels=has_kernels,
        kernels=kernels,
        ops=ops,
        path=path,
        peaks=_peak_categories(parsed),
        step=step,
    )


#: The step section: (key of :func:`~profparse.analysis.profiler_cost.without_profiler`, label). Not MFU: each
#: trace's is over the peak of its own dominant math mode, so a fix that moves matmuls to TF32 lowers it
STEP_ROWS = (
    ("profiled_step_ns", "step, profiled"),
    ("step_ns", "step without the profiler"),
)


def step_changes(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The steady steps' mean time profiled and without the profiler of A and B, where both traces have steady
    steps: what a fix did to the step, the profiler's own cost taken out of both."""
    if not a or not b:
        return []
    rows = []
    for key, label in STEP_ROWS:
        x, y = a.get(key), b.get(key)
        if x is not None and y is not None:
            rows.append({"key": key, "label": label, **_change(float(x), float(y))})
    return rows


def diff_data(a: Any, b: Any, *, top: int = TOP_N, per_step: bool = False) -> dict[str, Any]:
    """The changes from trace ``a`` to trace ``b`` as plain data.

    ``per_step``: compare means per step (rows inside step windows, divided by each trace's step count) instead of
    whole-trace totals, for captures with different step counts.
    """
    return compare(side(a, per_step), side(b, per_step), top=top, per_step=per_step)


def compare(a: Side, b: Side, *, top: int = TOP_N, per_step: bool = False) -> dict[str, Any]:
    """:func:`diff_data` of two sides made with the same ``per_step``."""
    va, vb = a.values, b.values
    labels = dict(a.columns)
    columns = [c for c in a.columns if c in b.columns]  # levels both traces have
    stages = []
    for stage in (*STAGES, "all"):
        for column, label in columns:
            if stage == "all":  # the sum over stages
                x, y = (sum(v[s].get(column, 0.0) for s in STAGES) for v in (va, vb))
            else:
                x, y = va[stage].get(column, 0.0), vb[stage].get(column, 0.0)
            if x == 0 and y == 0:
                continue
            stages.append({"stage": stage, "level": label, "column": column, **_change(x, y)})
    return {
        "a": a.described,
        "b": b.described,
        "per_step": per_step,
        "note": _steps_note(a.described["steps"], b.described["steps"], per_step),
        "step": step_changes(a.step, b.step),
        "step_basis": [side.step.get("basis") for side in (a, b)],
        "levels": [labels[c] for c, _ in columns],
        "stages": stages,
        "gpu": a.has_kernels or b.has_kernels,
        "kernels": moved_totals(a.kernels, b.kernels, top),
        "ops": moved_totals(a.ops, b.ops, top),
        "critical_path": _path_rows([a.path, b.path]),
        "memory_peak_categories": _peak_rows([a.peaks, b.peaks]),
    }


# -- rendering ----------------------------------------------------------------------------------------------------


def _value(column: str, v: float) -> str:
    if column.endswith("_ns"):
        return f"{v / 1e6:,.2f}"
    if column.endswith("_bytes"):
        return f"{v / (1 << 20):,.1f} MiB"
    return f"{v:,.1f}" if v != int(v) else f"{int(v):,}"


def _delta(column: str, v: float) -> str:
    text = _value(column, abs(v))
    return ("+" if v > 0 else "-" if v < 0 else " ") + text


def _pct(p: float | None) -> str:
    return "new" if p is None else f"{p / 100:+.1%}"


def _table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    return text_table(headers, rows, align_left=left)


def _short(name: str, width: int = 70, kernel: bool = False) -> str:
    from profparse.base.names import shorten_name

    return shorten_name(name, width, kernel=kernel)


def _count(v: float) -> str:
    return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"


def _section(out: io.StringIO, title: str, headers: list[str], rows: list[list[str]], empty: str) -> None:
    """A titled table of the text diff, or its one line saying why it is empty."""
    out.write(f"\n{title}\n")
    out.write(_table(headers, rows) + "\n" if rows else f"  ({empty})\n")


def _moved_cells(rows: list[dict[str, Any]], kernel: bool) -> list[list[str]]:
    return [
        [
            r["stage"],
            _short(r["name"], kernel=kernel),
            f"{r['a_ns'] / 1e6:,.2f} ({_count(r['a_count'])})",
            f"{r['b_ns'] / 1e6:,.2f} ({_count(r['b_count'])})",
            _delta("x_ns", r["delta_ns"]),
            _pct(r["pct"]),
        ]
        for r in rows
    ]


def _steps_note(a_steps: int, b_steps: int, per_step: bool) -> str:
    """What to read whole-trace totals of captures with different step counts as (empty where they agree)."""
    if per_step or a_steps == b_steps:
        return ""
    return (
        f"A has {a_steps} steps and B {b_steps}: whole-trace totals differ by the step count too; --per-step "
        "compares means per step"
    )


def render_text(data: dict[str, Any]) -> str:
    out = io.StringIO()
    a, b = data["a"], data["b"]
    out.write("profparse diff (change = B - A)\n")
    for key, d in (("A", a), ("B", b)):
        devices = ", ".join(display(x) for x in d["devices"]) or "no GPU"
        steps = count_text(d["steps"], "step")
        out.write(f"  {key}: {display(d['trace'])}  ({d['events']:,} events, {steps}, {devices})\n")
    if data.get("note"):
        out.write(f"  note: {data['note']}\n")
    scope = "mean per step" if data["per_step"] else "whole trace"
    stage_rows = [
        [
            r["stage"],
            r["level"],
            _value(r["column"], r["a"]),
            _value(r["column"], r["b"]),
            _delta(r["column"], r["delta"]),
            _pct(r["pct"]) if r["delta"] else "",
        ]
        for r in data["stages"]
    ]
    columns = ["A", "B", "change", "%"]
    _section(out, f"Step (mean of the steady steps; ms; {_basis_text(data.get('step_basis') or [])})",
             ["", *columns], _step_cells(data.get("step") or []), "no steady step in one of the traces")  # fmt: skip
    _section(out, f"Per stage and level ({scope}; times in ms)", ["stage", "level", *columns], stage_rows,
             "no time in any stage")  # fmt: skip
    for title, key, what in (("Kernels", "kernels", "GPU time"), ("Ops", "ops", "host self time")):
        moved = _moved_cells(data[key], kernel=key == "kernels")
        gone = "no GPU activity in either trace" if key == "kernels" and not data["gpu"] else "no change"
        _section(out, f"{title} that moved most ({what}, ms; count in parentheses)", ["stage", "name", *columns],
                 moved if gone == "no change" else [], gone)  # fmt: skip
    _section(out, f"Critical path by stage and bound (ms on the path, {scope}; all = the stage's path)",
             ["stage", "bound", *columns], _path_cells(data.get("critical_path") or []),
             "no step has a critical path in either trace")  # fmt: skip
    _section(out, f"{_MEMORY_TITLE} ({_MEMORY_NOTE})", ["device", "category", *columns],
             _memory_cells(data.get("memory_peak_categories") or []), "no [memory] events in either trace")  # fmt: skip
    return out.getvalue()


def _step_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [r["label"], _value("x_ns", r["a"]), _value("x_ns", r["b"]), _delta("x_ns", r["delta"]),
         _pct(r["pct"]) if r["delta"] else ""]
        for r in rows
    ]  # fmt: skip


def _basis_text(bases: list[str | None]) -> str:
    """How the steps without the profiler were estimated, for both traces."""
    known = [b for b in bases if b]
    if known and all(b == "calibrated" for b in known):
        return "without the profiler: calibrated at capture"
    if known and "calibrated" in known:
        return "without the profiler: one trace calibrated at capture, one with default costs per event"
    return "without the profiler: default costs per event, uncalibrated"


_MEMORY_TITLE = "Memory at the peak by category"
_MEMORY_NOTE = "per device: bytes live at its highest Total Allocated; all = the peak"


def _memory_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    def signed(v: int) -> str:
        return ("+" if v > 0 else " " if v == 0 else "") + bytes_text(v)

    return [
        [
            r["device"],
            r["category"],
            bytes_text(r["a_bytes"]),
            bytes_text(r["b_bytes"]),
            signed(r["delta_bytes"]),
            _pct(r["pct"]) if r["delta_bytes"] else "",
        ]
        for r in rows
    ]


def _path_cells(path: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["stage"],
            r["bound"],
            _value("x_ns", r["a_ns"]),
            _value("x_ns", r["b_ns"]),
            _delta("x_ns", r["delta_ns"]),
            _pct(r["pct"]) if r["delta_ns"] else "",
        ]
        for r in path
    ]


def render_markdown(data: dict[str, Any]) -> str:
    a, b = data["a"], data["b"]
    lines = [
        f"# profparse diff: {md_code(a['trace'])} → {md_code(b['trace'])}",
        "",
        f"Change = B - A; {'mean per step' if data['per_step'] else 'whole trace'}; times in ms."
        + (f" {data['note']}." if data.get("note") else ""),
        "",
        f"Step: mean of the steady steps, ms; {_basis_text(data.get('step_basis') or [])}.",
        "",
        "| | A | B | change | % |",
        "|---|---:|---:|---:|---:|",
        *("| " + " | ".join(cells) + " |" for cells in _step_cells(data.get("step") or [])),
        "",
        "| stage | level | A | B | change | % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in data["stages"]:
        c = r["column"]
        pct = _pct(r["pct"]) if r["delta"] else ""
        cells = [r["stage"], r["level"], _value(c, r["a"]), _value(c, r["b"]), _delta(c, r["delta"]), pct]
        lines.append("| " + " | ".join(cells) + " |")
    for title, key in (("Kernels that moved most", "kernels"), ("Ops that moved most", "ops")):
        lines += ["", f"## {title}", "", "| stage | name | A ms (count) | B ms (count) | change | % |"]
        lines.append("|---|---|---:|---:|---:|---:|")
        for r in data[key]:
            cells = [
                r["stage"],
                md_code(_short(r["name"], kernel=key == "kernels")),
                f"{r['a_ns'] / 1e6:,.2f} ({_count(r['a_count'])})",
                f"{r['b_ns'] / 1e6:,.2f} ({_count(r['b_count'])})",
                _delta("x_ns", r["delta_ns"]),
                _pct(r["pct"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Critical path by stage and bound", "", "ms on the path; all = the stage's path.", ""]
    lines += ["| stage | bound | A | B | change | % |", "|---|---|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _path_cells(data.get("critical_path") or [])]
    lines += ["", f"## {_MEMORY_TITLE}", "", _MEMORY_NOTE[0].upper() + _MEMORY_NOTE[1:] + ".", ""]
    lines += ["| device | category | A | B | change | % |", "|---|---|---:|---:|---:|---:|"]
    memory = data.get("memory_peak_categories") or []
    lines += ["| " + " | ".join(cells) + " |" for cells in _memory_cells(memory)]
    return "\n".join(lines) + "\n"


def render(data: dict[str, Any], fmt: str = "text") -> str:
    return render_as(data, fmt, {"text": render_text, "markdown": render_markdown})


def render_diff(a: Any, b: Any, fmt: str = "text", *, top: int = TOP_N, per_step: bool = False) -> str:
    """The diff of two parsed traces in the given format."""
    return render(diff_data(a, b, top=top, per_step=per_step), fmt)
