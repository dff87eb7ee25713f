"""Host time (tables/host_time): the per-window unions add up to one union over all pieces, by hand across a
step boundary, and each piece's step window equals step_window's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import parsed
from tracebuilder import MAIN, TraceBuilder, backward_node, forward_op, training_step

from profparse.base.marks import STAGES
from profparse.tables.host_time import HOST_LEVELS, host_levels, host_segments, host_time

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


def test_piece_windows_from_cut_intervals_equal_step_window(shared_trace):
    """host_segments looks each piece's step window up by the cut interval it lies in; step_window over every
    piece gives the same windows."""
    from profparse.stages.attribute import step_window

    p = parsed(shared_trace)
    seg = host_segments(p.raw.events, p.links, p.attribution)
    expected = step_window(seg.start, p.attribution.steps)
    assert (expected >= 0).any()
    np.testing.assert_array_equal(seg.step_index, expected)


def test_a_piece_across_several_step_boundaries_is_split_at_each(tmp_path):
    """An op of no stage over three steps: each window gets its part (the middle one all of its window), the total
    all of it once; the pieces' windows equal step_window's of their starts."""
    from profparse.stages.attribute import step_window

    b = TraceBuilder()
    t = 0
    for step in (1, 2, 3):
        t = training_step(b, step, t)
    # steps [0, 100), [100, 200), [200, 300); a worker-thread op over [15, 250)
    b.op("aten::copy_", 15, 235, tid=300)
    b.op("aten::mm", 16, 1, tid=300)
    p = parsed(b.write(tmp_path / "t.json"))
    other = STAGES.index("other")
    assert _totals(p)["wall"][other] == 235 * US
    ht = host_time(p.raw.events, p.links, p.attribution)
    in_step = ht[(ht["scope"] == "step") & (ht["stage_code"] == other)].set_index("step")["host_wall_ns"]
    assert in_step[1] == 85 * US and in_step[2] == 100 * US and in_step[3] == 50 * US
    seg = host_segments(p.raw.events, p.links, p.attribution)
    np.testing.assert_array_equal(seg.step_index, step_window(seg.start, p.attribution.steps))
    assert (seg.end > seg.start).all()


def test_a_loop_frame_across_the_first_step_range_counts_the_step_once(tmp_path):
    """The capture's step loop is a Python frame that starts just after ``ProfilerStep#1`` begins and ends after the
    last step, so the first step range does not contain the work (the frame does). The step range's own time is
    not stage time: step 1's stages add up to its window, not to its window plus all of it again as ``other``."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.py("capture/run.py(361): _training_steps", 2, 250)  # ends after ProfilerStep#2 [100, 200)
    for step, t0 in ((1, 0), (2, 100)):
        if step == 2:
            b.annotation("ProfilerStep#2", t0, 100)
        b.py("nn.Module: Linear_0", t0 + 5, 20)
        forward_op(b, "aten::linear", t0 + 6, 15, seq=step)
        backward_node(b, "AddmmBackward0", t0 + 30, 30, seq=step, tid=MAIN)
        b.annotation("Optimizer.step#AdamW.step", t0 + 70, 20)
        b.op("aten::_foreach_add_", t0 + 71, 10)
    p = parsed(b.write(tmp_path / "t.json"))
    ht = host_time(p.raw.events, p.links, p.attribution)
    per_step = ht[ht["scope"] != "total"].pivot_table("host_wall_ns", "step", "stage_code", aggfunc="sum")
    per_step = per_step.reindex(columns=range(len(STAGES)), fill_value=0).fillna(0)
    fwd, bwd, opt, other = (STAGES.index(s) for s in ("forward", "backward", "optimizer", "other"))
    for step in (1, 2):
        assert per_step.loc[step, [fwd, bwd, opt]].tolist() == [20 * US, 30 * US, 20 * US]
        assert per_step.loc[step, other] == 0  # the loop frame holds every stage: its own time is no stage's
        assert per_step.loc[step].sum() <= 100 * US


def test_one_thread_traces_stages_add_up_to_at_most_the_window(sample_trace):
    """On a trace whose stages all ran on one thread, a moment counts in one stage at most: per step, the stages'
    host wall adds up to at most the step's window."""
    p = parsed(sample_trace)
    ht = host_time(p.raw.events, p.links, p.attribution)
    rows = ht[(ht["scope"] != "total") & (ht["host_wall_ns"] > 0)]
    if len(set(p.links.thread[p.attribution.stage != STAGES.index("other")])) > 1:
        pytest.skip("stages ran on several threads")
    window = (p.steps["end_ns"] - p.steps["start_ns"]).set_axis(p.steps["step"])
    total = rows[rows["step"].isin(window.index)].groupby("step")["host_wall_ns"].sum()
    assert (total <= window.reindex(total.index)).all(), pd.concat({"stages": total, "window": window}, axis=1)
