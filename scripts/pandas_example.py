#!/usr/bin/env python
"""Read profparse's Parquet output with pandas: where did each stage's time go?

profparse parse sample_traces/qwen2_tiny_cpu_marks.json.gz -o /tmp/tables
python scripts/pandas_example.py /tmp/tables
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    summary = pd.read_parquet(folder / "stage_summary.parquet", dtype_backend="numpy_nullable")
    ops = pd.read_parquet(folder / "ops.parquet", dtype_backend="numpy_nullable")
    kernels = pd.read_parquet(folder / "kernels.parquet", dtype_backend="numpy_nullable")

    totals = summary[summary["scope"] == "total"].set_index("stage")
    print("Share of host op time and GPU time per stage:")
    shares = pd.DataFrame(
        {
            "host ops %": 100 * totals["host_op_ns"] / max(int(totals["host_op_ns"].sum()), 1),
            "GPU %": 100 * totals["gpu_time_ns"] / max(int(totals["gpu_time_ns"].sum()), 1),
        }
    ).round(1)
    print(shares.to_string(), end="\n\n")

    steps = summary[summary["scope"] == "step"]
    print("Host wall time per step and stage (ms):")
    print((steps.pivot_table(index="step", columns="stage", values="host_wall_ns", observed=True) / 1e6).round(2))
    print()

    print("The 3 ops with the most self time in each stage (ms):")
    top = (
        ops.groupby(["stage", "name"], observed=True)["self_ns"].sum().div(1e6).round(3).reset_index()
        .sort_values(["stage", "self_ns"], ascending=[True, False]).groupby("stage", observed=True).head(3)
    )  # fmt: skip
    print(top.to_string(index=False))
    if len(kernels):
        print("\nGPU time per stage and launching op (ms):")
        by_op = kernels.groupby(["stage", "launch_op_name"], observed=True)["dur_ns"].sum().div(1e6).round(3)
        print(by_op.sort_values(ascending=False).head(10).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
