"""The profiler's own cost, and each step replayed without it (docs/without_profiler.md).

``torch.profiler`` adds host time to every event it records. Each recorded event is charged a cost by kind
(:data:`~profparse.analysis.replay.OVERHEAD_KINDS`): measured where profparse captured the trace (the trace's
``profparse_calibration`` field, basis ``calibrated``), else the documented defaults (basis ``default``). Where
the calibration holds training steps timed without the profiler (``unprofiled_step_ns``), the costs are scaled
so that the replay without them takes as long as those steps (:func:`costs`). The steady steps are replayed with
that cost taken out (:mod:`profparse.analysis.replay`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.analysis import replay as rp
from profparse.analysis import replay_path
from profparse.analysis.critical_path import BOUNDS
from profparse.base.formats import utilisation_text
from profparse.stages.attribute import Attribution
from profparse.trace.kinds import GPU_ACTIVITY_KINDS
from profparse.trace.link import Links, kind_mask

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

#: the trace's top-level field where profparse's capture stores what it measured (docs/without_profiler.md)
CALIBRATION_KEY = "profparse_calibration"
#: ns of host time the profiler adds per recorded event, by kind, on a CUDA trace: fitted on the 21 H200
#: captures of ``h200_pairs`` (torch 2.11, record_shapes on, CUPTI kernel tracing), "op" and "python" scaled
#: from CPU measurements, "memory" a guess (no memory-profiled GPU capture): see docs/without_profiler.md
DEFAULT_CUDA_NS = {"op_shapes": 4000.0, "op": 2400.0, "python": 1500.0, "runtime": 3000.0, "memory": 1000.0}
#: the same on a trace without GPU activity: a leaf aten op measured on a 2-core x86 CPU, torch 2.x
#: (0.88 us unprofiled, 1.22 profiled, 1.43 with record_shapes); "python" and "memory" guesses of that size
DEFAULT_CPU_NS = {"op_shapes": 550.0, "op": 340.0, "python": 300.0, "runtime": 340.0, "memory": 300.0}
#: the costs per event are scaled by at most this to meet the unprofiled steps: beyond it the steps timed were
#: not the profiled ones (another batch, another phase), and the estimate stays the model's
MAX_SCALE = 8.0
#: the median traced ``cudaLaunchKernel`` of the capture the CUDA defaults were chosen on (h200_pairs' clean_good;
#: its pairs' good steps: 4.6-6.7 us): a trace whose launches took longer ran on a slower host, whose profiler work
#: per event (host CPU work like the launch) took longer in proportion: the defaults are scaled by the ratio
REFERENCE_LAUNCH_NS = 5_040.0
#: the ratio is read only from this many launches in the steady steps, and kept within these bounds
MIN_LAUNCHES = 100
HOST_SPEED_BOUNDS = (0.5, 3.0)
_FIT_ROUNDS = 12  # bisection rounds: MAX_SCALE / 2**12 is within 0.2% of the scale
#: per bound, the ns of the step's critical path replayed without the profiler (they add up to its step)
PATH_COLUMNS = tuple(f"path_{b}_ns" for b in BOUNDS)
COLUMNS = (
    "step",
    "measured_ns",
    "replayed_ns",
    "loop_ns",
    "without_profiler_ns",
    "overhead_ns",
    "host_speed",
    *PATH_COLUMNS,
)


def per_event_ns(header: dict[str, Any], on_gpu: bool) -> tuple[np.ndarray, str]:
    """The cost per event kind (ns, in :data:`OVERHEAD_KINDS` order) and its basis: the trace's calibration
    where it has one, else the defaults for a GPU or a CPU trace."""
    defaults = DEFAULT_CUDA_NS if on_gpu else DEFAULT_CPU_NS
    calibration = header.get(CALIBRATION_KEY)
    measured = calibration.get("per_event_ns") if isinstance(calibration, dict) else None
    if isinstance(measured, dict) and measured:
        values = [_number(measured.get(k), defaults[k]) for k in rp.OVERHEAD_KINDS]
        return np.array(values, dtype=np.float64), "calibrated"
    return np.array([defaults[k] for k in rp.OVERHEAD_KINDS], dtype=np.float64), "default"


def unprofiled_step_ns(header: dict[str, Any]) -> float | None:
    """The mean of the training steps timed without the profiler where the trace was captured (the calibration's
    ``unprofiled_step_ns``), None without any."""
    calibration = header.get(CALIBRATION_KEY)
    steps = calibration.get("unprofiled_step_ns") if isinstance(calibration, dict) else None
    if not isinstance(steps, list):
        return None
    values = [_number(v, 0.0) for v in steps]
    values = [v for v in values if v > 0]
    return sum(values) / len(values) if values else None


def costs(model: rp.Model, header: dict[str, Any], on_gpu: bool) -> tuple[np.ndarray, str]:
    """The cost per event kind to replay ``model`` without the profiler, and its basis: :func:`per_event_ns`
    (the CUDA defaults scaled by :func:`host_speed`), scaled (by one factor for every kind) so that the replayed
    steady step meets the mean unprofiled step where the calibration timed some."""
    base, basis = per_event_ns(header, on_gpu)
    if basis == "default" and on_gpu:
        base = base * host_speed(model)
    target = unprofiled_step_ns(header)
    if target is None:
        return base, basis
    return base * fitted_scale(model, base, target), "calibrated"


def host_speed(model: rp.Model) -> float:
    """How much longer than on the host the CUDA defaults were fitted on the trace's host took per event: the
    median traced kernel launch over :data:`REFERENCE_LAUNCH_NS`, within :data:`HOST_SPEED_BOUNDS`; 1 with fewer
    than :data:`MIN_LAUNCHES` launches (a trace without CUDA launches, a HIP trace)."""
    if len(model.launches) < MIN_LAUNCHES:
        return 1.0
    lo, hi = HOST_SPEED_BOUNDS
    return float(np.clip(np.median(model.launches) / REFERENCE_LAUNCH_NS, lo, hi))


def fitted_scale(model: rp.Model, base: np.ndarray, target: float) -> float:
    """The factor on ``base`` whose replay's mean step is ``target`` (bisection: the step only shortens as more
    cost is taken out), within ``[0, MAX_SCALE]``."""
    lo, hi = 0.0, MAX_SCALE
    if rp.mean_step(model, base * hi) >= target:
        return hi
    if rp.mean_step(model, base * lo) <= target:
        return lo  # the unprofiled steps took as long as the profiled ones, or longer: nothing to take out
    for _ in range(_FIT_ROUNDS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rp.mean_step(model, base * mid) > target else (lo, mid)
    return (lo + hi) / 2


def _number(value: Any, default: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value) and value >= 0
    return float(value) if ok else default


def replay_table(
    events: pd.DataFrame, links: Links, attribution: Attribution, header: dict[str, Any], replay_model: rp.Model | None
) -> pd.DataFrame:
    """One row per steady step: its measured window, the window replayed unchanged, its time in a loop of steps
    (the later of host and GPU), the same without the profiler's cost, and that cost (``replay_model``: the
    steady steps' :func:`~profparse.analysis.replay.build`, shared with the findings' what-ifs)."""
    model = replay_model
    if model is None:
        return pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in COLUMNS})
    on_gpu = bool(kind_mask(events, GPU_ACTIVITY_KINDS).any())
    cost, _ = costs(model, header, on_gpu)
    _, basis = per_event_ns(header, on_gpu)
    scaled = basis == "default" and on_gpu and unprofiled_step_ns(header) is None  # else measured, or fitted
    speed = host_speed(model) if scaled else 1.0
    same = rp.replay(model, np.zeros(len(rp.OVERHEAD_KINDS)))
    path = replay_path.bound_ns(events, links, attribution, model, cost)
    without = rp.replay(model, cost)  # the path's replay
    paths = {f"path_{b}_ns": np.round(path[b].to_numpy()).astype(np.int64) for b in BOUNDS}
    return pd.DataFrame(
        {
            "step": same["step"].to_numpy(),
            "measured_ns": same["measured_ns"].to_numpy().astype(np.int64),
            "replayed_ns": np.round(same["host_ns"].to_numpy()).astype(np.int64),
            "loop_ns": np.round(same["step_ns"].to_numpy()).astype(np.int64),
            "without_profiler_ns": np.round(without["step_ns"].to_numpy()).astype(np.int64),
            "overhead_ns": np.round(same["step_ns"].to_numpy() - without["step_ns"].to_numpy()).astype(np.int64),
            "host_speed": np.full(len(same), speed),
            **paths,
        }
    )


#: steady steps whose longest is over this many times the shortest are uneven: the headline gives their range
UNEVEN = 1.5


def path_without_profiler(parsed: ParsedTrace) -> dict[str, Any]:
    """``critical_path.without_profiler``: the steady steps' ns on the critical path replayed without the
    profiler, by bound (summed over the steps), with its basis; empty without steady steps."""
    table = parsed.table("replay")
    if table.empty:
        return {}
    on_gpu = bool(kind_mask(parsed.raw.events, GPU_ACTIVITY_KINDS).any())
    _, basis = per_event_ns(parsed.header, on_gpu)
    basis = "calibrated" if unprofiled_step_ns(parsed.header) is not None else basis
    totals = {b: int(table[f"path_{b}_ns"].sum()) for b in BOUNDS}
    return {
        "steps": len(table),
        "basis": basis,
        "total_ns": sum(totals.values()),
        "bounds": {b: v for b, v in totals.items() if v},
    }


def without_profiler(parsed: ParsedTrace) -> dict[str, Any]:
    """``step_ns`` (mean steady step without the profiler), ``mfu`` on that basis, ``overhead_ns_per_step``,
    ``basis``, and the mean profiled step it compares with (``profiled_step_ns``: the same steps replayed as they
    were, each from the end of the one before, the later of host and GPU, so that it less ``step_ns`` is the
    overhead; a GPU-bound step's window alone misses the GPU work it left running); where the calibration timed
    steps without the profiler, their mean (``unprofiled_step_ns``); where the default costs were scaled by the
    trace's launch time, that factor (``host_speed``); empty without steady steps."""
    table = parsed.table("replay")
    if table.empty:
        return {}
    on_gpu = bool(kind_mask(parsed.raw.events, GPU_ACTIVITY_KINDS).any())
    _, basis = per_event_ns(parsed.header, on_gpu)
    unprofiled = unprofiled_step_ns(parsed.header)
    step = float(table["without_profiler_ns"].mean())
    out = {
        "step_ns": round(step),
        "mfu": _mfu(parsed, table),
        "overhead_ns_per_step": round(float(table["overhead_ns"].mean())),
        "basis": "calibrated" if unprofiled is not None else basis,
        "profiled_step_ns": round(float(table["loop_ns"].mean())),
    }
    shortest, longest = int(table["loop_ns"].min()), int(table["loop_ns"].max())
    if longest > UNEVEN * shortest:  # a mean of unlike steps is none of them: the text gives their range
        out["profiled_range_ns"] = [shortest, longest]
    if unprofiled is not None:
        out["unprofiled_step_ns"] = round(unprofiled)
    speed = float(table["host_speed"].iloc[0])
    if speed != 1.0:
        out["host_speed"] = round(speed, 3)  # the default costs' factor: the trace's launch time over the reference
    return out


def _mfu(parsed: ParsedTrace, table: pd.DataFrame) -> float | None:
    """The steps' MFU with each step's time the replayed one without the profiler (None: no MFU)."""
    eff = parsed.table("efficiency")
    steps = eff[eff["scope"] == "step"].set_index("step")
    if steps.empty or "mfu" not in steps:
        return None
    mfu = steps["mfu"].reindex(table["step"].to_numpy()).to_numpy(dtype=np.float64)
    scaled = mfu * table["measured_ns"].to_numpy() / np.maximum(table["without_profiler_ns"].to_numpy(), 1)
    scaled = scaled[np.isfinite(scaled)]
    return float(scaled.mean()) if len(scaled) else None


def without_profiler_text(data: dict[str, Any]) -> str:
    """The headline sentence: ``64.4 ms per step profiled, ~35.9 ms without the profiler, MFU 9.0%``; with
    ``(steps 115.6 to 1,076.1 ms)`` after ``profiled`` where the steps are uneven (``profiled_range_ns``)."""
    mfu = f", MFU {utilisation_text(data['mfu'])}" if data.get("mfu") is not None else ""
    profiled, step = data["profiled_step_ns"] / 1e6, data["step_ns"] / 1e6
    uneven = data.get("profiled_range_ns")
    spread = f" (steps {uneven[0] / 1e6:,.1f} to {uneven[1] / 1e6:,.1f} ms)" if uneven else ""
    return f"{profiled:,.1f} ms per step profiled{spread}, ~{step:,.1f} ms without the profiler{mfu}"


def without_profiler_basis(data: dict[str, Any]) -> str:
    """What the estimate rests on: ``its own cost ~28.5 ms per step; default costs per event, uncalibrated``."""
    basis = "calibrated at capture" if data["basis"] == "calibrated" else "default costs per event, uncalibrated"
    if data.get("host_speed"):
        basis = f"default costs per event x{data['host_speed']:.2f} (host speed), uncalibrated"
    if data.get("unprofiled_step_ns"):
        basis += f" ({data['unprofiled_step_ns'] / 1e6:,.1f} ms per step timed unprofiled)"
    return f"the profiler's own cost ~{data['overhead_ns_per_step'] / 1e6:,.1f} ms per step; {basis}"
