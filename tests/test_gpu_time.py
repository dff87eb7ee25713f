"""Additive GPU time: per step and device, busy per stage + overlap + idle charged to a stage == the GPU span."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder

import profparse
from profparse.base.marks import STAGES
from profparse.diff import diff_data
from profparse.tables.gpu_time import gpu_time
from profparse.trace.kinds import GPU_ACTIVITY_KINDS, NULL
from profparse.trace.link import kind_mask

US = 1000
COLUMNS = ("gpu_busy_ns", "gpu_overlap_ns", "gpu_idle_ns")


def gpu(b: TraceBuilder, launch_ts: float, ts: float, dur: float, name: str, stream: int = 7, device: int = 0):
    """A launch at ``launch_ts`` and its kernel ``name`` (prefix = stage) on ``stream`` of ``device``."""
    _, kernel = b.launch(launch_ts, ts, dur, name=name)
    kernel["tid"] = stream
    kernel["pid"] = device
    kernel["args"]["device"] = device
    return kernel


def staged_trace(tmp_path) -> profparse.ParsedTrace:
    """Three steps whose GPU work has known stages (the kernel name's prefix), gaps and overlaps (times in us).

    Step 1 (zero_grad at the start, step() at the end), device 0:
      optimizer 10-12 | idle 12-15 | forward 15-25, 25-30 | idle 30-40 | backward 40-60 (stream 7), 55-70 (8)
      | other 65-75 (stream 9: overlaps backward 65-70) | idle 75-80 | optimizer 80-90 | idle 90-95 | optimizer
      95-95 (zero length). Device 1: forward 50-60.
    Step 2: forward 110-120 and other 110-115 start together | idle 120-130 | backward 130-140 and optimizer
      130-135 start together.
    Step 3: forward 210-230 | other 220-240 joins | optimizer 235-250 joins other.
    """
    b = TraceBuilder()
    for step, t0 in ((1, 0), (2, 100), (3, 200)):
        b.annotation(f"ProfilerStep#{step}", t0, 100)
    gpu(b, 1, 10, 2, "optimizer_zero_grad")
    gpu(b, 2, 15, 10, "forward_a")
    gpu(b, 3, 25, 5, "forward_b")
    gpu(b, 4, 40, 20, "backward_a")
    gpu(b, 5, 55, 15, "backward_comm", stream=8)
    gpu(b, 6, 65, 10, "other_copy", stream=9)
    gpu(b, 7, 80, 10, "optimizer_step")
    gpu(b, 8, 95, 0, "optimizer_tail")
    gpu(b, 9, 50, 10, "forward_dev1", device=1)
    gpu(b, 101, 110, 10, "forward_c")
    gpu(b, 102, 110, 5, "other_c", stream=9)
    gpu(b, 103, 130, 10, "backward_c")
    gpu(b, 104, 130, 5, "optimizer_c", stream=8)
    gpu(b, 201, 210, 20, "forward_d")
    gpu(b, 202, 220, 20, "other_d", stream=9)
    gpu(b, 203, 235, 15, "optimizer_d", stream=8)
    return profparse.parse(b.write(tmp_path / "staged.json"))


def with_kernel_stages(p: profparse.ParsedTrace) -> profparse.ParsedTrace:
    """The same trace with each GPU activity's stage set from its name prefix (independent of the stage rules)."""
    events = p.raw.events
    stage = p.attribution.stage.copy()
    activity = np.flatnonzero(kind_mask(events, GPU_ACTIVITY_KINDS))
    for row in activity:
        stage[row] = STAGES.index(str(events["name"].iloc[row]).split("_")[0])
    attribution = dataclasses.replace(p.attribution, stage=stage)
    return profparse.ParsedTrace(raw=p.raw, links=p.links, attribution=attribution)


def expected_rows() -> dict[tuple[int, str], tuple[int, int, int]]:
    """(step, stage) -> (busy, overlap, idle) in us, worked out by hand from the picture in ``staged_trace``."""
    return {
        (1, "optimizer"): (2 + 10, 0, 5 + 5),  # idle: 75-80 before step(), 90-95 before the zero-length tail
        (1, "forward"): (15 + 10, 0, 3),  # device 0: 15-30; device 1: 50-60; idle 12-15
        (1, "backward"): (25, 5, 10),  # 40-65 alone; 65-70 with other (backward ran alone before); idle 30-40
        (1, "other"): (5, 0, 0),  # 70-75
        (2, "forward"): (5, 5, 0),  # 110-115 together with other: first in pipeline order
        (2, "backward"): (5, 5, 10),  # idle 120-130 ends with backward and optimizer: backward comes first
        (3, "forward"): (10, 10, 0),  # 210-220 alone, 220-230 with other (forward ran alone before)
        (3, "other"): (5, 5, 0),  # 230-235 alone, 235-240 with optimizer (other ran alone before)
        (3, "optimizer"): (10, 0, 0),  # 240-250
    }


def test_gpu_time_ground_truth(tmp_path):
    p = with_kernel_stages(staged_trace(tmp_path))
    summary = p.stage_summary
    rows = summary[summary["scope"] == "step"]
    want = expected_rows()
    for r in rows.itertuples(index=False):
        got = tuple(int(getattr(r, c)) for c in COLUMNS)
        assert got == tuple(us * US for us in want.get((int(r.step), str(r.stage)), (0, 0, 0))), (r.step, r.stage)
    spans = {1: (95 - 10) + (60 - 50), 2: 140 - 110, 3: 250 - 210}
    per_step = rows.groupby("step")[list(COLUMNS)].sum().sum(axis=1)
    assert per_step.to_dict() == {s: v * US for s, v in spans.items()}
    totals = summary[summary["scope"] == "total"].set_index("stage")
    assert totals.loc["optimizer", "gpu_idle_ns"] == 10 * US  # the first-to-last measure said 85 - 12 = 73 us
    assert totals["gpu_idle_ns"].sum() == (3 + 10 + 5 + 5 + 10) * US  # every idle ns of the spans, once


def test_gpu_time_groups_by_step_and_device(tmp_path):
    p = with_kernel_stages(staged_trace(tmp_path))
    g = gpu_time(p.raw.events, p.attribution)
    spans = {(int(s), int(d)): int(v) for s, d, v in zip(g.step, g.device, g.span, strict=True)}
    assert spans == {(1, 0): 85 * US, (1, 1): 10 * US, (2, 0): 30 * US, (3, 0): 40 * US}
    parts = (g.busy + g.overlap + g.idle).reshape(len(g.span), len(STAGES)).sum(axis=1)
    assert (parts == g.span).all()


def test_levels_plots_and_diff_use_the_same_numbers(tmp_path):
    from profparse.outputs.plots import _level_panels

    p = with_kernel_stages(staged_trace(tmp_path))
    totals = p.stage_summary.query("scope == 'total'").set_index("stage")
    levels = p.stage_levels.query("scope == 'total'").set_index("stage")
    for ours, theirs in (("device_busy_ns", "gpu_busy_ns"), ("device_overlap_ns", "gpu_overlap_ns"),
                         ("device_idle_ns", "gpu_idle_ns")):  # fmt: skip
        assert (levels[ours] == totals[theirs]).all()
    panels = dict((title, frame) for frame, title in _level_panels(p))
    device = panels["GPU"]
    assert (device.sum(axis=1) == totals.loc[device.index, list(COLUMNS)].sum(axis=1)).all()
    data = diff_data(p, p)
    idle = {r["stage"]: r["a"] for r in data["stages"] if r["column"] == "gpu_idle_ns"}
    assert idle["all"] == totals["gpu_idle_ns"].sum() == 33 * US
    assert idle["optimizer"] == 10 * US


def test_unlinked_activity_outside_steps_does_not_span_the_steps(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 100, 100)
    b.op("aten::mm", 110, 10)
    b.launch(111, 120, 10)
    for ts in (10, 300):  # activity without a launch, before and after the step
        b.events.append({"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": ts, "dur": 5,
                         "args": {"stream": 7, "device": 0}})  # fmt: skip
    p = profparse.parse(b.write(tmp_path / "t.json"))
    outside = p.stage_summary.query("scope == 'outside_steps'")
    assert outside["gpu_idle_ns"].sum() == 0  # two separate spans of 5 us, not one of 295 us
    assert outside[list(COLUMNS)].to_numpy().sum() == 10 * US


def independent_spans(p: profparse.ParsedTrace) -> pd.Series:
    """Sum over devices of (last end - first start) per step of GPU activity, from the public events table."""
    ev = p.events
    act = ev[ev["kind"].isin(sorted(GPU_ACTIVITY_KINDS))].copy()
    act["end"] = act["ts_ns"] + act["dur_ns"]
    act["dev"] = act["device"].fillna(act["pid"])
    starts = p.steps["start_ns"].to_numpy()
    act["gap"] = np.where(act["step"].isna(), np.searchsorted(starts, act["ts_ns"].to_numpy(), side="right"), -1)
    act["step"] = act["step"].fillna(NULL)
    g = act.groupby(["step", "gap", "dev"])
    span = (g["end"].max() - g["ts_ns"].min()).groupby(level="step").sum()
    return span


def check_additive(p: profparse.ParsedTrace) -> None:
    summary = p.table("stage_summary")
    rows = summary[summary["scope"] != "total"]
    parts = rows.groupby("step")[list(COLUMNS)].sum().sum(axis=1)
    spans = independent_spans(p)
    parts = parts[parts != 0]
    assert parts.to_dict() == {int(k): int(v) for k, v in spans.items() if v}
    totals = summary[summary["scope"] == "total"].set_index("stage")[list(COLUMNS)]
    assert (rows.groupby("stage", observed=False)[list(COLUMNS)].sum() == totals).all().all()
    ev = p.raw.events
    act = kind_mask(ev, GPU_ACTIVITY_KINDS)
    if act.any():  # busy + overlap over stages is the time the GPU ran anything (union per step and device)
        g = gpu_time(ev, p.attribution)
        n = len(STAGES)
        ran = (g.busy + g.overlap).reshape(-1, n).sum(axis=1)
        assert (ran + g.idle.reshape(-1, n).sum(axis=1) == g.span).all()
        assert (g.idle >= 0).all() and (g.overlap >= 0).all() and (g.busy >= 0).all()


def test_additive_on_hand_built(tmp_path):
    check_additive(staged_trace(tmp_path))
    check_additive(with_kernel_stages(staged_trace(tmp_path)))


def test_additive_on_sample_traces(sample_trace):
    check_additive(parsed_once(sample_trace))


def test_additive_on_shared_gpu_traces(shared_trace):
    p = parsed_once(shared_trace)
    check_additive(p)
    g = gpu_time(p.raw.events, p.attribution)
    busy = g.busy.reshape(-1, len(STAGES)).sum(axis=1) + g.overlap.reshape(-1, len(STAGES)).sum(axis=1)
    ev = p.raw.events
    rows = np.flatnonzero(kind_mask(ev, GPU_ACTIVITY_KINDS))
    assert busy.sum() <= ev["dur_ns"].to_numpy()[rows].sum()  # the union never exceeds the sum of durations
    assert g.span.sum() > 0


@pytest.mark.parametrize("seed", range(8))
def test_additive_on_random_activity(tmp_path, seed):
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.annotation("ProfilerStep#2", 1000, 1000)
    for i in range(60):
        launch = float(rng.integers(1, 1990))
        start, dur = launch + float(rng.integers(0, 50)), float(rng.integers(0, 80))
        stage = STAGES[rng.integers(0, len(STAGES))]
        gpu(b, launch, start, dur, f"{stage}_{i}", stream=int(rng.integers(7, 10)), device=int(rng.integers(0, 2)))
    p = with_kernel_stages(profparse.parse(b.write(tmp_path / "r.json")))
    check_additive(p)
