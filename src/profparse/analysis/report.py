"""The analyses' sections of the summary: plain data from a parsed trace, and text/markdown renderers.

``outputs/summary.py`` puts :func:`summary_sections` under ``"analyses"`` in its data and calls
:func:`render_text` / :func:`render_markdown` with it. A section with nothing to show is left out (no Python
frames in loading: no load breakdown; no GPU: no device columns; no ``nn.Module`` events: no modules; no
``[memory]`` events: no memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profparse.outputs.formats import display, md_cell, md_code, md_table, text_table

MODULE_ROWS = 12
RULES_WIDTH = 38
LEVELS = (
    ("python_ns", "python"),
    ("op_ns", "ops"),
    ("op_python_ns", "py in ops"),
    ("runtime_ns", "runtime"),
    ("sync_ns", "sync"),
    ("wait_ns", "waiting"),
    ("device_ns", "device"),
    ("device_idle_ns", "dev idle"),
)
LATENCY = (
    ("launch_latency_p50_ns", "p50"),
    ("launch_latency_p90_ns", "p90"),
    ("launch_latency_p99_ns", "p99"),
    ("launch_latency_max_ns", "max"),
)


def _plain(value: Any) -> Any:
    if value is pd.NA or value is None:
        return None
    if isinstance(value, np.integer | np.bool_):
        return value.item()
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    return value


def _records(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out = []
    for row in frame.drop(columns=[c for c in drop if c in frame.columns]).to_dict("records"):
        out.append({k: (str(v) if k in ("stage", "substep", "device") else _plain(v)) for k, v in row.items()})
    return out


def summary_sections(parsed: Any) -> dict[str, Any]:
    """The analysis sections as JSON-ready data (totals; the full tables are in Parquet)."""
    levels = parsed.stage_levels
    levels = levels[levels["scope"] == "total"]
    memory = parsed.memory_by_stage
    modules = parsed.modules
    return {
        "load_breakdown": _records(parsed.load_breakdown),
        "stage_levels": _records(levels, drop=("scope", "step")),
        "modules_by_class": _modules_by_class(modules),
        "module_count": int(modules.loc[modules["calls"] > 0, "module"].nunique()) if len(modules) else 0,
        "memory_by_stage": _records(memory[memory["scope"] == "total"], drop=("scope", "step")),
    }


def _modules_by_class(modules: pd.DataFrame) -> list[dict[str, Any]]:
    """Per class: instances, forward/backward host and GPU time (inclusive), recompute time; tree order."""
    if modules.empty:
        return []
    # a class's time counts its outermost instances only (a Sequential inside a Sequential is already included)
    firsts = modules.drop_duplicates("module")
    nested_names = _nested_in_same_class(
        firsts["module"].tolist(), firsts["parent"].tolist(), firsts["class"].tolist()
    )
    outer = ~modules["module"].isin(nested_names).to_numpy(dtype=bool)
    modules = modules.assign(
        host_ns=np.where(outer, modules["host_ns"], 0), gpu_ns=np.where(outer, modules["gpu_ns"], 0)
    )
    m = modules.assign(
        fwd_host=np.where(modules["stage"] != "backward", modules["host_ns"], 0),
        fwd_gpu=np.where(modules["stage"] != "backward", modules["gpu_ns"], 0),
        bwd_host=np.where((modules["stage"] == "backward") & ~modules["recompute"], modules["host_ns"], 0),
        bwd_gpu=np.where((modules["stage"] == "backward") & ~modules["recompute"], modules["gpu_ns"], 0),
        recompute_host=np.where(modules["recompute"], modules["host_ns"], 0),
        fwd_calls=np.where(modules["stage"] != "backward", modules["calls"], 0),
    )
    grouped = m.groupby("class", sort=False).agg(
        depth=("depth", "min"),
        instances=("module", "nunique"),
        calls=("fwd_calls", "sum"),
        forward_host_ns=("fwd_host", "sum"),
        forward_gpu_ns=("fwd_gpu", "sum"),
        backward_host_ns=("bwd_host", "sum"),
        backward_gpu_ns=("bwd_gpu", "sum"),
        recompute_host_ns=("recompute_host", "sum"),
        first=("first_ts_ns", "min"),
    )
    grouped = grouped.reset_index().sort_values(["depth", "first"], kind="stable").drop(columns="first")
    return [{k: _plain(v) for k, v in r.items()} for r in grouped.to_dict("records")]


def _nested_in_same_class(names: list[Any], parents: list[Any], classes: list[Any]) -> set[Any]:
    """Modules that have an ancestor of their own class, by one walk down the module tree (linear in its size).

    A depth-first walk keeps a count of the classes on the path from the root; a module is nested when its class
    is already on the path. A module whose parent is unknown is a root; parent links that form a cycle (possible
    only in a hand-made trace) are cut where the walk first enters them.
    """
    index = {name: i for i, name in enumerate(names)}
    children: list[list[int]] = [[] for _ in names]
    has_parent = [False] * len(names)
    for i, parent in enumerate(parents):
        j = index.get(parent)
        if j is not None and j != i:
            children[j].append(i)
            has_parent[i] = True
    nested: set[Any] = set()
    seen = [False] * len(names)
    on_path: dict[Any, int] = {}
    starts = [i for i in range(len(names)) if not has_parent[i]] + list(range(len(names)))
    for start in starts:
        if seen[start]:
            continue
        seen[start] = True
        stack = [(start, iter(children[start]))]
        on_path[classes[start]] = on_path.get(classes[start], 0) + 1
        while stack:
            node, kids = stack[-1]
            kid = next(kids, None)
            if kid is None:
                stack.pop()
                on_path[classes[node]] -= 1
                continue
            if seen[kid]:
                continue
            seen[kid] = True
            if on_path.get(classes[kid], 0):
                nested.add(names[kid])
            on_path[classes[kid]] = on_path.get(classes[kid], 0) + 1
            stack.append((kid, iter(children[kid])))
    return nested


# -- text ------------------------------------------------------------------------------------------------------------


def _ms(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def _nz(ns: Any) -> str:
    return _ms(ns) if ns else "-"


def _us(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:,.1f} {unit}"
    return f"{sign}{n} B"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(headers: list[str], rows: list[list[str]], align_left: int = 1, last_left: bool = False) -> str:
    return text_table(headers, rows, align_left, last_left=last_left)


def _module_rows(modules: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the modules-by-class table (GPU and recompute columns only where there is any)."""
    gpu = any(r["forward_gpu_ns"] or r["backward_gpu_ns"] for r in modules)
    recompute = any(r["recompute_host_ns"] for r in modules)
    headers = ["class", "depth", "inst", "calls", "fwd host"] + (["fwd GPU"] if gpu else []) + ["bwd host"]
    headers += (["bwd GPU"] if gpu else []) + (["recompute"] if recompute else [])
    rows = []
    for r in modules[:MODULE_ROWS]:
        row = [_short(display(r["class"]), 28), str(r["depth"]), str(r["instances"]), f"{r['calls']:,}"]
        row += [_nz(r["forward_host_ns"])] + ([_nz(r["forward_gpu_ns"])] if gpu else [])
        row += [_nz(r["backward_host_ns"])] + ([_nz(r["backward_gpu_ns"])] if gpu else [])
        row += [_nz(r["recompute_host_ns"])] if recompute else []
        rows.append(row)
    return headers, rows


def _level_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Level columns worth showing: python and ops always, the others where some stage has time."""
    return [(c, label) for c, label in LEVELS if c in ("python_ns", "op_ns") or any(r.get(c) for r in rows)]


def _active_stages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if any(r.get(c) for c, _ in LEVELS) or r.get("launch_latency_count")]


def render_text(data: dict[str, Any] | None) -> str:
    """The analysis sections for a terminal (at most 100 columns)."""
    if not data:
        return ""
    parts = []
    levels = _active_stages(data["stage_levels"])
    if levels:
        columns = _level_columns(levels)
        rows = [[r["stage"]] + [_nz(r[c]) for c, _ in columns] for r in levels]
        parts.append(
            "Levels per stage (ms; the host levels add up to host wall: Python, ops, runtime, waiting; GPU)\n"
            + _table(["stage"] + [label for _, label in columns], rows)
        )
        launched = [r for r in levels if r.get("launch_latency_count")]
        if launched:
            rows = [
                [r["stage"], f"{r['launch_latency_count']:,}", _us(r["launch_latency_mean_ns"])]
                + [_us(r[c]) for c, _ in LATENCY]
                for r in launched
            ]
            parts.append(
                "Launch latency (us, GPU start - launch call start)\n"
                + _table(["stage", "launches", "mean"] + [label for _, label in LATENCY], rows)
            )
    load = data["load_breakdown"]
    if load:
        total = sum(r["time_ns"] for r in load)
        gpu = any(r["gpu_time_ns"] for r in load)
        rows = []
        for r in load:
            row = [r["substep"], _ms(r["time_ns"]), f"{r['share']:.1%}", _ms(r["wall_ns"]), f"{r['event_count']:,}"]
            if gpu:
                row.append(_ms(r["gpu_time_ns"]))
            rows.append(row + [_short(display(r["rule"] or "-"), RULES_WIDTH - (10 if gpu else 0))])
        headers = ["substep", "ms", "share", "wall ms", "events"] + (["GPU ms"] if gpu else []) + ["rules"]
        parts.append(
            f"Loading sub-steps (load host time {_ms(total)} ms; unattributed = no rule explains it)\n"
            + _table(headers, rows, last_left=True)
        )
    modules = data["modules_by_class"]
    if modules:
        headers, rows = _module_rows(modules)
        more = len(modules) - MODULE_ROWS
        parts.append(
            f"Modules by class ({data['module_count']} instance{'s' if data['module_count'] != 1 else ''}; "
            "ms, a module includes its sub-modules)\n"
            + _table(headers, rows)
            + (f"\n  ... {more} more classes (profparse parse: modules table)" if more > 0 else "")
        )
    memory = data["memory_by_stage"]
    if memory:
        rows = [
            [
                r["device"],
                r["stage"],
                _bytes(r["start_allocated_bytes"]),
                _bytes(r["end_allocated_bytes"]),
                _bytes(r["peak_allocated_bytes"]),
                _bytes(r["alloc_bytes"]),
                _bytes(r["freed_bytes"]),
                _bytes(r["peak_reserved_bytes"]),
            ]
            for r in memory
        ]
        relative = any(r["relative"] for r in memory)
        note = "\n  (the trace has no allocator totals: levels are relative to its first event)" if relative else ""
        parts.append(
            "Memory per stage (allocated at first -> last event, peak; bytes allocated, freed: moves of the\n"
            f"  allocator's Total Allocated; reserve-only events count in reserved peak){note}\n"
            + _table(["device", "stage", "start", "end", "peak", "allocated", "freed", "reserved peak"], rows, 2)
        )
    return "".join(f"\n{p}\n" for p in parts)


# -- markdown --------------------------------------------------------------------------------------------------------


def _md(headers: list[str], rows: list[list[str]], code: int | None = None) -> list[str]:
    """A markdown table of plain cells (escaped here); column ``code``, if given, holds code spans already."""
    return md_table(headers, [[c if i == code else md_cell(c) for i, c in enumerate(row)] for row in rows])


def render_markdown(data: dict[str, Any] | None) -> list[str]:
    """The analysis sections as markdown lines."""
    if not data:
        return []
    lines: list[str] = []
    levels = _active_stages(data["stage_levels"])
    if levels:
        columns = _level_columns(levels)
        rows = [[r["stage"]] + [_nz(r[c]) for c, _ in columns] for r in levels]
        lines += ["", "## Levels per stage", "", *_md(["stage"] + [label for _, label in columns], rows), ""]
        lines.append("Times in ms.")
        launched = [r for r in levels if r.get("launch_latency_count")]
        if launched:
            rows = [[r["stage"], str(r["launch_latency_count"])] + [_us(r[c]) for c, _ in LATENCY] for r in launched]
            lines += ["", "Launch latency (us):", "", *_md(["stage", "launches"] + [x for _, x in LATENCY], rows)]
    if data["load_breakdown"]:
        rows = [
            [
                r["substep"],
                _ms(r["time_ns"]),
                f"{r['share']:.1%}",
                _ms(r["wall_ns"]),
                str(r["event_count"]),
                md_code(r["rule"]) if r["rule"] else "-",
            ]
            for r in data["load_breakdown"]
        ]
        headers = ["substep", "ms", "share", "wall ms", "events", "rules"]
        lines += ["", "## Loading sub-steps", "", *_md(headers, rows, code=5)]
    if data["modules_by_class"]:
        headers, rows = _module_rows(data["modules_by_class"])
        lines += ["", "## Modules by class", "", *_md(headers, rows), "", "Times in ms, sub-modules included."]
    if data["memory_by_stage"]:
        rows = [
            [
                r["device"],
                r["stage"],
                _bytes(r["start_allocated_bytes"]),
                _bytes(r["end_allocated_bytes"]),
                _bytes(r["peak_allocated_bytes"]),
                _bytes(r["alloc_bytes"]),
                _bytes(r["freed_bytes"]),
            ]
            for r in data["memory_by_stage"]
        ]
        lines += [
            "",
            "## Memory per stage",
            "",
            *_md(["device", "stage", "start", "end", "peak", "allocated", "freed"], rows),
        ]
    return lines
