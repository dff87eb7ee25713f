"""The critical path of the replayed steps (profparse.analysis.replay_path): its bounds tile each step's time in
the loop, as traced and without the profiler, and without the profiler a GPU-bound run's path leaves the host."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import profparse
from profparse.analysis import replay as rp
from profparse.analysis import replay_path
from profparse.analysis.critical_path import BOUNDS
from profparse.outputs.summary import summary_data
from tests.conftest import REPO
from tests.test_replay import OP_NS, _cost, _steps

CLEAN = REPO.parent / "shared" / "traces" / "h200_pairs" / "clean_good.json.gz"


def _paths(b, folder: Path, op_ns: float) -> tuple[np.ndarray, np.ndarray]:
    """Per step, ns by bound on the replayed path and the replayed step in the loop."""
    folder.mkdir(parents=True, exist_ok=True)
    p = profparse.parse(b.write(folder / "t.json"))
    model = rp.build(p.raw.events, p.links, p.attribution)
    table = replay_path.bound_ns(p.raw.events, p.links, p.attribution, model, _cost(op_ns))
    return table[list(BOUNDS)].to_numpy(), rp.replay(model, _cost(op_ns))["step_ns"].to_numpy()


def test_a_host_bound_step_is_its_ops_and_adds_up(tmp_path: Path) -> None:
    """Ten 10 us ops 20 us apart, each launching a 2 us kernel: the host bounds the step, as traced and without
    the profiler, and the bounds add up to the step either way. Each op's cost is charged a quarter on each side
    of its start and end: half of it (2 us) leaves the op's own time on the path."""
    traced, step = _paths(_steps(2, sync=False), tmp_path / "a", 0.0)
    free, free_step = _paths(_steps(2, sync=False), tmp_path / "b", OP_NS)
    for by_bound, total in ((traced, step), (free, free_step)):
        assert np.allclose(by_bound.sum(axis=1), total, rtol=0, atol=1)
        shares = by_bound.sum(axis=0) / by_bound.sum()
        host = sum(shares[BOUNDS.index(b)] for b in ("python", "cpu_op", "launch"))
        assert host > 0.95, dict(zip(BOUNDS, shares.round(3), strict=True))
    cpu_op = BOUNDS.index("cpu_op")
    lost = traced[:, cpu_op] - free[:, cpu_op]
    assert np.allclose(lost, 10 * OP_NS / 2, rtol=0.25), lost


@pytest.mark.parametrize("op_ns", [0.0, OP_NS], ids=["as traced", "without the profiler"])
def test_a_gpu_bound_step_is_its_kernels_and_adds_up(tmp_path: Path, op_ns: float) -> None:
    """Ten 50 us kernels queued behind each other, a synchronize at the step's end: GPU compute bounds it."""
    by_bound, step = _paths(_steps(50, sync=True), tmp_path, op_ns)
    assert np.allclose(by_bound.sum(axis=1), step, rtol=0, atol=1)
    shares = by_bound.sum(axis=0) / by_bound.sum()
    assert shares[BOUNDS.index("gpu_compute")] > 0.9, dict(zip(BOUNDS, shares.round(3), strict=True))


@pytest.mark.skipif(not CLEAN.is_file(), reason="no ../shared/traces/h200_pairs")
def test_h200_clean_run_moves_from_cpu_op_toward_gpu_compute() -> None:
    """The clean H200 capture (GPU-bound without the profiler): its replayed path as traced reads as the critical
    path does (within 3 points per bound); without the profiler cpu_op loses share and GPU compute gains it."""
    parsed = profparse.parse(CLEAN)
    data = summary_data(parsed)["critical_path"]["without_profiler"]
    replay = parsed.table("replay")
    paths = replay[[f"path_{b}_ns" for b in BOUNDS]].to_numpy()
    assert np.allclose(paths.sum(axis=1), replay["without_profiler_ns"], rtol=0, atol=len(BOUNDS))
    assert data["total_ns"] == sum(data["bounds"].values()) and data["steps"] == len(replay) == 2
    free = {b: data["bounds"].get(b, 0) / data["total_ns"] for b in BOUNDS}

    path = parsed.table("critical_path")
    path = path[path["step"].isin(replay["step"])]
    ns = (path["end_ns"] - path["start_ns"]).groupby(path["bound"].astype(str)).sum()
    traced = {b: float(ns.get(b, 0)) / float(ns.sum()) for b in BOUNDS}
    model = rp.build(parsed.raw.events, parsed.links, parsed.attribution)
    same = replay_path.bound_ns(parsed.raw.events, parsed.links, parsed.attribution, model, np.zeros(5))
    same_share = same[list(BOUNDS)].sum() / same[list(BOUNDS)].to_numpy().sum()
    assert all(abs(same_share[b] - traced[b]) < 0.03 for b in BOUNDS), (same_share.round(3), traced)

    assert free["cpu_op"] < traced["cpu_op"] - 0.1, (free, traced)
    assert free["gpu_compute"] > traced["gpu_compute"] + 0.01, (free, traced)


def _check_tiles(path: Path) -> None:
    """The path's bounds add up to each steady step replayed without the profiler (rounding: 1 ns a bound)."""
    from tests.conftest import parsed

    table = parsed(path).replay
    if table.empty:
        return
    paths = table[[f"path_{b}_ns" for b in BOUNDS]].to_numpy()
    assert (paths >= 0).all(), path.name
    assert np.allclose(paths.sum(axis=1), table["without_profiler_ns"], rtol=0, atol=len(BOUNDS)), path.name


def test_the_path_tiles_each_step_on_sample_traces(sample_trace: Path) -> None:
    _check_tiles(sample_trace)


def test_the_path_tiles_each_step_on_shared_traces(shared_trace: Path) -> None:
    _check_tiles(shared_trace)


def test_running_sums_kept_every_few_pieces_give_the_same_path(
    sample_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path's host time per bound, summed on from a running sum kept every 2 pieces (and the innermost events
    painted 2 at a time), is bit for bit the path summed from the first piece (as one running sum over all)."""
    p = profparse.parse(sample_trace)
    model = rp.build(p.raw.events, p.links, p.attribution)
    if model is None:
        pytest.skip("no steady step")
    cost = _cost(OP_NS)
    whole = replay_path.bound_ns(p.raw.events, p.links, p.attribution, model, cost)
    assert len(model.host.knots) > 3 and whole[list(BOUNDS)].to_numpy().sum() > 0
    monkeypatch.setattr(replay_path, "_EVERY", 2)
    monkeypatch.setattr(rp, "BLOCK", 2)
    pieces = replay_path.bound_ns(p.raw.events, p.links, p.attribution, model, cost)
    assert pieces.equals(whole)


@pytest.mark.parametrize(("every", "span", "pieces"), [(4, 16, 0), (4, 16, 1), (4, 16, 63), (4, 16, 64), (8, 8, 97)])
def test_kept_sums_are_one_running_sum_over_every_piece(monkeypatch, every: int, span: int, pieces: int) -> None:
    """The walk's host time per bound code before any piece is, to the bit, one running sum over every piece (the
    sums kept every ``_EVERY`` pieces are made ``_SPAN`` pieces at a time; a lookup sums on from the one before)."""
    monkeypatch.setattr(replay_path, "_EVERY", every)
    monkeypatch.setattr(replay_path, "_SPAN", span)
    rng = np.random.default_rng(pieces)
    walk = object.__new__(replay_path._Walk)
    walk.labels = rng.integers(0, len(BOUNDS), pieces)
    walk.length = rng.random(pieces) * 10 ** rng.integers(0, 9, pieces)  # magnitudes that round differently
    walk.codes = np.arange(len(BOUNDS))[:, None]
    walk.every = walk._kept_sums()
    assert walk.every.shape == (len(BOUNDS), pieces // every + 1)
    for i in range(pieces):
        expected = [float(np.cumsum(np.where(walk.labels[:i] == c, walk.length[:i], 0.0))[-1]) if i else 0.0
                    for c in range(len(BOUNDS))]  # fmt: skip
        assert walk._cum(i).tolist() == expected, i
