"""Runtime and driver calls per stage (issue 9 part 3): the ``runtime_calls`` table, its checks and summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_TRACES, parsed
from tracebuilder import AUTOGRAD, TraceBuilder

import profparse
from profparse.analysis.runtime import call_class
from profparse.outputs.summary import render_summary

MI300X = SHARED_TRACES / "mi300x_resnet18_train.json.gz"


def _runtime(b: TraceBuilder, name: str, ts: float, dur: float, tid: int = 100) -> None:
    b.span(name, ts, dur, "cuda_runtime", tid)


def _churn_trace(tmp_path: Path, *, mallocs_in_step: bool = True) -> Path:
    """One step: forward cudaMalloc 3 us, backward 2x cudaFree 5 us, optimizer cudaStreamSynchronize 4 us;
    outside the step a cudaMalloc of 7 us (model set-up)."""
    b = TraceBuilder()
    b.op("aten::empty", 0, 10)
    _runtime(b, "cudaMalloc", 1, 7)
    b.annotation("ProfilerStep#1", 20, 100)
    b.py("nn.Module: Linear_0", 21, 20)
    b.op("aten::linear", 22, 15)
    if mallocs_in_step:
        _runtime(b, "cudaMalloc", 23, 3)
    b.launch(28, 30, 5, name="gemm_fwd")
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 50, 30, tid=AUTOGRAD)
    b.op("AddmmBackward0", 51, 25, tid=AUTOGRAD)
    if mallocs_in_step:
        _runtime(b, "cudaFree", 52, 5, tid=AUTOGRAD)
        _runtime(b, "cudaFree", 60, 5, tid=AUTOGRAD)
    b.launch(66, 68, 5, tid=AUTOGRAD, name="gemm_bwd")
    b.annotation("Optimizer.step#AdamW.step", 90, 20)
    b.op("aten::_foreach_add_", 91, 10)
    _runtime(b, "cudaStreamSynchronize", 92, 4)
    return b.write(tmp_path / "churn.json")


def test_call_classes_follow_the_names() -> None:
    cases = {
        "cudaMalloc": "malloc",
        "cudaMallocAsync": "malloc",
        "hipMalloc": "malloc",
        "hipHostMalloc": "malloc",
        "cuMemAlloc_v2": "malloc",
        "cudaFree": "free",
        "hipFree": "free",
        "cudaFreeHost": "free",
        "cudaStreamSynchronize": "sync",
        "cudaDeviceSynchronize": "sync",
        "hipDeviceSynchronize": "sync",
        "cudaMemcpyAsync": "memcpy",
        "hipMemcpyWithStream": "memcpy",
        "cudaMemsetAsync": "memset",
        "cudaLaunchKernel": "launch",
        "hipExtModuleLaunchKernel": "launch",
        "cudaFuncSetAttribute": "other",
        "cudaEventRecord": "other",
    }
    assert {name: call_class(name) for name in cases} == cases


def test_runtime_calls_ground_truth(tmp_path: Path) -> None:
    p = profparse.load(_churn_trace(tmp_path))
    calls = p.runtime_calls
    step = calls[calls["scope"] == "step"]
    got = {(r.stage, r.name): (r.count, r.total_ns, r.call_class) for r in step.itertuples()}
    assert got[("forward", "cudaMalloc")] == (1, 3000, "malloc")
    assert got[("backward", "cudaFree")] == (2, 10_000, "free")
    assert got[("optimizer", "cudaStreamSynchronize")] == (1, 4000, "sync")
    assert got[("forward", "cudaLaunchKernel")] == (1, 1000, "launch")
    assert got[("backward", "cudaLaunchKernel")] == (1, 1000, "launch")
    outside = calls[calls["scope"] == "outside_steps"]
    assert outside[["name", "count", "total_ns"]].astype(str).values.tolist() == [["cudaMalloc", "1", "7000"]]
    assert outside["step"].isna().all() and (step["step"] == 1).all()
    # share = time / the stage's host wall in the same scope and step
    summary = p.stage_summary
    wall = summary[summary["scope"] == "step"].set_index("stage")["host_wall_ns"]
    frees = step[step["name"] == "cudaFree"].iloc[0]
    assert frees["host_wall_ns"] == wall["backward"] > 0
    assert frees["share"] == pytest.approx(10_000 / wall["backward"])


def test_runtime_calls_add_up_to_the_events(tmp_path: Path) -> None:
    """Invariant: total rows = step rows + outside rows, and every host runtime event is counted once."""
    p = profparse.load(_churn_trace(tmp_path))
    calls = p.runtime_calls
    total = calls[calls["scope"] == "total"].groupby(["stage", "name"], observed=True)[["count", "total_ns"]].sum()
    parts = calls[calls["scope"] != "total"].groupby(["stage", "name"], observed=True)[["count", "total_ns"]].sum()
    assert total.sort_index().equals(parts.sort_index())
    ev = p.events
    runtime = ev[ev["kind"].isin(["cuda_runtime", "cuda_driver"])]
    assert int(total["count"].sum()) == len(runtime) == 7
    assert int(total["total_ns"].sum()) == int(runtime["dur_ns"].sum())


def test_checks_flag_allocator_churn_and_sync_in_steps(tmp_path: Path) -> None:
    warnings = profparse.load(_churn_trace(tmp_path)).warnings.set_index("check")
    churn = warnings.loc["allocator_churn"]
    assert (churn["count"], churn["value"]) == (3, 13_000)  # the set-up malloc outside the step is not churn
    assert churn["severity"] == "warning"  # 13 us of a 100 us step
    assert "cudaFree x2" in churn["message"] and "cudaMalloc x1" in churn["message"]
    sync = warnings.loc["sync_in_step"]
    assert (sync["count"], sync["value"], sync["severity"]) == (1, 4000, "warning")


def test_no_churn_row_when_allocations_happen_outside_steps(tmp_path: Path) -> None:
    warnings = profparse.load(_churn_trace(tmp_path, mallocs_in_step=False)).warnings
    assert "allocator_churn" not in set(warnings["check"])
    assert "sync_in_step" in set(warnings["check"])


def test_summary_shows_runtime_calls_section(tmp_path: Path) -> None:
    text = render_summary(profparse.load(_churn_trace(tmp_path)))
    section = text[text.index("Runtime calls per stage") :]
    backward = section[section.index("  backward") : section.index("  optimizer")]
    line = next(row for row in backward.splitlines() if "cudaFree (free)" in row)
    assert line.split()[-3] == "2"  # calls column


@pytest.mark.skipif(not MI300X.exists(), reason="shared MI300X trace not present")
def test_mi300x_summary_shows_hipfree_in_backward() -> None:
    p = parsed(MI300X)
    ev = p.events
    frees = ev[(ev["name"] == "hipFree") & (ev["stage"] == "backward") & (ev["kind"] == "cuda_runtime")]
    assert len(frees) == 910 and 2.5e9 < frees["dur_ns"].sum() < 2.7e9  # the finding, from the events
    calls = p.runtime_calls
    row = calls[(calls["scope"] == "total") & (calls["stage"] == "backward")].iloc[0]  # the biggest call first
    assert (row["name"], row["count"], row["total_ns"]) == ("hipFree", 910, frees["dur_ns"].sum())
    text = render_summary(p)
    section = text[text.index("Runtime calls per stage") :]
    first = section[section.index("  backward") :].splitlines()[0].split()
    assert first[:2] == ["backward", f"{frees['dur_ns'].sum() / 1e6:,.2f}"]
    assert first[3:6] == ["910", "hipFree", "(free)"]
    churn = p.warnings.set_index("check").loc["allocator_churn"]
    assert churn["severity"] == "warning" and churn["value"] > 2.6e9
    steps = calls[calls["scope"] == "step"]
    assert np.isin(steps["step"].dropna().unique(), p.steps["step"]).all()
