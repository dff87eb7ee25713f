"""The summary's "Efficiency" section: FLOPs, achieved TFLOP/s, MFU/HFU per stage, MFU per step, and the ops not
counted (from the ``efficiency`` and ``flops`` tables, :mod:`profparse.analysis.efficiency`; docs/efficiency.md)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.analysis.flop_counts import STATUS
from profparse.base.arrays import text_order
from profparse.base.formats import STEP_ROWS, Column, Table, ms_text, utilisation_text

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace


def efficiency_data(parsed: ParsedTrace, top: int = 5) -> dict[str, Any]:
    """The section's data: per stage totals, MFU per step, the peak used, and
    the ops whose GPU (or, on CPU traces, host) time has no FLOP formula."""
    eff, flops, peak = parsed.table("efficiency"), parsed.table("flops"), parsed.value("peak")
    if flops.empty or not (flops["flops"] > 0).any():
        return {}

    def num(value: Any) -> float | None:
        return None if value is None or pd.isna(value) else float(value)

    totals = eff[eff["scope"] == "total"]
    steps = eff[eff["scope"] == "step"]
    on_gpu = bool((flops["gpu_ns"] > 0).any())
    uncounted = flops[flops["status"].isin(STATUS[2:4])]  # no formula, no shapes (not the wrappers around ops)
    time = "gpu_ns" if on_gpu else "host_ns"
    worst = uncounted.groupby("name", observed=True)[time].agg(["sum", "size"])
    worst = worst.iloc[np.lexsort((text_order(worst.index), -worst["sum"].to_numpy()))]  # equal times by name
    return {
        "peak": {
            "tflops": num(peak.tflops),
            "dtype": peak.dtype,
            "device": peak.device,
            "note": peak.note,
            "basis": peak.basis,  # how each op's peak was chosen: its math mode, --peak-tflops, "" (no MFU)
            "modes": [
                {"mode": mode, "tflops": num(value), "flops_share": float(peak.mode_share.get(mode, 0.0))}
                for mode, value in peak.mode_tflops.items()
            ],
        },
        "stages": [
            {
                "stage": str(r.stage),
                "flops": float(r.flops),
                "model_flops": float(r.model_flops),
                "achieved_tflops": num(r.achieved_tflops),
                "mfu": num(r.mfu),
                "hfu": num(r.hfu),
                "math_mode": str(r.math_mode),
                "peak_tflops": num(r.peak_tflops),
                "counted_ns": int(r.counted_gpu_ns if on_gpu else r.counted_host_ns),
                "not_counted_ns": int(r.not_counted_gpu_ns if on_gpu else r.not_counted_host_ns),
            }
            for r in totals.itertuples()
            if r.flops > 0 or r.not_counted_gpu_ns > 0 or r.not_counted_host_ns > 0
        ],
        "steps": [{"step": int(r.step), "flops": float(r.flops), "mfu": num(r.mfu)} for r in steps.itertuples()],
        "not_counted": [
            {"name": str(name), "count": int(row["size"]), "time_ns": int(row["sum"])}
            for name, row in worst.head(top).iterrows()
            if row["sum"] > 0
        ],
        "basis": "GPU" if on_gpu else "host",
    }


def _gflops(x: Any) -> str:
    return f"{x / 1e9:,.1f}"


def efficiency_tables(data: dict[str, Any]) -> list[Table]:
    """Per stage efficiency; MFU per step (where known); the ops not counted (none without counted FLOPs)."""
    section = data.get("efficiency")
    if not section:
        return []
    basis = section["basis"]
    columns = [
        Column("stage", "stage"),
        Column("flops", "GFLOPs", _gflops),
        Column("achieved_tflops", "TFLOP/s", lambda x: "-" if x is None else f"{x:,.3g}"),
        Column("mfu", "MFU", utilisation_text),
        Column("hfu", "HFU", utilisation_text),
        Column("math_mode", "mode"),
        Column("peak_tflops", "peak", lambda x: "-" if x is None else f"{x:,.4g}"),
        Column("counted_ns", f"counted {basis}", ms_text),
        Column("not_counted_ns", "not counted", ms_text),
    ]
    peak_basis = section["peak"].get("basis")
    shown = peak_basis and peak_basis != "--peak-tflops"  # the note already names --peak-tflops
    peak = f"peak: {section['peak']['note']}" + (f"; {peak_basis}" if shown else "")
    footer = textwrap.fill(peak, width=98, subsequent_indent="  ")  # a terminal line: the renderer indents by 2
    out = [Table("Efficiency", columns, section["stages"], note="ms", footer=footer)]
    if any(s["mfu"] is not None for s in section["steps"]):
        mfu = Column("mfu", "MFU", utilisation_text)
        step_columns = [Column("step", "step"), Column("flops", "GFLOPs", _gflops), mfu]
        note = "model FLOPs / (step window x peak)"
        out.append(Table("MFU per step", step_columns, section["steps"], note=note, text_rows=STEP_ROWS))
    if section["not_counted"]:
        columns = [Column("time_ns", "ms", ms_text), Column("count", "calls", lambda n: f"{n:,}"), Column("name", "op")]
        note = f"no FLOP formula or no shapes; {basis} ms"
        out.append(Table("Not counted", columns, section["not_counted"], note=note, index=0, last_left=True))
    return out
