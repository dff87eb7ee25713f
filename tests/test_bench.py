"""scripts/bench.py: the decode baseline and floor count every event of the file; the ratios by hand."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

from conftest import REPO, SHARED_TRACES


def test_bench_decode_baseline_counts_every_event_of_the_file(tmp_path):
    """The decode-only baseline of scripts/bench.py decodes the whole events array (ROCm string args included)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    for trace in [REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz", *sorted(SHARED_TRACES.glob("mi*.json.gz"))]:
        plain = tmp_path / (trace.name[: -len(".gz")])
        plain.write_bytes(gzip.decompress(trace.read_bytes()))
        out = subprocess.run([sys.executable, "-c", bench.DECODE_CODE, str(plain)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout.split()[1]) == len(json.loads(plain.read_bytes())["traceEvents"])


def test_bench_floor_decodes_every_event_and_keeps_no_rows(tmp_path):
    """The floor of scripts/bench.py runs profparse's own reader over the whole file, in worker processes too,
    and builds no columns: what it measures is decoding alone."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    trace = REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"
    plain = tmp_path / trace.name[: -len(".gz")]
    plain.write_bytes(gzip.decompress(trace.read_bytes()))
    expected = len(json.loads(plain.read_bytes())["traceEvents"])
    assert plain.stat().st_size > 4 << 20  # several 1 MiB chunks, so two workers share them
    for workers in ("1", "2"):
        env = {**os.environ, "PROFPARSE_WORKERS": workers}
        command = [sys.executable, "-c", bench.FLOOR_CODE, str(plain)]
        out = subprocess.run(command, capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        words = out.stdout.split()
        assert (int(words[1]), int(words[3])) == (expected, 0), workers


def test_bench_ratios_by_hand():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    res = bench.SizeResult(size="100MB", bytes=10**8, events=1, runs=1, source="t")
    res.tools = {
        "profparse": {"ok": True, "seconds": 2.0, "cpu": 1.0, "all_seconds": [2.0]},
        "hta": {"ok": True, "seconds": 30.0, "cpu": 12.0, "all_seconds": [30.0]},
        "hta06": {"ok": False, "seconds": None, "cpu": None, "all_seconds": [50.0]},
    }
    assert bench._ratio(res, "hta", "profparse") == "**15.0x** (CPU 12.0x)"
    assert bench._ratio(res, "hta06", "profparse") == "> 25.0x (did not finish)"
    assert bench._ratio(res, "profparse", "decode") == "-"


def test_bench_side_by_side_row_by_hand():
    """One row per trace: each tool's median seconds (spread) and peak RSS over the JSON, then the ratios."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    res = bench.SizeResult(size="300MB", bytes=3 * 10**8, events=1_260_000, runs=2, load=[1.0, 1.5], source="a100")
    res.tools = {
        "profparse": {"ok": True, "seconds": 6.0, "cpu": 9.0, "all_seconds": [6.0, 6.4], "peak_rss": 4.5 * 10**8},
        "decode": {"ok": True, "seconds": 1.5, "cpu": 1.5, "all_seconds": [1.5, 1.5], "peak_rss": 9 * 10**8},
        "hta": {"ok": True, "seconds": 60.0, "cpu": 60.0, "all_seconds": [60.0, 62.0], "peak_rss": 18 * 10**8},
    }
    row = bench.side_by_side([res]).splitlines()[2].split(" | ")
    assert row[1:7] == [
        "300",
        "1.26 M",
        "6.0 s (6.0-6.4); 1.50x",
        "1.5 s (1.5-1.5); 3.00x",
        "60.0 s (60.0-62.0); 6.00x",
        "not run",
    ]
    assert row[7:10] == ["**4.0x** (CPU 6.0x)", "**10.0x** (CPU 6.7x)", "-"]
    assert row[10:] == ["2", "1.0, 1.5 |"]
