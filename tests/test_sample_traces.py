"""Acceptance on the project's own captures (sample_traces/)."""

from __future__ import annotations

import pytest
from conftest import parsed as cached_parse


def agreement(path) -> float:
    """Share of CPU-op self time on which inference without marks agrees with the marks."""
    marked = cached_parse(path).ops
    inferred = cached_parse(path, include_marks=False).ops
    same = marked["stage"].astype(str).to_numpy() == inferred["stage"].astype(str).to_numpy()
    return float(marked["self_ns"][same].sum() / marked["self_ns"].sum())


def test_inference_without_marks_agrees_with_marks(sample_trace):
    parsed = cached_parse(sample_trace)
    if not (parsed.ops["stage_rule"].astype(str).str.startswith("mark.")).any():
        pytest.skip("captured without stage marks")
    assert agreement(sample_trace) >= 0.99


def test_every_training_stage_is_found(sample_trace):
    parsed = cached_parse(sample_trace, include_marks=False)
    totals = parsed.stage_summary.query("scope == 'total'").set_index("stage")
    for stage in ("forward", "backward", "optimizer"):
        assert totals.loc[stage, "host_op_ns"] > 0, stage
    assert list(parsed.steps["source"].unique()) == ["ProfilerStep"]


def test_loading_is_found_from_python_frames(sample_trace):
    parsed = cached_parse(sample_trace, include_marks=False)
    if not (parsed.events["kind"] == "python_function").any():
        pytest.skip("captured without Python stacks")
    ops = parsed.ops
    load = ops[ops["stage"] == "load"]
    assert len(load) > 0
    assert set(load["stage_rule"].astype(str)) <= {"load.from_pretrained", "load.module_to", "load.h2d_copy"}
    assert (load["step"] == parsed.steps["step"].min()).all()
