"""The analyses' sections of the summary (levels, loading, modules, memory): plain data from a parsed trace, and
the tables that show it.

Each section is a pair of functions, ``<name>_data(parsed)`` (JSON-ready entries, which the summary puts under
``"analyses"``) and ``<name>_tables(data)`` (the :class:`~profparse.base.formats.Table` s shown, which text, markdown
and csv render alike), listed as one :class:`~profparse.outputs.summary.Section` in the summary's one ``SECTIONS``
list (``outputs/summary/__init__.py``). A section with nothing to show gives no tables (no Python frames in loading:
no load breakdown; no GPU: no device columns; no ``nn.Module`` events: no modules; no ``[memory]`` events: no
memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.formats import (
    Column,
    Table,
    bytes_text,
    display,
    ms_text,
    plain,
    us_text,
)
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

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


def _records(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows of an internal table (NULL sentinels, no nullable columns: a public copy costs ~1 ms a table) as
    JSON-ready dicts, NULL as None."""
    out = []
    for row in frame.drop(columns=[c for c in drop if c in frame.columns]).to_dict("records"):
        out.append(
            {k: (str(v) if k in ("stage", "substep", "device") else plain(v, null=NULL)) for k, v in row.items()}
        )
    return out


def levels_data(parsed: ParsedTrace) -> dict[str, Any]:
    levels = parsed.table("stage_levels")
    return {"stage_levels": _records(levels[levels["scope"] == "total"], drop=("scope", "step"))}


def load_data(parsed: ParsedTrace) -> dict[str, Any]:
    return {"load_breakdown": _records(parsed.table("load_breakdown"))}


def modules_data(parsed: ParsedTrace) -> dict[str, Any]:
    modules = parsed.modules
    count = int(modules.loc[modules["calls"] > 0, "module"].nunique()) if len(modules) else 0
    return {"modules_by_class": _modules_by_class(modules), "module_count": count}


def memory_data(parsed: ParsedTrace) -> dict[str, Any]:
    memory = parsed.table("memory_by_stage")
    return {"memory_by_stage": _records(memory[memory["scope"] == "total"], drop=("scope", "step"))}


def _modules_by_class(modules: pd.DataFrame) -> list[dict[str, Any]]:
    """Per class: instances, forward/backward host and GPU time (inclusive), recompute time; tree order."""
    if modules.empty:
        return []
    # a class's time counts its outermost instances only (a Sequential inside a Sequential is already included)
    firsts = modules.drop_duplicates("module")
    nested_names = _nested_in_same_class(firsts["module"].tolist(), firsts["parent"].tolist(), firsts["class"].tolist())
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
        # a recomputation (activation checkpointing) runs a layer from the autograd engine with no parent: its
        # depth is not the class's place in the model
        model_depth=modules["depth"].where(~modules["recompute"].astype(bool)),
    )
    # a few grouped reductions of several columns each (``agg`` by name makes one per column)
    by_class = m.groupby("class", sort=False)
    sums = {
        "fwd_calls": "calls",
        "fwd_host": "forward_host_ns",
        "fwd_gpu": "forward_gpu_ns",
        "bwd_host": "backward_host_ns",
        "bwd_gpu": "backward_gpu_ns",
        "recompute_host": "recompute_host_ns",
    }
    lows = by_class[["depth", "model_depth", "first_ts_ns"]].min().rename(columns={"first_ts_ns": "first"})
    instances = by_class["module"].nunique().rename("instances")
    parts = [lows[["depth", "model_depth"]], instances, by_class[list(sums)].sum().rename(columns=sums), lows["first"]]
    grouped = pd.concat(parts, axis=1)
    grouped["depth"] = grouped.pop("model_depth").fillna(grouped["depth"]).astype(np.int64)  # recomputed only: its own
    grouped = grouped.reset_index().sort_values(["depth", "first"], kind="stable").drop(columns="first")
    return [{k: plain(v) for k, v in r.items()} for r in grouped.to_dict("records")]


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


def _nz(ns: Any) -> str:
    return ms_text(ns) if ns else "-"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _module_columns(modules: list[dict[str, Any]]) -> list[Column]:
    """The modules-by-class columns (GPU and recompute columns only where there is any)."""
    gpu = any(r["forward_gpu_ns"] or r["backward_gpu_ns"] for r in modules)
    recompute = any(r["recompute_host_ns"] for r in modules)
    columns = [
        Column("class", "class", lambda c: _short(display(c), 28)),
        Column("depth", "depth"),
        Column("instances", "inst"),
        Column("calls", "calls", lambda n: f"{n:,}"),
        Column("forward_host_ns", "fwd host", _nz),
    ]
    columns += [Column("forward_gpu_ns", "fwd GPU", _nz)] if gpu else []
    columns += [Column("backward_host_ns", "bwd host", _nz)]
    columns += [Column("backward_gpu_ns", "bwd GPU", _nz)] if gpu else []
    return columns + ([Column("recompute_host_ns", "recompute", _nz)] if recompute else [])


def _level_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Level columns worth showing: python and ops always, the others where some stage has time."""
    return [(c, label) for c, label in LEVELS if c in ("python_ns", "op_ns") or any(r.get(c) for r in rows)]


def _active_stages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if any(r.get(c) for c, _ in LEVELS) or r.get("launch_latency_count")]


def _entries(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The rows of the summary's ``analyses`` entry ``key`` (none when absent)."""
    return (data.get("analyses") or {}).get(key) or []


def levels_tables(data: dict[str, Any]) -> list[Table]:
    levels = _active_stages(_entries(data, "stage_levels"))
    if not levels:
        return []
    columns = [Column("stage", "stage")] + [Column(c, label, _nz) for c, label in _level_columns(levels)]
    note = "ms; the host levels add up to host wall: Python, ops, runtime, waiting; GPU"
    out = [Table("Levels per stage", columns, levels, note=note)]
    launched = [r for r in levels if r.get("launch_latency_count")]
    if launched:
        columns = [Column("stage", "stage"), Column("launch_latency_count", "launches", lambda n: f"{n:,}")]
        columns += [Column("launch_latency_mean_ns", "mean", us_text)] + [
            Column(c, label, us_text) for c, label in LATENCY
        ]
        out.append(Table("Launch latency", columns, launched, note="us, GPU start - launch call start"))
    return out


def load_tables(data: dict[str, Any]) -> list[Table]:
    load = _entries(data, "load_breakdown")
    if not load:
        return []
    total = sum(r["time_ns"] for r in load)
    gpu = any(r["gpu_time_ns"] for r in load)
    columns = [
        Column("substep", "substep"),
        Column("time_ns", "ms", ms_text),
        Column("share", "share", lambda x: f"{x:.1%}"),
        Column("wall_ns", "wall ms", ms_text),
        Column("event_count", "events", lambda n: f"{n:,}"),
    ]
    columns += [Column("gpu_time_ns", "GPU ms", ms_text)] if gpu else []
    width = RULES_WIDTH - (10 if gpu else 0)
    columns.append(Column("rule", "rules", lambda r: _short(display(r or "-"), width), code=True))
    note = f"load host time {ms_text(total)} ms; unattributed = no rule explains it"
    return [Table("Loading sub-steps", columns, load, note=note, last_left=True)]


def modules_tables(data: dict[str, Any]) -> list[Table]:
    modules = _entries(data, "modules_by_class")
    if not modules:
        return []
    count = data["analyses"]["module_count"]
    more = len(modules) - MODULE_ROWS
    note = f"{count} instance{'s' if count != 1 else ''}; ms, a module includes its sub-modules"
    footer = f"... {more} more classes (profparse parse: modules table)" if more > 0 else ""
    return [Table("Modules by class", _module_columns(modules), modules[:MODULE_ROWS], note=note, footer=footer)]


def memory_tables(data: dict[str, Any]) -> list[Table]:
    memory = _entries(data, "memory_by_stage")
    if not memory:
        return []
    keys = (
        ("start_allocated_bytes", "start"),
        ("end_allocated_bytes", "end"),
        ("peak_allocated_bytes", "peak"),
        ("alloc_bytes", "allocated"),
        ("freed_bytes", "freed"),
        ("peak_reserved_bytes", "reserved peak"),
    )
    columns = [Column("device", "device"), Column("stage", "stage")] + [
        Column(k, label, bytes_text) for k, label in keys
    ]
    relative = any(r["relative"] for r in memory)
    note = (
        "allocated at first -> last event, peak; bytes allocated, freed: moves of the\n"
        "  allocator's Total Allocated; reserve-only events count in reserved peak"
    )
    footer = "the trace has no allocator totals: levels are relative to its first event" if relative else ""
    return [Table("Memory per stage", columns, memory, note=note, footer=footer, index=2)]
