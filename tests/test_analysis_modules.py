"""Forward/backward time per nn.Module instance: hand-built traces, the sample captures, a real GPU trace."""

from __future__ import annotations

import pandas as pd
from conftest import parsed as parsed_once
from tracebuilder import AUTOGRAD, TraceBuilder, backward_node, forward_op

import profparse

US = 1000


def build(tmp_path, recompute: bool = False) -> profparse.ParsedTrace:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.py("nn.Module: Model_0", 1, 100)
    b.py("nn.Module: Layer_0", 2, 40)
    forward_op(b, "aten::linear", 3, 20, seq=10)
    b.launch(4, 10, 8, name="gemm_0")
    b.py("nn.Module: Layer_1", 45, 40)
    forward_op(b, "aten::mm", 46, 20, seq=11)
    b.launch(47, 50, 6, name="gemm_1")
    forward_op(b, "aten::add", 90, 5, seq=12)
    backward_node(b, "MmBackward0", 110, 20, seq=11)
    b.launch(112, 115, 4, tid=AUTOGRAD, name="gemm_1_bwd")
    backward_node(b, "AddmmBackward0", 135, 30, seq=10)
    b.launch(137, 140, 10, tid=AUTOGRAD, name="gemm_0_bwd")
    backward_node(b, "AddBackward0", 170, 5, seq=12)
    backward_node(b, "torch::autograd::AccumulateGrad", 180, 4, seq=99)  # no forward op with that number
    if recompute:  # non-reentrant checkpointing: Layer_1's forward runs again inside backward
        backward_node(b, "CheckpointFunctionBackward", 186, 12, seq=98)
        b.py("nn.Module: Layer_1", 188, 8, tid=AUTOGRAD)
        b.op("aten::mm", 189, 6, tid=AUTOGRAD)
    return profparse.parse(b.write(tmp_path / "t.json"))


def rows(p: profparse.ParsedTrace) -> pd.DataFrame:
    m = p.modules
    return m.set_index(["module", m["stage"].astype(str), "recompute"])


def test_forward_and_backward_by_hand(tmp_path):
    m = rows(build(tmp_path))
    fwd = lambda name: m.loc[(name, "forward", False)]  # noqa: E731
    bwd = lambda name: m.loc[(name, "backward", False)]  # noqa: E731
    assert (fwd("Model_0")["host_ns"], fwd("Layer_0")["host_ns"], fwd("Layer_1")["host_ns"]) == (
        100 * US,
        40 * US,
        40 * US,
    )
    assert fwd("Model_0")["host_self_ns"] == 20 * US
    assert (fwd("Model_0")["gpu_ns"], fwd("Layer_0")["gpu_ns"], fwd("Layer_1")["gpu_ns"]) == (14 * US, 8 * US, 6 * US)
    assert (fwd("Model_0")["op_count"], fwd("Model_0")["kernel_count"], fwd("Layer_0")["kernel_count"]) == (3, 2, 1)
    assert (bwd("Layer_0")["host_ns"], bwd("Layer_0")["gpu_ns"]) == (30 * US, 10 * US)
    assert (bwd("Layer_1")["host_ns"], bwd("Layer_1")["gpu_ns"]) == (20 * US, 4 * US)
    assert (bwd("Model_0")["host_ns"], bwd("Model_0")["gpu_ns"], bwd("Model_0")["host_self_ns"]) == (
        55 * US,
        14 * US,
        5 * US,
    )
    assert bwd("Model_0")["backward_nodes"] == 3 and bwd("Layer_0")["backward_nodes"] == 1
    assert bwd("Layer_0")["op_count"] == 2  # the evaluate_function wrapper and the node op
    none = m.loc[("(none)", "backward", False)]
    assert none["host_ns"] == 4 * US and none["backward_nodes"] == 1
    t = build(tmp_path).modules.set_index("module")
    assert t.loc["Layer_0", "parent"].tolist() == ["Model_0", "Model_0"] and (t.loc["Layer_0", "depth"] == 1).all()
    assert (t.loc["Model_0", "class"] == "Model").all() and (t.loc["Layer_1", "instance"] == 1).all()
    assert not build(tmp_path).modules["recompute"].any()


def test_checkpoint_recompute_is_backward_and_labelled(tmp_path):
    m = rows(build(tmp_path, recompute=True))
    again = m.loc[("Layer_1", "backward", True)]
    assert again["host_ns"] == 8 * US and again["calls"] == 1 and again["op_count"] == 1
    assert m.loc[("Layer_1", "forward", False), "calls"] == 1  # the first forward is still forward
    assert m.loc[("Layer_1", "backward", False), "host_ns"] == 20 * US


def test_a_class_s_depth_is_its_place_in_the_model_not_its_recomputation(tmp_path):
    """The summary's modules by class: a recomputed layer runs from the autograd engine at depth 0; the class's
    depth (and so its place in the table) stays the model's, and its recompute time is counted apart."""
    from profparse.outputs.summary.analyses import modules_data

    parsed = build(tmp_path, recompute=True)
    assert parsed.modules.loc[parsed.modules["recompute"], "depth"].tolist() == [0]
    rows = modules_data(parsed)["modules_by_class"]
    placed = [(r["class"], r["depth"]) for r in rows]  # in depth order; "(none)": backward nodes of no module
    assert placed == [("Model", 0), ("(none)", 0), ("Layer", 1)]
    layer = rows[-1]
    assert layer["recompute_host_ns"] == 8 * US and layer["forward_host_ns"] == 80 * US and layer["instances"] == 2


def test_no_module_events_no_table(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    forward_op(b, "aten::mm", 1, 10, seq=1)
    backward_node(b, "MmBackward0", 20, 10, seq=1)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert p.modules.empty and "host_ns" in p.modules.columns


def test_backward_nodes_whose_forward_ops_are_not_in_the_trace(tmp_path):
    """A window that holds a module and a backward node but no forward op that recorded a sequence number (the
    forward ran before the window): the node belongs to no module's call, "(none)"; this raised an index error
    (every verb exited 70). With a forward op of another sequence number, the node still matches none."""
    from profparse.outputs.summary import render_summary

    for other_seq in (None, 9):
        b = TraceBuilder()
        b.annotation("ProfilerStep#1", 0, 100)
        b.py("nn.Module: Linear_0", 1, 5)
        if other_seq is None:
            b.op("aten::add", 2, 2)
        else:
            forward_op(b, "aten::mm", 2, 2, seq=other_seq)
        backward_node(b, "MmBackward0", 10, 20, seq=5)
        b.launch(12, 15, 5, tid=AUTOGRAD, name="mm_bwd")
        parsed = profparse.parse(b.write(tmp_path / "t.json"))
        m = rows(parsed)
        assert m.loc[("(none)", "backward", False), "backward_nodes"] == 1, other_seq
        assert m.loc[("Linear_0", "forward", False), "calls"] == 1
        assert "Linear" in render_summary(parsed)


def test_decoder_layers_in_sample_captures(sample_trace):
    p = parsed_once(sample_trace)
    m = p.modules
    if not (p.events["kind"] == "python_function").any():
        assert m.empty
        return
    fwd = m[(m["stage"] == "forward") & ~m["recompute"]].set_index("module")
    bwd = m[(m["stage"] == "backward") & ~m["recompute"]].set_index("module")
    layers = fwd[fwd["class"] == "Qwen2DecoderLayer"]
    assert len(layers) == 2 and (layers["host_ns"] > 0).all() and (layers["parent"] == "Qwen2Model_0").all()
    assert fwd.loc["Qwen2Model_0", "parent"] == "Qwen2ForCausalLM_0" and fwd.loc["Qwen2ForCausalLM_0", "depth"] == 0
    assert layers["host_ns"].sum() <= fwd.loc["Qwen2Model_0", "host_ns"] <= fwd.loc["Qwen2ForCausalLM_0", "host_ns"]
    assert (bwd.loc[layers.index, "host_ns"] > 0).all() and (bwd.loc[layers.index, "backward_nodes"] > 0).all()
    stages = p.stage_summary.query("scope == 'total'").set_index("stage")
    assert fwd.loc["Qwen2ForCausalLM_0", "host_ns"] <= stages.loc["forward", "host_wall_ns"]
    assert bwd["host_ns"][bwd["depth"] == 0].sum() <= stages.loc["backward", "host_wall_ns"]
    assert (m["calls"] >= 0).all() and not m["recompute"].any()


def test_gpu_trace_with_modules():
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "mi300x_resnet18_train.json.gz"
    if not path.exists():
        import pytest

        pytest.skip("../shared/traces not present")
    p = parsed_once(path)
    m = p.modules
    stages = p.stage_levels.query("scope == 'total'").set_index("stage")
    roots = m[m["depth"] == 0]
    fwd_gpu = roots.loc[roots["stage"] == "forward", "gpu_ns"].sum()
    bwd_gpu = roots.loc[roots["stage"] == "backward", "gpu_ns"].sum()
    assert 0.95 * stages.loc["forward", "device_ns"] <= fwd_gpu <= stages.loc["forward", "device_ns"]
    assert 0.95 * stages.loc["backward", "device_ns"] <= bwd_gpu <= stages.loc["backward", "device_ns"]
    convs = m[(m["class"] == "Conv2d") & (m["stage"] == "backward")]
    assert len(convs) == 20 and (convs["gpu_ns"] > 0).all() and (convs["kernel_count"] > 0).all()


def test_a_module_called_from_two_places_has_its_first_call_s_parent_in_any_file_order(tmp_path):
    """Block_1 runs alone first, then inside Block_0: its parent is its first call's (none), whether the file
    lists the nested call first or last, and so is what its class counts (random trace 612 of the fuzzer: the
    parent, and with it the class's forward time, followed the file's order)."""
    from profparse.outputs.summary import summary_data

    answers = []
    for nested_first in (True, False):
        b = TraceBuilder()
        b.annotation("ProfilerStep#1", 0, 200)
        b.py("nn.Module: Block_1", 10, 20)  # alone
        b.py("nn.Module: Block_0", 100, 50)
        b.py("nn.Module: Block_1", 110, 30)  # inside Block_0
        if nested_first:
            b.events.append(b.events.pop(-3))  # the file lists the call alone last
        parsed = profparse.parse(b.write(tmp_path / f"t{nested_first}.json"))
        m = rows(parsed)
        assert m.loc[("Block_1", "forward", False), "parent"] == ""
        assert m.loc[("Block_1", "forward", False), "calls"] == 2
        answers.append(summary_data(parsed)["analyses"]["modules_by_class"])
    assert answers[0] == answers[1]
