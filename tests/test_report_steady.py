"""The report's headline is about the steady steps, with the warm-up shown apart (outputs/report/headline.py)."""

from __future__ import annotations

import pytest
from tracebuilder import AUTOGRAD, TraceBuilder

import profparse
from profparse.outputs.report import trace_payload

KERNEL_US, GAP_US, KERNELS = 92.0, 8.0, 10  # per stage: 10 kernels of 92 us, 8 us apart: 72 of 992 us idle
WARM_UP_GAP_US = 2_000_000.0  # the first step's forward waits 2 s between two kernels (autotuning on the host)


def stage_kernels(b: TraceBuilder, t0: float, tid: int, name: str, extra_gap: float = 0.0) -> float:
    """KERNELS kernels from ``t0``, each launched 3 us before it runs; ``extra_gap`` before the last one."""
    at = t0
    for i in range(KERNELS):
        at += extra_gap if i == KERNELS - 1 else 0.0
        b.launch(at - 3, at, KERNEL_US, tid=tid, name=name)
        at += KERNEL_US + GAP_US
    return at


def step(b: TraceBuilder, n: int, t0: float, extra_gap: float = 0.0) -> float:
    """A training step: forward (module), backward (autograd thread), optimizer, each one GPU span; returns its end."""
    fwd_end = t0 + 10 + extra_gap + KERNELS * (KERNEL_US + GAP_US)
    b.py("nn.Module: Net_0", t0 + 1, fwd_end - t0)
    stage_kernels(b, t0 + 10, 100, "gemm_fwd", extra_gap)
    bwd = fwd_end + 10
    b.op("autograd::engine::evaluate_function: MmBackward0", bwd - 5, KERNELS * (KERNEL_US + GAP_US) + 5, tid=AUTOGRAD)
    opt = stage_kernels(b, bwd, AUTOGRAD, "gemm_bwd") + 10
    b.annotation("Optimizer.step#AdamW.step", opt - 5, KERNELS * (KERNEL_US + GAP_US) + 5)
    end = stage_kernels(b, opt, 100, "adam") + 10
    b.annotation(f"ProfilerStep#{n}", t0, end - t0)
    return end


def test_headline_reads_the_steady_steps_and_shows_the_warm_up_apart(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for n in range(1, 5):
        t = step(b, n, t, WARM_UP_GAP_US if n == 1 else 0.0) + 50
    parsed = profparse.parse(b.write(tmp_path / "warm.json"))
    assert list(parsed.steps["steady"]) == [False, True, True, True]
    data = trace_payload(parsed)
    items = {h["key"]: h for h in data["headline"]}
    assert list(items) == ["step_time", "biggest_stage", "gpu_idle", "exposed_comm", "mfu", "top_warning"]

    # a steady step's GPU span: 30 kernels; idle: the gaps inside each stage and the two between stages (8 + 10 us)
    idle = 3 * (KERNELS - 1) * GAP_US + 2 * (GAP_US + 10)
    steady_idle = idle / (3 * KERNELS * KERNEL_US + idle)  # 8.4%
    assert items["gpu_idle"]["value"] == pytest.approx(steady_idle, rel=1e-6)
    assert items["gpu_idle"]["text"] == "8.4%" and "in the 3 steady steps" in items["gpu_idle"]["detail"]
    totals = data["summary"]["totals"]  # the whole trace, warm-up included: mostly idle
    whole_idle = sum(r["gpu_idle_ns"] for r in totals) / sum(
        r["gpu_idle_ns"] + r["gpu_busy_ns"] + r["gpu_overlap_ns"] for r in totals
    )
    assert whole_idle > 0.6

    steady_window = 3 * KERNELS * (KERNEL_US + GAP_US) + 30  # us
    assert items["step_time"]["value"] == pytest.approx(steady_window * 1000, rel=0.01)
    # the warm-up, apart: in the step time's detail, and its idle share in GPU idle's (2 s of 2.003 s idle)
    assert items["step_time"]["detail"].endswith("; median of 3 steady steps; step 1: warm-up, 2.0 s")
    assert items["step_time"]["warm_up"] == [1]
    assert items["gpu_idle"]["detail"].endswith("in the 3 steady steps; warm-up 99.9% idle")
    # the biggest stage by host wall in the steady steps is forward (1 ms each); with the warm-up it would be too,
    # but its figure and share are the steady steps'
    biggest = items["biggest_stage"]
    steady_rows = {r["stage"]: r for r in data["summary"]["steady_totals"]}
    assert biggest["value"] == max(r["host_wall_ns"] for r in steady_rows.values())
    assert biggest["value"] < 3 * 1.1e6 and "in the 3 steady steps" in biggest["detail"]


def test_without_warm_up_the_headline_reads_the_whole_trace(tmp_path):
    b = TraceBuilder()
    step(b, 1, 0.0)
    parsed = profparse.parse(b.write(tmp_path / "one.json"))
    items = {h["key"]: h for h in trace_payload(parsed)["headline"]}
    assert "steady" not in items["gpu_idle"]["detail"] and "warm-up" not in items["gpu_idle"]["detail"]
    assert items["step_time"]["detail"].endswith("; 1 step") and items["step_time"]["warm_up"] == []
