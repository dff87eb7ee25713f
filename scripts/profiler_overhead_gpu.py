"""Measure torch.profiler's own cost on a GPU machine (micro-loops) and a Llama training step unprofiled (blocks
synchronised only at their ends, medians, before and after the capture) then profiled (schedule wait=1, warmup=1,
active=3, record_shapes): configurations clean, tiny (launch-bound), between_bad (20 ms sleep after each step),
fp32_bad (no autocast, TF32 off) and fp32_good (TF32 on). Writes calibration.json and <config>.json.gz into --out.

    python scripts/profiler_overhead_gpu.py --device cuda --out DIR   (about 70 s on an H200)

Standalone (torch and transformers only, no profparse): it ran on the H200 device machine as is;
tests/data/h200_device/ holds what it wrote there (docs/without_profiler.md)."""

import argparse
import gzip
import json
import os
import shutil
import statistics
import time

import torch

LOOP_OPS, REPEATS = 400, 7


def loop(x):
    for _ in range(LOOP_OPS // 2):
        x = torch.add(x, 1.0)
        x = torch.mul(x, 0.5)


def fastest(fn, sync):
    best = float("inf")
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        sync()
        best = min(best, time.perf_counter_ns() - t0)
    return best / LOOP_OPS


def per_op(device, acts):
    x = torch.ones(256, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    loop(x)
    out = {"plain": fastest(lambda: loop(x), sync)}
    for name, kw in (
        ("profiled", {}),
        ("shapes", {"record_shapes": True}),
        ("shapes_stack", {"record_shapes": True, "with_stack": True}),
        ("shapes_memory", {"record_shapes": True, "profile_memory": True}),
    ):
        with torch.profiler.profile(activities=acts, **kw):
            loop(x)
            out[name] = fastest(lambda: loop(x), sync)
    return out


def micro(device):
    cpu_act = [torch.profiler.ProfilerActivity.CPU]
    res = {"cpu": per_op("cpu", cpu_act)}
    if device.startswith("cuda"):
        res["device"] = per_op(device, cpu_act + [torch.profiler.ProfilerActivity.CUDA])
    return res


def build(tiny, device, mode="clean"):
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        cfg = LlamaConfig(
            hidden_size=128,
            num_hidden_layers=4,
            intermediate_size=352,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=50304,
            attn_implementation="sdpa",
        )
        batch, seq = 2, 64
    else:
        cfg = LlamaConfig(
            hidden_size=768,
            num_hidden_layers=12,
            intermediate_size=2048,
            num_attention_heads=12,
            num_key_value_heads=12,
            vocab_size=50304,
            attn_implementation="sdpa",
        )
        batch, seq = 8, 512
    if device == "cpu":  # a quick dry run here
        cfg.num_hidden_layers, batch, seq = 2, 2, 64
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    dtype = torch.bfloat16
    autocast = not mode.startswith("fp32")
    torch.backends.cuda.matmul.allow_tf32 = mode == "fp32_good"

    def step():
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mode == "between_bad":
            time.sleep(0.02)

    return step


def run_config(name, tiny, device, out, blocks, per_block):
    step = build(tiny, device, name)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(blocks):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(per_block):
            step()
        sync()
        times.append((time.perf_counter_ns() - t0) / per_block)
    acts = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else []
    )
    path = os.path.join(out, f"{name}.json")
    with torch.profiler.profile(
        activities=acts, record_shapes=True, schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)
    ) as prof:
        for _ in range(5):
            step()
            prof.step()
    sync()
    prof.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    os.unlink(path)
    # after the capture, blocks again: the host may drift during the run
    after = []
    for _ in range(blocks):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(per_block):
            step()
        sync()
        after.append((time.perf_counter_ns() - t0) / per_block)
    return {"blocks_before": times, "blocks_after": after, "median_ns": statistics.median(times + after)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--blocks", type=int, default=6)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"}
    t = time.time()
    res["micro_before"] = micro(a.device)
    print("micro", json.dumps(res["micro_before"]), time.time() - t, flush=True)
    res["steps"] = {}
    for name, tiny in (
        ("clean", False),
        ("tiny", True),
        ("between_bad", False),
        ("fp32_bad", False),
        ("fp32_good", False),
    ):
        if a.device == "cpu" and name.startswith("fp32"):
            continue
        t = time.time()
        res["steps"][name] = run_config(name, tiny, a.device, a.out, a.blocks, 6)
        print(name, res["steps"][name]["median_ns"] / 1e6, "ms", time.time() - t, "s", flush=True)
        _write(res, a.out)
    res["micro_after"] = micro(a.device)
    _write(res, a.out)
    print(json.dumps(res["micro_after"]))


def _write(res, out):
    with open(os.path.join(out, "calibration.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
