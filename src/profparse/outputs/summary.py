"""The stage summary users read: per stage totals, per step, top kernels and ops per stage.

``summary_data`` collects plain data from a :class:`~profparse.api.ParsedTrace`; the renderers only format it
(text for terminals, markdown, csv, json).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.analysis import report as analysis_report
from profparse.analysis.efficiency import summary_section as efficiency_section
from profparse.marks import STAGES
from profparse.outputs.formats import display, md_code, md_table, render_as
from profparse.outputs.formats import text_table as _table
from profparse.quality import gpu_devices
from profparse.trace.events import NULL

FORMATS = ("text", "json", "csv", "markdown")
HOST_COLUMNS = frozenset({"host_wall_ns", "host_op_ns"})
TOP_N = 5
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


def _top(frame: pd.DataFrame, value: str, n: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    if frame.empty:
        return {s: [] for s in STAGES}
    grouped = (
        frame.groupby(["stage", "name"], observed=True)[value]
        .agg(["sum", "count"])
        .reset_index()
        .sort_values(["stage", "sum"], ascending=[True, False], kind="stable")
    )
    for stage in STAGES:
        rows = grouped[grouped["stage"] == stage].head(n)
        total = float(frame.loc[frame["stage"] == stage, value].sum())
        out[stage] = [
            {
                "name": str(r.name),
                "count": int(r.count),
                "total_ns": int(r.sum),
                "share": (float(r.sum) / total) if total else 0.0,
            }
            for r in rows.itertuples(index=False)
        ]
    return out


def summary_data(parsed: Any, top: int = TOP_N) -> dict[str, Any]:
    """Everything the summary shows, as plain JSON-ready data."""
    summary = parsed.stage_summary
    totals = summary[summary["scope"] == "total"]
    per_step = summary[summary["scope"] == "step"]
    kernels = parsed.kernels
    ops = parsed.ops
    gpu_total = int(kernels["dur_ns"].sum()) if len(kernels) else 0
    steps = parsed.steps
    rules = parsed.kernels.groupby("stage_rule", observed=True)["dur_ns"].sum() if len(kernels) else pd.Series()
    op_rules = ops.groupby("stage_rule", observed=True)["self_ns"].sum() if len(ops) else pd.Series()

    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
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

    return {
        "trace": str(parsed.path),
        "events": int(len(parsed.raw.events)),
        "steps": {
            "count": int(len(steps)),
            "source": str(steps["source"].iloc[0]) if len(steps) else None,
            "numbers": [int(s) for s in steps["step"]] if len(steps) else [],
        },
        "devices": gpu_devices(parsed),
        "rank": parsed.rank,
        "gpu_activity_ns": gpu_total,
        "totals": records(totals),
        "per_step": records(per_step),
        "top_kernels": _top(kernels, "dur_ns", top),
        "top_ops": _top(ops, "self_ns", top),
        "gpu_time_by_rule": {str(k): int(v) for k, v in rules.items() if v},
        "op_time_by_rule": {str(k): int(v) for k, v in op_rules.items() if v},
        "warnings": parsed.warnings.to_dict("records"),
        "analyses": analysis_report.summary_sections(parsed),
        "efficiency": efficiency_section(parsed),
        "report": {
            "truncated": parsed.raw.report.truncated,
            "dropped": dict(parsed.raw.report.dropped),
        },
    }


def _ms(ns: Any) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:,.2f}"


def _bytes(n: Any) -> str:
    if not n:
        return "0"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def _cell(column: str, value: Any) -> str:
    if column.endswith("_ns"):
        return _ms(value)
    if column.endswith("_bytes"):
        return _bytes(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def _shorten(name: str, width: int = 72) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def render_text(data: dict[str, Any]) -> str:
    out = io.StringIO()
    steps = data["steps"]
    where = f"{steps['count']} steps ({steps['source']})" if steps["count"] else "no steps found"
    devices = ", ".join(display(d) for d in sorted(set(data["devices"]))) or "no GPU"
    rank = f", rank {data['rank']}" if data["rank"] is not None else ""
    out.write(f"profparse summary: {display(data['trace'])}\n  {data['events']:,} events, {where}, {devices}{rank}\n")
    if data["report"]["truncated"]:
        out.write("  WARNING: trace is truncated; summary covers the events before the cut\n")
    has_gpu = data["gpu_activity_ns"] > 0
    overlap = any(r.get("gpu_overlap_ns") for r in data["totals"])  # shown only where stages ran at once on a GPU
    columns = [(c, label) for c, label in TOTAL_COLUMNS if (has_gpu or c in HOST_COLUMNS)]
    columns = [(c, label) for c, label in columns if overlap or c != "gpu_overlap_ns"]
    out.write("\nStage totals (times in ms)\n")
    headers = ["stage"] + [label for _, label in columns]
    rows = [[r["stage"]] + [_cell(c, r[c]) for c, _ in columns] for r in data["totals"]]
    out.write(_table(headers, rows) + "\n")

    if data["per_step"]:
        out.write("\nPer step: host wall ms | GPU busy ms\n" if has_gpu else "\nPer step: host wall ms\n")
        by_step: dict[Any, dict[str, dict]] = {}
        for r in data["per_step"]:
            by_step.setdefault(r["step"], {})[r["stage"]] = r
        rows = []
        for step, stages in by_step.items():
            label = "outside" if step is None else str(step)
            cells = []
            for s in STAGES:
                r = stages.get(s)
                if r is None or (not r["host_wall_ns"] and not r["gpu_busy_ns"]):
                    cells.append("-")
                elif has_gpu:
                    cells.append(f"{_ms(r['host_wall_ns'])} | {_ms(r['gpu_busy_ns'])}")
                else:
                    cells.append(_ms(r["host_wall_ns"]))
            rows.append([label, *cells])
        out.write(_table(["step", *STAGES], rows) + "\n")

    for title, key in (("Top kernels (GPU time)", "top_kernels"), ("Top ops (host self time)", "top_ops")):
        if not any(data[key].values()):
            continue
        out.write(f"\n{title} per stage\n")
        for stage in STAGES:
            items = data[key].get(stage, [])
            if not items:
                continue
            out.write(f"  {stage}\n")
            for item in items:
                out.write(
                    f"    {_ms(item['total_ns']):>10} ms {item['share']:6.1%} {item['count']:>6}x  "
                    f"{_shorten(display(item['name']))}\n"
                )
    out.write(analysis_report.render_text(data.get("analyses")))
    out.write(_efficiency_text(data.get("efficiency")))
    if data["warnings"]:
        out.write("\nChecks\n")
        for w in data["warnings"]:
            out.write(f"  {display(w['severity']):<7}  {display(w['message'])}\n")
    if data["gpu_time_by_rule"] or data["op_time_by_rule"]:
        out.write(f"\nWhich rules decided ({'host op self time, GPU time' if has_gpu else 'host op self time'}; ms)\n")
        names = sorted(set(data["gpu_time_by_rule"]) | set(data["op_time_by_rule"]))
        rows = [[n, _ms(data["op_time_by_rule"].get(n, 0)), _ms(data["gpu_time_by_rule"].get(n, 0))] for n in names]
        headers = ["rule", "host ops", "GPU"]
        if not has_gpu:
            rows = [r[:2] for r in rows]
            headers = headers[:2]
        out.write(_table(headers, rows) + "\n")
    return out.getvalue()


def _efficiency_text(section: dict[str, Any] | None) -> str:
    """The "Efficiency" section: FLOPs, achieved TFLOP/s, MFU/HFU per stage, MFU per step, what was not counted."""
    if not section:
        return ""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def tf(x: float | None) -> str:
        return "-" if x is None else f"{x:,.3g}"

    basis = section["basis"]
    rows = [
        [r["stage"], f"{r['flops'] / 1e9:,.1f}", tf(r["achieved_tflops"]), pct(r["mfu"]), pct(r["hfu"]),
         _ms(r["counted_ns"]), _ms(r["not_counted_ns"])]
        for r in section["stages"]
    ]  # fmt: skip
    headers = ["stage", "GFLOPs", "TFLOP/s", "MFU", "HFU", f"counted {basis} ms", "not counted"]
    text = f"\nEfficiency ({display(section['peak']['note'])})\n" + _table(headers, rows) + "\n"
    if any(s["mfu"] is not None for s in section["steps"]):
        text += "  MFU per step (step window): " + ", ".join(f"{s['step']}: {pct(s['mfu'])}" for s in section["steps"])
        text += "\n"
    if section["not_counted"]:
        text += f"  Not counted (no FLOP formula or no shapes; {basis} ms):\n"
        for r in section["not_counted"]:
            text += f"    {_ms(r['time_ns']):>10} ms {r['count']:>6}x  {_shorten(display(r['name']))}\n"
    return text


def render_markdown(data: dict[str, Any]) -> str:
    lines = [f"# profparse summary: {md_code(Path(data['trace']).name)}", ""]
    headers = ["stage"] + [label for _, label in TOTAL_COLUMNS]
    lines += md_table(headers, [[r["stage"]] + [_cell(c, r[c]) for c, _ in TOTAL_COLUMNS] for r in data["totals"]])
    lines.append("")
    lines.append("Times in ms.")
    for title, key in (("Top kernels", "top_kernels"), ("Top ops", "top_ops")):
        lines += ["", f"## {title}", "", "| stage | name | count | ms | share |", "|---|---|---|---|---|"]
        for stage in STAGES:
            for item in data[key].get(stage, []):
                name = md_code(_shorten(display(item["name"])))
                lines.append(f"| {stage} | {name} | {item['count']} | {_ms(item['total_ns'])} | {item['share']:.1%} |")
    lines += analysis_report.render_markdown(data.get("analyses"))
    return "\n".join(lines) + "\n"


def render_csv(data: dict[str, Any]) -> str:
    frame = pd.DataFrame(data["per_step"] + [{**r, "step": "total"} for r in data["totals"]])
    return frame.to_csv(index=False)


def render(data: dict[str, Any], fmt: str = "text") -> str:
    return render_as(data, fmt, {"text": render_text, "markdown": render_markdown, "csv": render_csv})


def render_summary(parsed: Any, fmt: str = "text", top: int = TOP_N) -> str:
    """Summary of one parsed trace in the given format."""
    return render(summary_data(parsed, top=top), fmt)
