"""Findings of the GPU-only kinds on simulated traces (tests/advice_sim.py): each pattern is a small training
program run through a CUDA-semantics simulator, and the same program with the finding's fix applied gives the
step time the fix really saves. The finding must fire on the pattern, estimate that saving within 30%, and not
fire on the fixed program."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import profparse
from tests.advice_sim import Sim, run
from tests.tracebuilder import STREAM

STEPS = 4
TOLERANCE = 0.30
GEMM_DIMS = {"Input Dims": [[2048, 2048], [2048, 2048]], "Input type": ["float", "float"]}


def gpu_forward(s: Sim) -> None:
    for _ in range(4):
        s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")


def gpu_backward(s: Sim) -> None:
    for _ in range(4):
        s.op("aten::mm", 20, 500, "ampere_tf32_s1688gemm_fp32_128x128_nn")


def gpu_optimizer(s: Sim) -> None:
    s.op("aten::_foreach_add_", 30, 100, "multi_tensor_apply_kernel")


def _findings(path: Path, kind: str) -> list[dict]:
    table = profparse.load(path, cache=False).findings
    return [{**row, "evidence": json.loads(row["evidence"])} for row in table.to_dict("records") if row["kind"] == kind]


def check_pair(tmp_path: Path, kind: str, bad: dict, good: dict) -> dict:
    """Simulate the pattern and its fix; the finding fires on the pattern only, its saving within 30% of the
    simulated difference of mean step times. Returns the finding."""
    bad_trace, bad_us = run(tmp_path / "bad.json", STEPS, **{**PROGRAM, **bad})
    good_trace, good_us = run(tmp_path / "good.json", STEPS, **{**PROGRAM, **good})
    measured_ns = (bad_us - good_us) * 1000
    assert measured_ns > 0.05 * bad_us * 1000, "the fix must matter in the pattern"
    found = _findings(bad_trace, kind)
    assert len(found) >= 1, f"{kind} did not fire"
    estimate = sum(f["saving_ns_per_step"] for f in found)
    print(f"{kind}: estimate {estimate / 1e3:.1f} us, simulated saving {measured_ns / 1e3:.1f} us")
    assert estimate == pytest.approx(measured_ns, rel=TOLERANCE), (estimate, measured_ns)
    assert not _findings(good_trace, kind)
    clean = profparse.load(good_trace, cache=False).findings
    assert (clean["saving_share"] < 0.05).all(), clean[["kind", "saving_share"]]
    return found[0]


PROGRAM = {"forward": gpu_forward, "backward": gpu_backward, "optimizer": gpu_optimizer}


def test_sync_in_step(tmp_path) -> None:
    def synced(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")
            s.sync("cudaStreamSynchronize", op="aten::item")  # loss.item() after every matmul
            s.op("aten::mul", 150)  # host work that could have run while the GPU computed

    def unsynced(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")
            s.op("aten::mul", 150)

    found = check_pair(tmp_path, "sync_in_step", {"forward": synced}, {"forward": unsynced})
    assert found["stage"] == "forward"
    assert found["evidence"]["calls_per_step"] == 5  # and the sync that closes each simulated step
    assert found["message"].startswith("5 device synchronisations per step; the host work after them")
    assert found["evidence"]["top_events"][0]["name"] == "aten::item"


def test_launch_bound(tmp_path) -> None:
    def eager(s: Sim) -> None:
        for _ in range(100):
            s.op("aten::add", 30, 5, "vectorized_elementwise_kernel")

    def graphed(s: Sim) -> None:
        s.graph([5.0] * 100, "vectorized_elementwise_kernel")

    found = check_pair(tmp_path, "launch_bound", {"forward": eager}, {"forward": graphed})
    assert found["stage"] == "forward"
    assert found["evidence"]["median_kernel_us"] == 5.0


def test_fp32_matmul(tmp_path) -> None:
    """2048^3 matmuls: plain fp32 at ~18 TFLOP/s, TF32 at ~107 TFLOP/s (typical achieved figures on an A100)."""

    def fp32(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 950, "ampere_sgemm_128x64_nn", **GEMM_DIMS)

    def tf32(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 160, "ampere_tf32_s1688gemm_fp32_128x128_nn", **GEMM_DIMS)

    found = check_pair(tmp_path, "fp32_matmul", {"forward": fp32}, {"forward": tf32})
    assert found["stage"] == "forward"


def test_fp32_matmul_is_not_advised_where_tf32_is_not_faster(tmp_path) -> None:
    def fp32(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 950, "volta_sgemm_128x64_nn", **GEMM_DIMS)

    trace, _ = run(tmp_path / "v100.json", STEPS, fp32, gpu_backward, gpu_optimizer, device="Tesla V100-SXM2-16GB")
    assert not _findings(trace, "fp32_matmul")


def test_unpinned_copy(tmp_path) -> None:
    def prepare(kind: str):
        def before(s: Sim) -> None:
            s.copy(kind, 400)  # the batch to the GPU
            for _ in range(3):
                s.op("aten::embedding_prep", 100)  # host work before the first kernel

        return before

    found = check_pair(tmp_path, "unpinned_copy", {"before": prepare("Pageable")}, {"before": prepare("Pinned")})
    assert found["evidence"]["calls_per_step"] == 1
    # one copy, in the singular (it read "1 host-to-device copies per step ... block the host")
    assert found["message"].startswith("1 host-to-device copy per step from pageable memory blocks the host;")
    assert "the host work after it could overlap" in found["message"]


def test_allocator_churn(tmp_path) -> None:
    def churning(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")
            s.sync("cudaFree")  # frees a cached block: waits for the device
            s.runtime("cudaMalloc", 150)

    found = check_pair(tmp_path, "allocator_churn", {"forward": churning}, {})
    assert found["evidence"]["calls_per_step"] == 8


def test_exposed_communication(tmp_path) -> None:
    def allreduce_after(s: Sim) -> None:
        gpu_backward(s)  # the gradients are reduced once all are ready
        s.op("c10d::allreduce_", 10, 1000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=20, after=STREAM)

    def allreduce_overlapped(s: Sim) -> None:  # a bucket reduced while the rest of backward computes
        s.op("aten::mm", 20, 500, "ampere_tf32_s1688gemm_fp32_128x128_nn")
        s.op("c10d::allreduce_", 10, 1000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=20, after=STREAM)
        for _ in range(3):
            s.op("aten::mm", 20, 500, "ampere_tf32_s1688gemm_fp32_128x128_nn")

    found = check_pair(
        tmp_path, "exposed_communication", {"backward": allreduce_after}, {"backward": allreduce_overlapped}
    )
    assert found["stage"] == "backward"


def test_grad_zeroing(tmp_path) -> None:
    """``zero_grad(set_to_none=False)`` at the top of each step: a memset kernel per gradient, and the backward's
    AccumulateGrad adds into the zeroed gradients (an add kernel each); the fix drops the gradients instead (no
    memset, AccumulateGrad takes the new gradient). On a GPU with a caching allocator this is the saving the CPU
    pair cannot show cleanly (there the fix's fresh gradients cost page faults; docs/advice.md)."""

    def zero_grad(zeroing: bool):
        def before(s: Sim) -> None:
            span = s.b.annotation("Optimizer.zero_grad#AdamW.zero_grad", s.t, 0)
            t0 = s.t
            for _ in range(4):
                if zeroing:
                    s.op("aten::zero_", 10, 60, "vectorized_elementwise_kernel")
                else:
                    s.t += 1  # grad = None
            span["dur"] = s.t - t0

        return before

    def backward(adding: bool):
        def run_backward(s: Sim) -> None:
            gpu_backward(s)
            for _ in range(4):
                outer = s.b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", s.t, 0, s.tid)
                s.t += 1
                inner = s.b.op("torch::autograd::AccumulateGrad", s.t, 0, s.tid)
                t0 = s.t
                if adding:
                    s.op("aten::add_", 10, 80, "vectorized_elementwise_kernel")
                else:
                    s.t += 3  # takes the new gradient
                inner["dur"] = s.t - t0
                s.t += 1
                outer["dur"] = s.t - outer["ts"]

        return run_backward

    found = check_pair(
        tmp_path,
        "grad_zeroing",
        {"before": zero_grad(True), "backward": backward(True)},
        {"before": zero_grad(False), "backward": backward(False)},
    )
    # every gradient's memset and add, though the GPU still runs the forward when the host starts the backward
    assert found["evidence"]["zeroing_ops_per_step"] == found["evidence"]["accumulating_adds_per_step"] == 4


def test_allocator_churn_of_slow_frees(tmp_path) -> None:
    """Frees that take long after the device is done (ROCm's hipFree on the MI300X trace: 740 ms per step, the GPU
    busy 71 ms): the fix drops the calls, their own time with their wait."""

    def churning(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")
            s.sync("hipFree", own_us=400)

    found = check_pair(tmp_path, "allocator_churn", {"forward": churning}, {})
    assert found["evidence"]["calls_per_step"] == 4


def test_a_capture_of_host_activity_only_still_gets_its_findings(tmp_path) -> None:
    """``torch.profiler.profile(activities=[ProfilerActivity.CPU])`` on a GPU run: runtime calls (syncs among
    them) but no GPU activity. The syncs' saving (bounded by the time to the next GPU activity, none here: the
    step's end) indexed an empty array, and every verb exited 70."""
    from profparse.cli.main import main
    from profparse.trace.kinds import GPU_TRACK_KINDS

    def synced(s: Sim) -> None:
        for _ in range(4):
            s.op("aten::mm", 20, 300, "ampere_tf32_s1688gemm_fp32_128x128_nn")
            s.sync("cudaStreamSynchronize", op="aten::item")
            s.op("aten::mul", 150)

    full, _ = run(tmp_path / "full.json", STEPS, **{**PROGRAM, "forward": synced})
    doc = json.loads(full.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in GPU_TRACK_KINDS]
    host_only = tmp_path / "host_only.json"
    host_only.write_text(json.dumps(doc))
    parsed = profparse.load(host_only, cache=False)
    assert parsed.kernels.empty
    calls = _findings(host_only, "sync_in_step")
    assert calls and all(0 < f["saving_ns_per_step"] for f in calls)
    assert main(["summarize", str(host_only), "--no-cache", "-q"]) == 0
