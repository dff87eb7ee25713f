"""PROFPARSE_PROFILE_PHASES (base/phase_clock): one line per phase only when asked, and the same tables."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pandas as pd
from conftest import REPO, assert_same_frame


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), **env}
    return subprocess.run([sys.executable, "-m", "profparse.cli.main", *args], capture_output=True, text=True, env=full)


def test_phase_clock_prints_each_phase_only_when_asked(tmp_path):
    """PROFPARSE_PROFILE_PHASES=1: one line per phase (wall, CPU, peak RSS); the phases fit in the run's wall time;
    without it, nothing extra on stderr and the same tables."""
    trace = REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"
    t0 = time.perf_counter()
    on = _cli(["parse", str(trace), "-o", str(tmp_path / "on"), "--quiet"], {"PROFPARSE_PROFILE_PHASES": "1"})
    wall = time.perf_counter() - t0
    off = _cli(["parse", str(trace), "-o", str(tmp_path / "off"), "--quiet"], {"PROFPARSE_PROFILE_PHASES": ""})
    assert on.returncode == 0 and off.returncode == 0, (on.stderr, off.stderr)
    assert "profparse-phase" not in off.stderr
    lines = [line.split() for line in on.stderr.splitlines() if line.startswith("profparse-phase ")]
    phases = {name: [float(x) for x in rest] for _, name, *rest in lines}
    main = ("startup+imports", "read", "link", "attribute", "tables+parquet")
    assert set(main) <= set(phases) and {"tables", "parquet"} <= set(phases)
    assert all(len(v) == 3 and min(v) >= 0 for v in phases.values())
    assert sum(phases[name][0] for name in main) <= wall
    peaks = [phases[name][2] for name in main]
    assert peaks == sorted(peaks) and peaks[0] > 0  # a high-water mark only rises
    for name in ("events", "ops", "stage_summary"):
        a = pd.read_parquet(tmp_path / "on" / f"{name}.parquet")
        b = pd.read_parquet(tmp_path / "off" / f"{name}.parquet")
        assert_same_frame(a, b)
