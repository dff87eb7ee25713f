"""MFU, HFU and achieved TFLOP/s per (step, stage), step, stage and ``nn.Module`` (the ``efficiency`` table), from
the counted FLOPs (:mod:`profparse.analysis.flop_counts`) and the chosen peak (:mod:`profparse.analysis.peaks`).

Model FLOPs leave out ops recomputed in backward (activation checkpointing: ops under an ``nn.Module`` call that
runs in backward); hardware FLOPs include them. Each op is measured against the peak of its own math mode
(TF32, bf16, fp32 SIMT...: :mod:`profparse.analysis.math_modes`), so a row's peak is its FLOPs-weighted peak:
FLOPs / the time they take at their modes' peaks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.analysis.flop_counts import BACKWARD, STATUS
from profparse.analysis.math_modes import MODES
from profparse.analysis.modules import backward_nodes, call_tree, roll_up
from profparse.analysis.peaks import PeakChoice
from profparse.base.marks import STAGES
from profparse.tables.rows import stage_categorical
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN (no warning)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


MODE_FLOPS = tuple(f"flops_{m}" for m in MODES)  # per-mode hardware and model FLOPs: summed like the others
MODE_MODEL = tuple(f"model_{m}" for m in MODES)


def _with_modes(flops: pd.DataFrame) -> pd.DataFrame:
    """The flops rows as the efficiency sums read them: device work only, model FLOPs, counted and not counted
    time, and the hardware and model FLOPs of each math mode in a column of its own."""
    device = flops["on_device"].to_numpy()  # on a GPU trace, ops that launched no kernel ran on the CPU: no MFU
    counted = flops["status"].isin(STATUS[:2]).to_numpy()
    hw = np.where(device, flops["flops"].to_numpy(float), 0.0)
    model = np.where(flops["recompute"].to_numpy() | ~device, 0.0, flops["flops"].to_numpy(float))
    mode = flops["math_mode"].to_numpy(object)
    per_mode = {f"flops_{m}": np.where(mode == m, hw, 0.0) for m in MODES}
    per_mode |= {f"model_{m}": np.where(mode == m, model, 0.0) for m in MODES}
    # one new frame, not ``assign``: its float columns make one block, so each grouped sum below is one pass over
    # them, not one per column (the same sums: pandas adds each column on its own either way)
    return pd.DataFrame(
        {
            **{c: flops[c] for c in ("step", "stage", "status", "trace_index", "gpu_ns", "host_ns")},
            "flops": hw,
            "bytes": np.where(device, flops["bytes"], 0.0),
            "model": model,
            "counted_gpu": np.where(counted, flops["gpu_ns"], 0),
            "uncounted_gpu": np.where(counted, 0, flops["gpu_ns"]),
            "counted_host": np.where(counted, flops["host_ns"], 0),
            "uncounted_host": np.where(counted, 0, flops["host_ns"]),
            **per_mode,
        }
    )


def efficiency_table(parsed: ParsedTrace, flops: pd.DataFrame, peak: PeakChoice) -> pd.DataFrame:
    """Rows per (step, stage) (``scope`` stage), per step (``step``), per stage over the trace (``total``) and per
    module x stage (``module``): FLOPs, model FLOPs, bytes, counted and not counted GPU time, achieved TFLOP/s,
    intensity, and MFU and HFU against the peak of each op's math mode."""
    f = _with_modes(flops)
    measures = ("flops", "model", "bytes", "counted_gpu", "uncounted_gpu", "counted_host", "uncounted_host",
                *MODE_FLOPS, *MODE_MODEL)  # fmt: skip
    sums = list(measures)  # one grouped sum of all the columns (``agg`` with a dict makes one per column)
    by_stage = f.groupby(["step", "stage"], observed=False)[sums].sum().reset_index()
    by_step = f.groupby("step")[sums].sum().reset_index()
    by_total = f.groupby("stage", observed=False)[sums].sum().reset_index()
    summary = parsed.table("stage_summary")
    steps = parsed.steps
    busy = summary[summary["scope"] != "total"].groupby(["step", "stage"], observed=False)["gpu_busy_ns"].sum()
    total_busy = summary[summary["scope"] == "total"].set_index("stage")["gpu_busy_ns"]
    step_wall = pd.Series((steps["end_ns"] - steps["start_ns"]).to_numpy(), index=steps["step"].to_numpy())
    frames = []
    for scope, frame, time in (
        ("stage", by_stage, busy.reindex(pd.MultiIndex.from_frame(by_stage[["step", "stage"]])).to_numpy()),
        (
            "step",
            by_step.assign(stage=_no_stage(by_stage, len(by_step))),
            step_wall.reindex(by_step["step"]).to_numpy(),
        ),
        ("total", by_total.assign(step=NULL), total_busy.reindex(by_total["stage"]).to_numpy()),
    ):
        frames.append(
            frame.assign(scope=scope, module="", recompute=False, time_ns=np.nan_to_num(time).astype(np.int64))
        )
    modules = _module_rows(parsed, f)
    if len(modules):  # an empty frame's dtypes would count from pandas 3 on (and pandas 2.1+ warns)
        frames.append(modules)
    out = pd.concat(frames, ignore_index=True)
    out = out[(out["flops"] > 0) | (out["uncounted_gpu"] > 0) | (out["scope"] == "step")]
    out = out[~((out["scope"] == "step") & (out["step"] == NULL))]
    on_gpu = bool((flops["gpu_ns"] > 0).any())  # a CPU-only trace: achieved TFLOP/s over the counted ops' host time
    return _result(out, peak, on_gpu)


def _result(out: pd.DataFrame, peak: PeakChoice, on_gpu: bool) -> pd.DataFrame:
    """The table's columns from the summed rows: each row's peak is the FLOPs-weighted peak of its math modes
    (FLOPs / the time they take at each mode's peak), so MFU = model FLOPs' time at peak / the row's time."""
    hw, model = out["flops"].to_numpy(float), out["model"].to_numpy(float)
    time = out["time_ns"].to_numpy(float)
    counted_gpu = out["counted_gpu"].to_numpy(float)
    counted_host = out["counted_host"].to_numpy(float)
    roof_per_ns = np.array([peak.roof(m) * 1e3 for m in MODES])  # FLOPs per ns at each mode's peak
    mode_hw = out[list(MODE_FLOPS)].to_numpy(float)
    mode_model = out[list(MODE_MODEL)].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):  # ns the row's FLOPs take at peak (NaN: a mode without one)
        hw_at_peak = np.where(mode_hw > 0, mode_hw / roof_per_ns, 0.0).sum(axis=1)
        model_at_peak = np.where(mode_model > 0, mode_model / roof_per_ns, 0.0).sum(axis=1)
    main = np.array([*MODES, ""], dtype=object)[np.where(hw > 0, mode_hw.argmax(axis=1), len(MODES))]
    roofs = np.where(mode_hw > 0, roof_per_ns, np.inf)
    lowest, highest = roofs.min(axis=1, initial=np.inf), np.where(mode_hw > 0, roof_per_ns, -np.inf).max(axis=1)
    one_roof = (hw > 0) & (lowest == highest)  # one mode, or --peak-tflops: that peak, exactly
    row_peak = np.where(one_roof, lowest / 1e3, ratio(hw, hw_at_peak) / 1e3)
    result = pd.DataFrame(
        {
            "scope": out["scope"].to_numpy(),
            "step": out["step"].to_numpy(np.int64),
            "stage": pd.Categorical(out["stage"].astype(object).where(out["stage"].notna(), None), categories=STAGES),
            "module": out["module"].to_numpy(),
            "recompute": out["recompute"].to_numpy(bool),
            "flops": hw,
            "model_flops": model,
            "bytes": out["bytes"].to_numpy(float),
            "counted_gpu_ns": counted_gpu.astype(np.int64),
            "not_counted_gpu_ns": out["uncounted_gpu"].to_numpy(np.int64),
            "counted_host_ns": counted_host.astype(np.int64),
            "not_counted_host_ns": out["uncounted_host"].to_numpy(np.int64),
            "time_ns": time.astype(np.int64),
            "achieved_tflops": ratio(hw, counted_gpu if on_gpu else counted_host) / 1e3,
            "intensity": ratio(hw, out["bytes"].to_numpy(float)),
            "mfu": np.where(hw > 0, ratio(model_at_peak, time), np.nan),  # no FLOPs counted: unknown, not 0%
            "hfu": np.where(hw > 0, ratio(hw_at_peak, time), np.nan),
            "math_mode": main,
            "peak_tflops": row_peak,
        }
    )
    return result.reset_index(drop=True)


def _no_stage(by_stage: pd.DataFrame, rows: int) -> pd.Categorical:
    """A stage column of ``rows`` missing values, of the stage rows' own categories: concatenated with them it
    stays categorical on every pandas (an all-NA object column made pandas 2.1+ warn and pandas 3 give objects)."""
    return pd.Categorical([None] * rows, categories=by_stage["stage"].cat.categories)


def _module_rows(parsed: ParsedTrace, flops: pd.DataFrame) -> pd.DataFrame:
    """FLOPs and counted GPU time per (module, stage, recompute), inclusive of sub-modules (as ``modules``).

    Forward ops count for the innermost ``nn.Module`` call around them; ops inside a backward node for the call
    around the node's forward op (same sequence number), as :mod:`profparse.analysis.modules` does for time."""
    events, links, attribution = parsed.raw.events, parsed.links, parsed.attribution
    tree = call_tree(events, links)
    columns = ["step", "stage", "module", "recompute", "flops", "model", "bytes", "counted_gpu", "uncounted_gpu",
               "counted_host", "uncounted_host", *MODE_FLOPS, *MODE_MODEL]  # fmt: skip
    if tree is None or flops.empty:
        return pd.DataFrame({c: [] for c in columns})
    calls, inner, call_pos, up, level = tree.calls, tree.inner, tree.call_pos, tree.up, tree.level
    _, node_call, node_of = backward_nodes(events, links, inner, call_pos)

    rows = np.searchsorted(events["trace_index"].to_numpy(), flops["trace_index"].to_numpy())
    counted = flops["status"].isin(STATUS[:2]).to_numpy()
    rows, f = rows[counted], flops[counted]
    fwd_call = np.where(inner[rows] >= 0, call_pos[np.maximum(inner[rows], 0)], -1)
    in_node = (fwd_call < 0) & (node_of[rows] >= 0)
    bwd_call = np.full(len(rows), -1, dtype=np.int64)
    bwd_call[in_node] = node_call[node_of[rows[in_node]]]

    def per_call(target: np.ndarray, values: np.ndarray) -> np.ndarray:
        ok = target >= 0
        return np.bincount(target[ok], weights=values[ok], minlength=len(calls)).astype(np.int64)

    measures = {"flops": f["flops"].to_numpy(float), "bytes": f["bytes"].to_numpy(float),
                "counted_gpu": f["gpu_ns"].to_numpy(float), "counted_host": f["host_ns"].to_numpy(float),
                **{c: f[c].to_numpy(float) for c in MODE_FLOPS}}  # fmt: skip
    fwd = roll_up({k: per_call(fwd_call, v) for k, v in measures.items()}, up, level)
    bwd = roll_up({k: per_call(bwd_call, v) for k, v in measures.items()}, up, level)
    names = events["name"].cat.categories[events["name"].cat.codes.to_numpy()[calls]]
    names = np.asarray(pd.Index(names).astype(str).str.removeprefix("nn.Module: "), dtype=object)
    call_stage = attribution.stage[calls].astype(np.int64)
    frames = [
        pd.DataFrame({"module": names, "stage": call_stage, "recompute": call_stage == BACKWARD, **fwd}),
        pd.DataFrame({"module": names, "stage": BACKWARD, "recompute": False, **bwd}),
    ]
    rows_out = pd.concat(frames, ignore_index=True)
    rows_out = rows_out[(rows_out["flops"] > 0) | (rows_out["counted_gpu"] > 0) | (rows_out["counted_host"] > 0)]
    out = rows_out.groupby(["module", "stage", "recompute"], sort=False).sum().reset_index()
    out["model"] = np.where(out["recompute"], 0, out["flops"])
    for hw, model in zip(MODE_FLOPS, MODE_MODEL, strict=True):
        out[model] = np.where(out["recompute"], 0, out[hw])
    return out.assign(
        step=NULL,
        stage=stage_categorical(out["stage"].to_numpy()),
        uncounted_gpu=0,
        uncounted_host=0,
        scope="module",
        time_ns=out["counted_gpu"],
    )
