"""The speed-ups of issue 12 give the same numbers as the direct computations they replace."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
from conftest import REPO, SHARED_TRACES, parsed
from tracebuilder import TraceBuilder, training_step

from profparse.base.arrays import factorize_rows
from profparse.base.marks import STAGES
from profparse.tables.host_time import HOST_LEVELS, host_levels, host_segments, host_time
from profparse.trace.kinds import NULL

US = 1000


def _totals(p) -> dict[str, np.ndarray]:
    ht = host_time(p.raw.events, p.links, p.attribution)
    tot = ht[ht["scope"] == "total"]
    assert list(tot["stage_code"]) == list(range(len(STAGES)))
    return {"wall": tot["host_wall_ns"].to_numpy(), **{n: tot[f"{n}_ns"].to_numpy() for n in HOST_LEVELS}}


def test_host_time_totals_equal_one_union_over_all_pieces(shared_trace):
    """host_time sums the per-window unions for the total rows; a union over every piece at once is the same."""
    p = parsed(shared_trace)
    seg = host_segments(p.raw.events, p.links, p.attribution)
    direct = host_levels(seg, seg.stage, len(STAGES))
    totals = _totals(p)
    for name, values in direct.items():
        assert (totals[name] == values).all(), name
    assert totals["wall"].sum() > 0


def test_host_time_totals_by_hand_with_a_piece_across_a_step_boundary(tmp_path):
    """Two steps of known host time, plus an op of no stage ("other") on a second thread across the step boundary:
    each window gets its own part of it, the total all of it, once."""
    b = TraceBuilder()
    end = training_step(b, 1, 0)
    training_step(b, 2, end)
    # steps [0, 100) and [100, 200); a worker-thread op over [15, 120)
    b.op("aten::copy_", 15, 105, tid=300)
    b.op("aten::mm", 16, 1, tid=300)  # an op below it: the thread works (is not a Python-only monitor)
    p = parsed(b.write(tmp_path / "t.json"))
    stage = p.events.set_index("name")["stage"]
    assert stage["aten::copy_"] == "other" and stage["nn.Module: Linear_0"].unique().tolist() == ["forward"]
    totals = _totals(p)
    fwd, bwd, opt, other = (STAGES.index(s) for s in ("forward", "backward", "optimizer", "other"))
    # forward 2 x 20 (module frame [1, 21)), backward 2 x 30, optimizer 2 x 20, other 105 = 85 in step 1 + 20 in 2
    assert totals["wall"][other] == 105 * US
    assert totals["wall"][fwd] == 40 * US
    assert totals["wall"][bwd] == 60 * US
    assert totals["wall"][opt] == 40 * US
    ht = host_time(p.raw.events, p.links, p.attribution)
    steps = ht[ht["scope"] != "total"]
    in_step = steps[steps["stage_code"] == other].set_index("step")["host_wall_ns"]
    assert in_step[1] == 85 * US and in_step[2] == 20 * US
    assert steps.groupby("stage_code")["host_wall_ns"].sum().reindex(range(len(STAGES)), fill_value=0).tolist() == (
        totals["wall"].tolist()
    )
    # levels add up to the wall per stage
    assert (sum(totals[n] for n in HOST_LEVELS) == totals["wall"]).all()


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
        pd.testing.assert_frame_equal(a, b)


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


def _nearest_ancestor_walk(parent: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """The definition, one row at a time: walk up the parents until one has the kind."""
    out = np.full(len(parent), -1, dtype=np.int64)
    for row in range(len(parent)):
        p = parent[row]
        while p >= 0 and not is_kind[p]:
            p = parent[p]
        out[row] = p
    return out


def test_innermost_ancestor_level_sweep_equals_walking_up(shared_trace):
    """The level-by-level sweep gives each row's nearest ancestor of a kind, as walking up its parents does, on
    a real trace's tree (cpu ops, and a random sparse mask) and on a random deep tree."""
    from profparse.trace.link import depth_order, innermost_ancestor_of_kind, kind_mask, nest

    p = parsed(shared_trace)
    rng = np.random.default_rng(7)
    for mask in (kind_mask(p.raw.events, {"cpu_op"}), rng.random(len(p.raw.events)) < 0.01):
        got = innermost_ancestor_of_kind(p.links.parent, p.links.depth, mask)
        assert (got == _nearest_ancestor_walk(p.links.parent, mask)).all()
    # a random forest 200 deep on one thread: intervals nested by construction
    n = 3000
    starts = np.sort(rng.integers(0, 10**6, n))
    ends = starts + rng.integers(1, 10**5, n)
    parent, depth = nest(np.zeros(n, dtype=np.int64), starts, ends, np.arange(n))
    assert depth.max() > 5
    mask = rng.random(n) < 0.2
    assert (innermost_ancestor_of_kind(parent, depth, mask) == _nearest_ancestor_walk(parent, mask)).all()
    # the kept depth order is for that array only: a new array of the same length gets its own
    order, _ = depth_order(depth)
    other = depth[::-1].copy()
    order2, bounds2 = depth_order(other)
    assert (np.diff(other[order2]) >= 0).all() and not np.array_equal(order, order2)
    assert bounds2[-1] == n


def test_first_row_of_equals_the_pandas_lookup() -> None:
    """The first row of each key (repeated keys, keys never asked for, asked keys that are absent, empty inputs)
    is what pandas' ``duplicated`` (keep first) + ``reindex`` gave before."""
    from profparse.trace.link import first_row_of

    rng = np.random.default_rng(7)
    for n_rows, n_wanted in ((0, 5), (5, 0), (1, 3), (2_000, 3_000)):
        keys = rng.integers(0, 300, n_rows)
        rows = np.sort(rng.choice(10 * max(n_rows, 1), n_rows, replace=False))
        wanted = rng.integers(-5, 320, n_wanted)
        by_key = pd.Series(rows, index=keys)
        by_key = by_key[~by_key.index.duplicated(keep="first")]
        expected = by_key.reindex(wanted).fillna(-1).to_numpy().astype(np.int64)
        assert np.array_equal(first_row_of(keys, rows, wanted), expected)
    assert first_row_of(np.array([4, 4, 9]), np.array([10, 11, 12]), np.array([4, 9, 5])).tolist() == [10, 12, -1]


def test_piece_windows_from_cut_intervals_equal_step_window(shared_trace):
    """host_segments looks each piece's step window up by the cut interval it lies in; step_window over every
    piece gives the same windows."""
    from profparse.stages.attribute import step_window

    p = parsed(shared_trace)
    seg = host_segments(p.raw.events, p.links, p.attribution)
    expected = step_window(seg.start, p.attribution.steps)
    assert (expected >= 0).any()
    np.testing.assert_array_equal(seg.step_index, expected)


def test_factorize_sorted_equals_multiindex_factorize(shared_trace):
    """gpu_time's packed-key grouping numbers groups as a sorted factorize of the (step, gap, device) tuples."""
    p = parsed(shared_trace)
    events, step = p.raw.events, p.attribution.step
    rows = np.flatnonzero(events["kind"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy())
    gap = np.searchsorted(p.attribution.steps["start_ns"].to_numpy(), events["ts_ns"].to_numpy()[rows], "right")
    columns = (step[rows], np.where(step[rows] == NULL, gap, -1), events["device"].to_numpy()[rows])
    group, (first, _, last) = factorize_rows(*columns, sort=True)
    expected, uniques = pd.factorize(pd.MultiIndex.from_arrays(list(columns)), sort=True)
    assert len(uniques) >= 1
    np.testing.assert_array_equal(group, expected)
    np.testing.assert_array_equal(first, uniques.get_level_values(0).to_numpy().astype(np.int64))
    np.testing.assert_array_equal(last, uniques.get_level_values(2).to_numpy().astype(np.int64))


def test_repeated_hash_marks_exactly_the_repeated_rows(shared_trace):
    """quality's sort-then-lookup of repeated row hashes marks the rows that another row equals, as a DataFrame
    duplicated() over those columns does (rows listed twice stand in for duplicated events)."""
    from profparse.analysis import quality

    events = parsed(shared_trace).raw.events
    rows = np.flatnonzero((events["kind"] != "metadata").to_numpy())
    rows = np.sort(np.concatenate([rows, rows[::97]]))
    columns = [c for c in events.columns if c != "trace_index"]
    expected = events.iloc[rows][columns].duplicated(keep=False).to_numpy()
    assert expected.any() and not expected.all()
    np.testing.assert_array_equal(quality._repeated_hash(events, rows, columns), expected)
    unique = np.flatnonzero((events["kind"] != "metadata").to_numpy())
    np.testing.assert_array_equal(
        quality._repeated_hash(events, unique, columns),
        events.iloc[unique][columns].duplicated(keep=False).to_numpy(),
    )
