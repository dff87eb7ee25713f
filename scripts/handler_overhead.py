"""What ``profparse.on_trace_ready`` keeps the training loop waiting per profiling cycle, against torch's own
``tensorboard_trace_handler`` (docs/integrations.md): a tiny MLP on CPU, 3 active steps per cycle. Also the
whole loop's time per cycle (it includes what the handler defers to the steps after a cycle: the calibration's
timing, and with ``background=False`` the analysis) and the first cycle's time in the handler.

    python scripts/handler_overhead.py [--cycles 8]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import profparse


def timed(handler: Callable, seconds: list[float]) -> Callable:
    def call(prof: object) -> None:
        started = time.perf_counter()
        handler(prof)
        seconds.append(time.perf_counter() - started)

    return call


def run_loop(handler: Callable, cycles: int) -> float:
    """The loop's wall time (s)."""
    started = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = schedule(wait=1, warmup=1, active=3, repeat=cycles)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=handler) as prof:
        for _ in range(5 * cycles):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    return time.perf_counter() - started


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8)
    args = parser.parse_args()
    cases = {
        "tensorboard_trace_handler(use_gzip=True)": lambda d: tensorboard_trace_handler(d, use_gzip=True),
        "tensorboard_trace_handler()": lambda d: tensorboard_trace_handler(d),
        "on_trace_ready() background": lambda d: profparse.on_trace_ready(d, quiet=True),
        "on_trace_ready(calibrate=False) background": lambda d: profparse.on_trace_ready(
            d, quiet=True, calibrate=False
        ),
        "on_trace_ready(report=True) background": lambda d: profparse.on_trace_ready(d, report=True, quiet=True),
        "on_trace_ready(background=False)": lambda d: profparse.on_trace_ready(d, background=False, quiet=True),
        "on_trace_ready(background=False, calibrate=False)": lambda d: profparse.on_trace_ready(
            d, background=False, quiet=True, calibrate=False
        ),
        "on_trace_ready(report=True, background=False)": lambda d: profparse.on_trace_ready(
            d, report=True, background=False, quiet=True
        ),
    }
    for name, make in cases.items():
        with tempfile.TemporaryDirectory() as folder:
            handler, seconds = make(folder), []
            cpu_before = children_cpu()
            wall = run_loop(timed(handler, seconds), args.cycles)
            if hasattr(handler, "wait"):
                assert handler.wait() == 0
            worker = (children_cpu() - cpu_before) / args.cycles
            size = sum(p.stat().st_size for p in Path(folder).rglob("*.json*")) / args.cycles
            print(
                f"{name:48s} in the loop: median {statistics.median(seconds) * 1e3:7.1f} ms "
                f"(min {min(seconds) * 1e3:.1f}, max {max(seconds) * 1e3:.1f}, first {seconds[0] * 1e3:.1f}); "
                f"loop {wall / args.cycles * 1e3:.0f} ms/cycle; "
                f"background CPU {worker:.2f} s/cycle; trace {size / 1e3:.0f} kB"
            )


if __name__ == "__main__":
    main()
