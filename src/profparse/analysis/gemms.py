"""Matmul shapes (batch, M, N, K, dtype, math mode): count, FLOPs, GPU time, achieved TFLOP/s and % of the peak of
their math mode (the ``gemms`` table), from the counted matmul-family ops of the ``flops`` table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profparse.analysis.efficiency import ratio
from profparse.analysis.flops import gemm_dims
from profparse.analysis.peaks import PeakChoice
from profparse.trace.kinds import NULL


def gemm_table(events: pd.DataFrame, flops: pd.DataFrame, peak: PeakChoice) -> pd.DataFrame:
    """Counted matmul-family ops grouped by (batch, M, N, K, dtype, math mode): count, FLOPs, GPU time, TFLOP/s,
    the peak of the math mode, % of it."""
    keys = ["batch", "m", "n", "k", "dtype", "math_mode"]
    columns = [*keys, "count", "flops", "gpu_ns", "achieved_tflops", "peak_tflops", "pct_of_peak"]
    mm = flops[(flops["status"] == "counted") & (flops["family"] == "matmul")]
    if mm.empty or "input_dims" not in events.columns:
        return pd.DataFrame({c: [] for c in columns})
    rows = np.searchsorted(events["trace_index"].to_numpy(), mm["trace_index"].to_numpy())
    cols = [events[c] for c in ("name", "input_dims", "input_types")]
    codes = zip(*(c.cat.codes.to_numpy()[rows].tolist() for c in cols), strict=True)
    cache: dict[tuple, tuple | None] = {}
    shapes = []
    for key in codes:  # a handful of distinct shapes: parse each once
        if key not in cache:
            texts = [None if k < 0 else c.cat.categories[k] for k, c in zip(key, cols, strict=True)]
            cache[key] = gemm_dims(*texts)
        shapes.append(cache[key] or (NULL,) * 4)
    shape = np.array(shapes, dtype=np.int64).reshape(-1, 4)
    g = mm.assign(batch=shape[:, 0], m=shape[:, 1], n=shape[:, 2], k=shape[:, 3], count=1)
    out = g.groupby(keys, sort=False)[["count", "flops", "gpu_ns"]].sum().reset_index()
    out["achieved_tflops"] = ratio(out["flops"].to_numpy(float), out["gpu_ns"].to_numpy(float)) / 1e3
    out["peak_tflops"] = peak.roofs(out["math_mode"])
    out["pct_of_peak"] = 100 * out["achieved_tflops"] / out["peak_tflops"]
    return out.sort_values(["gpu_ns", "flops"], ascending=False, kind="stable")[columns].reset_index(drop=True)
