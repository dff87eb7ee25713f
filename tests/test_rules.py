"""Each stage rule on a small hand-built trace."""

from __future__ import annotations

import pandas as pd
import pytest
from tracebuilder import AUTOGRAD, TraceBuilder, training_step

import profparse
from profparse.stages.rules import RULES, rules_table


def parsed(builder: TraceBuilder, tmp_path, **kwargs) -> profparse.ParsedTrace:
    return profparse.parse(builder.write(tmp_path / "t.json"), **kwargs)


def row(p: profparse.ParsedTrace, name: str, nth: int = 0) -> pd.Series:
    events = p.events
    return events[events["name"] == name].iloc[nth]


def test_rule_table_is_data_with_unique_names():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(r.stage in profparse.STAGES for r in RULES)
    assert [r.priority for r in rules_table()] == sorted((r.priority for r in RULES), reverse=True)


def test_training_step_without_marks(tmp_path):
    b = TraceBuilder()
    training_step(b, 1, 0)
    p = parsed(b, tmp_path)
    assert (row(p, "aten::linear")[["stage", "stage_rule"]] == ["forward", "forward.module"]).all()
    assert (row(p, "AddmmBackward0")[["stage", "stage_rule"]] == ["backward", "backward.engine"]).all()
    assert (row(p, "aten::_foreach_add_")[["stage", "stage_rule"]] == ["optimizer", "optimizer.range"]).all()
    kernels = p.kernels.set_index("name")
    assert kernels.loc["gemm_fwd", "stage"] == "forward"
    assert kernels.loc["gemm_bwd", "stage"] == "backward"
    assert kernels.loc["adam_kernel", "stage"] == "optimizer"
    assert kernels.loc["gemm_bwd", "launch_op_name"] == "AddmmBackward0"
    assert set(p.events["step"].dropna().unique()) == {1}


def test_stage_marks_win_and_can_be_ignored(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 0, 100)
    b.annotation("profparse.stage:load", 1, 50)
    b.op("aten::linear", 2, 10)  # looks like nothing: only the mark says load
    p = parsed(b, tmp_path)
    assert (row(p, "aten::linear")[["stage", "stage_rule"]] == ["load", "mark.load"]).all()
    p2 = parsed(b, tmp_path, include_marks=False)
    # no evidence of any stage: the rest of a step is other, never forward by default
    assert (row(p2, "aten::linear")[["stage", "stage_rule"]] == ["other", "other.step"]).all()


@pytest.mark.parametrize(
    ("name", "stage"), [("## forward ##", "forward"), ("backward", "backward"), ("## optimizer ##", "optimizer")]
)
def test_user_ranges_with_stage_names(tmp_path, name, stage):
    b = TraceBuilder()
    b.annotation("ProfilerStep#3", 0, 100)
    b.annotation(name, 1, 50)
    b.op("aten::mul", 2, 10)
    assert row(parsed(b, tmp_path), "aten::mul")["stage"] == stage


def test_recompute_inside_backward_is_backward(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 10, 50, tid=AUTOGRAD)
    b.py("nn.Module: Qwen2DecoderLayer_0", 11, 30, tid=AUTOGRAD)
    b.op("aten::mm", 12, 5, tid=AUTOGRAD)
    r = row(parsed(b, tmp_path), "aten::mm")
    assert (r[["stage", "stage_rule"]] == ["backward", "backward.engine"]).all()


def test_autograd_thread_and_legacy_backward_nodes(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::add_", 10, 5, tid=AUTOGRAD)  # on pt_autograd thread, no wrapper
    b.op("ConvolutionBackward", 20, 10, tid=999)  # legacy node name, anonymous thread
    b.op("aten::convolution_backward", 21, 5, tid=999)
    p = parsed(b, tmp_path)
    assert (row(p, "aten::add_")[["stage", "stage_rule"]] == ["backward", "backward.thread"]).all()
    assert (row(p, "aten::convolution_backward")[["stage", "stage_rule"]] == ["backward", "backward.node"]).all()


def test_loading_python_frames_and_early_copies(tmp_path):
    b = TraceBuilder()
    b.py("transformers/modeling_utils.py(4500): from_pretrained", 0, 40)
    b.op("aten::empty", 1, 2)
    b.py("torch/nn/modules/module.py(1340): to", 45, 10)
    b.op("aten::_to_copy", 46, 5)
    b.op("aten::copy_", 60, 5)  # a bare copy before the first step
    b.annotation("ProfilerStep#0", 100, 50)
    b.op("aten::copy_", 110, 5)  # a copy inside a step is not loading
    b.py("nn.Module: Linear_0", 120, 10)
    p = parsed(b, tmp_path)
    assert (row(p, "aten::empty")[["stage", "stage_rule"]] == ["load", "load.from_pretrained"]).all()
    assert (row(p, "aten::_to_copy")[["stage", "stage_rule"]] == ["load", "load.module_to"]).all()
    assert (row(p, "aten::copy_", 0)[["stage", "stage_rule"]] == ["load", "load.h2d_copy"]).all()
    assert (row(p, "aten::copy_", 1)[["stage", "stage_rule"]] == ["other", "other.data.batch_copy"]).all()


def test_data_loading_and_communication_are_other(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1, 10)
    b.op("aten::stack", 2, 5)
    b.annotation("nccl:all_reduce", 20, 5)
    b.op("record_param_comms", 21, 2)
    p = parsed(b, tmp_path)
    assert (row(p, "aten::stack")[["stage", "stage_rule"]] == ["other", "other.data"]).all()
    assert (row(p, "record_param_comms")[["stage", "stage_rule"]] == ["other", "other.communication"]).all()


def test_no_profiler_steps_uses_optimizer_boundaries(tmp_path):
    b = TraceBuilder()
    for k in range(3):
        t = 100 * k
        # a 2021-style trace: no fwdbwd flows, forward ops linked to backward nodes by sequence number only
        b.op("aten::conv2d", t + 1, 10, **{"Sequence number": k})
        b.op("aten::zeros", t + 12, 2)  # inside the forward phase: between conv2d and relu
        b.op("aten::relu", t + 15, 2, **{"Sequence number": 10 + k})
        b.op("ReluBackward0", t + 20, 4, tid=AUTOGRAD, **{"Sequence number": 10 + k})
        b.op("ConvolutionBackward0", t + 25, 5, tid=AUTOGRAD, **{"Sequence number": k})
        b.annotation("Optimizer.step#SGD.step", t + 40, 10)
    p = parsed(b, tmp_path)
    assert list(p.steps["source"].unique()) == ["optimizer_boundaries"]
    assert len(p.steps) == 3
    convs = p.events[p.events["name"] == "aten::conv2d"]
    assert list(convs["stage_rule"]) == ["forward.autograd_op"] * 3  # sequence number of a backward node
    assert list(convs["step"]) == [0, 1, 2]
    zeros = p.events[p.events["name"] == "aten::zeros"]
    assert list(zeros["stage_rule"]) == ["forward.phase"] * 3


def test_outside_any_rule_is_unclassified(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 100, 10)
    b.op("aten::zeros", 0, 5, tid=555)  # before the step, other thread, no clue
    r = row(parsed(b, tmp_path), "aten::zeros")
    assert (r[["stage", "stage_rule"]] == ["other", "other.unclassified"]).all()
    assert pd.isna(r["step"])


def test_every_event_has_exactly_one_stage_and_a_rule(tmp_path):
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    b.memory(3, 1024, 1024)
    p = parsed(b, tmp_path)
    assert p.events["stage"].notna().all()
    assert p.events["stage_rule"].notna().all()
    mem = p.events[p.events["kind"] == "memory"].iloc[0]
    assert mem["stage"] == "forward"  # inside nn.Module: Linear_0's time on the main thread


def test_docs_show_the_current_rule_table():
    from pathlib import Path

    from profparse.stages.rules import rules_markdown

    doc = (Path(__file__).parents[1] / "docs" / "stages.md").read_text()
    assert rules_markdown() in doc


def test_op_with_fwdbwd_flow_is_forward(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::mul", 10, 5, **{"Sequence number": 7})
    b.events.append({"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 7, "pid": 1, "tid": 100, "ts": 10})
    b.op("autograd::engine::evaluate_function: MulBackward0", 50, 5, tid=AUTOGRAD, **{"Sequence number": 7})
    b.events.append(
        {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 7, "pid": 1, "tid": AUTOGRAD, "ts": 50, "bp": "e"}
    )
    b.op("aten::zeros", 60, 5)  # no autograd history, after backward: the rest of the step
    p = parsed(b, tmp_path)
    assert row(p, "aten::mul")["stage_rule"] == "forward.autograd_op"
    assert (row(p, "aten::zeros")[["stage", "stage_rule"]] == ["other", "other.step"]).all()
