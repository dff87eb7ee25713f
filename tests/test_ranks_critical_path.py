"""Collectives across ranks on the critical path: each rank's path time spent waiting for a later rank."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_ranks_late import LATE_RANK, LATE_STAGE, SLEEP_S, gloo_ddp_folder  # noqa: F401 - the shared capture

from profparse import ranks
from profparse.cli.main import main
from profparse.ranks import critical_path as rank_paths


def _brute_overlaps(s0, s1, w0, w1) -> list[tuple[int, int, int, int]]:
    return [
        (i, j, max(s0[i], w0[j]), min(s1[i], w1[j]))
        for j in range(len(w0))
        for i in range(len(s0))
        if min(s1[i], w1[j]) > max(s0[i], w0[j])
    ]


@pytest.mark.parametrize("seed", range(5))
def test_overlaps_equal_a_plain_double_loop(seed) -> None:
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(10_000, 80, replace=False))  # disjoint segments with gaps between them
    s0, s1 = cuts[0::2], cuts[1::2]
    starts = rng.integers(0, 10_000, 15)
    _, w0, w1 = rank_paths._disjoint(starts, starts + rng.integers(0, 900, 15))
    got = list(zip(*[a.tolist() for a in rank_paths.overlaps(s0, s1, w0, w1)], strict=True))
    assert sorted(got) == sorted(_brute_overlaps(s0, s1, w0, w1))


def _path(rows: list[tuple[int, str, str, int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step", "stage", "bound", "start_ns", "end_ns", "name"])


def test_only_waits_inside_the_collectives_are_kept() -> None:
    path = _path(
        [
            (1, "backward", "cpu_op", 0, 100, "aten::mm"),  # the rank's own work: never a wait
            (1, "backward", "python", 100, 300, "profparse.stage:backward"),
            (1, "backward", "cpu_op", 300, 350, "c10d::allreduce_"),  # a host collective op: can be a wait
            (1, "backward", "gpu_compute", 350, 400, "gemm"),
            (2, "forward", "gpu_comm", 400, 500, "ncclKernel_AllReduce"),
        ]
    )
    spans = pd.DataFrame({"start_ns": [50, 420], "end_ns": [380, 450]})
    got = rank_paths.waiting_segments(path, spans)
    assert got.values.tolist() == [[1, "backward", 100, 300], [1, "backward", 300, 350], [2, "forward", 420, 450]]


def _matches(starts: dict[int, list[int]], dur: int) -> pd.DataFrame:
    """``late.match``'s columns for collectives where rank r starts at ``starts[r][i]``: the others wait for the
    last to start."""
    rows = []
    for i in range(len(starts[0])):
        last = max(s[i] for s in starts.values())
        for r, s in starts.items():
            rows.append({"match": i, "rank": r, "start_ns": s[i], "end_ns": s[i] + dur, "waiting_ns": last - s[i]})
    return pd.DataFrame(rows)


def test_path_waits_name_the_late_rank_per_step_and_stage() -> None:
    """Rank 0 arrives at 1,000 and 5,000; rank 1 at 1,400 (step 1) and rank 2 at 5,700 (step 2): rank 0's path,
    a wait all along, holds 400 ns for rank 1 then 700 ns for rank 2."""
    matches = _matches({0: [1_000, 5_000], 1: [1_400, 5_300], 2: [1_100, 5_700]}, dur=1_000)
    rank0 = _path([(1, "backward", "python", 0, 4_000, "x"), (2, "backward", "sync_wait", 4_000, 8_000, "y")])
    rank1 = _path([(1, "backward", "python", 0, 4_000, "x"), (2, "backward", "cpu_op", 4_000, 8_000, "aten::mm")])
    spans = {r: matches[matches["rank"] == r] for r in (0, 1)}
    segments = [(r, rank_paths.waiting_segments(p, spans[r])) for r, p in ((0, rank0), (1, rank1))]
    got = rank_paths.path_waits(segments, matches)
    # rank 1 waited 400 ns for rank 2 in step 2, but its path was its own matmul then: not a wait on its path
    assert got.values.tolist() == [[0, 1, "backward", 1, 400], [0, 2, "backward", 2, 700]]
    data = rank_paths.path_wait_data(got)
    assert [(d["waited_rank"], d["wait_ns"], d["steps"], d["per_step_ns"]) for d in data] == [
        (1, 400, 1, 400.0),
        (2, 700, 1, 700.0),
    ]


def test_no_matches_no_waits() -> None:
    rank0 = _path([(1, "backward", "python", 0, 4_000, "x")])
    assert rank_paths.path_waits([(0, rank_paths.waiting_segments(rank0, None))], None).empty


# -- the real gloo DDP capture: rank 1 sleeps 400 ms at the start of each backward ------------------------------------


def _per_step(waits: pd.DataFrame, rank: int, stage: str) -> pd.Series:
    part = waits[(waits["rank"] == rank) & (waits["stage"] == stage)]
    return part.groupby("step")["wait_ns"].sum()


def test_the_on_time_rank_s_path_waits_for_the_sleeping_rank(gloo_ddp_folder) -> None:  # noqa: F811
    run = ranks.parse_ranks(gloo_ddp_folder, None, jobs=1)
    assert not run.failed
    waits = rank_paths.path_waits(((r.rank, r.path_segments) for r in run.results), run.matches)
    other = 1 - LATE_RANK
    mine = waits[(waits["rank"] == other) & (waits["stage"] == LATE_STAGE)]
    assert set(mine["waited_rank"]) == {LATE_RANK}
    per_step = _per_step(waits, other, LATE_STAGE)
    assert len(per_step) == 2  # both training steps
    assert ((per_step - SLEEP_S * 1e9).abs() <= 0.1 * SLEEP_S * 1e9).all(), per_step.tolist()
    assert _per_step(waits, LATE_RANK, LATE_STAGE).sum() < 0.1 * SLEEP_S * 1e9  # the sleeper waited for nobody
    waited = run.matches[(run.matches["rank"] == other) & (run.matches["match_stage"] == LATE_STAGE)]
    assert per_step.sum() <= waited["waiting_ns"].sum()  # the path's wait lies inside the windows it waited


def test_summarize_shows_the_waits_from_the_folder_and_from_its_dataset(gloo_ddp_folder, tmp_path, capsys) -> None:  # noqa: F811
    assert main(["summarize", str(gloo_ddp_folder), "--format", "json", "-q", "-j", "1"]) == 0
    from_folder = json.loads(capsys.readouterr().out)["late_ranks"]["path_waits"]
    out = tmp_path / "dataset"
    assert main(["parse", str(gloo_ddp_folder), "-o", str(out), "-q", "-j", "1"]) == 0
    capsys.readouterr()
    assert main(["summarize", str(out), "--format", "json", "-q"]) == 0
    from_dataset = json.loads(capsys.readouterr().out)["late_ranks"]["path_waits"]
    assert from_folder == from_dataset
    row = next(w for w in from_folder if w["rank"] != LATE_RANK and w["stage"] == LATE_STAGE)
    assert row["waited_rank"] == LATE_RANK and row["steps"] == 2
    assert row["per_step_ns"] == pytest.approx(SLEEP_S * 1e9, rel=0.1)
    assert main(["summarize", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "On each rank's critical path: waiting for a later rank" in text
