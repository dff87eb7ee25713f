"""Loading sub-steps: the rule table, the pass on hand-built traces, and real captures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder, training_step

import profparse
from profparse.analysis.load_rules import LOAD_RULES, SUBSTEPS, load_rules, load_rules_markdown
from profparse.outputs.summary import render_summary

DOCS = Path(__file__).parent.parent / "docs" / "analyses.md"
US = 1000  # the builder writes microseconds; tables are in nanoseconds


def loading(b: TraceBuilder) -> None:
    """A transformers 5.x style from_pretrained (0-100 us) then Module.to with a host-to-device copy (100-110 us)."""
    b.py("transformers/models/auto/auto_factory.py(260): from_pretrained", 0, 100)
    b.py("transformers/models/auto/configuration_auto.py(311): from_pretrained", 1, 10)  # config
    b.py("transformers/models/auto/configuration_auto.py(113): __getitem__", 2, 3)  # class (innermost)
    b.py("transformers/models/auto/auto_factory.py(177): _get_model_class", 12, 5)  # class
    b.py("transformers/modeling_utils.py(3902): from_pretrained", 20, 70)  # umbrella: unattributed self time
    b.py("transformers/models/qwen2/modeling_qwen2.py(406): __init__", 21, 20)  # instantiate
    b.py("transformers/generation/configuration_utils.py(1290): from_model_config", 22, 4)  # config (innermost)
    b.py("transformers/modeling_utils.py(4488): _load_pretrained_model", 45, 30)  # weights
    b.py("<built-in method get_slice of builtins.safe_open object at 0x7f>", 46, 5)  # weights
    b.py("transformers/modeling_utils.py(4889): _initialize_missing_keys", 60, 10)  # instantiate (innermost)
    b.py("torch/nn/modules/module.py(1254): to", 100, 10)  # to_device
    b.op("aten::_to_copy", 101, 6)
    b.launch(102, 103, 4, name="Memcpy HtoD (Pageable -> Device)", cat="gpu_memcpy")


def build(tmp_path, marks: bool = False) -> profparse.ParsedTrace:
    b = TraceBuilder()
    loading(b)
    if marks:
        b.annotation("profparse.stage:load", 0, 110)
        b.annotation("profparse.load:to_device", 95, 15)
    training_step(b, 1, 200)
    return profparse.parse(b.write(tmp_path / "t.json"))


def test_rule_table_is_data():
    names = [r.name for r in LOAD_RULES]
    assert len(names) == len(set(names))
    assert {r.substep for r in LOAD_RULES} <= set(SUBSTEPS) - {"unattributed"}
    assert [r.priority for r in load_rules()] == sorted((r.priority for r in LOAD_RULES), reverse=True)
    for r in LOAD_RULES:
        re.compile(r.pattern)


def test_docs_embed_the_rule_table():
    if not DOCS.exists():
        pytest.skip("docs/analyses.md absent")
    assert load_rules_markdown() in DOCS.read_text(), "regenerate the table in docs/analyses.md"


def test_substeps_by_hand(tmp_path):
    p = build(tmp_path)
    b = p.load_breakdown.set_index("substep")
    assert list(b.index) == list(SUBSTEPS)
    expected = {
        "config": 7 + 4,
        "class_resolution": 3 + 5,
        "instantiate": 16 + 10,
        "load_weights": 15 + 5,
        "to_device": 10,
        "unattributed": 15 + 20,
    }
    assert {k: int(v) for k, v in b["time_ns"].items()} == {k: v * US for k, v in expected.items()}
    load_wall = p.stage_summary.query("scope == 'total' and stage == 'load'")["host_wall_ns"].iloc[0]
    assert b["time_ns"].sum() == load_wall == 110 * US
    assert b["share"].sum() == pytest.approx(1.0)
    assert b.loc["to_device", "gpu_time_ns"] == 4 * US and b.loc["to_device", "gpu_count"] == 1
    assert b.loc["to_device", "op_count"] == 1
    assert b.loc["unattributed", "wall_ns"] == 100 * US  # the from_pretrained umbrella frame's span
    assert b.loc["config", "rule"] == "config.transformers, config.generation"
    assert b.loc["unattributed", "rule"] == ""


def test_events_carry_substage_and_rule(tmp_path):
    p = build(tmp_path)
    e = p.events.set_index("name")
    assert e.loc["transformers/generation/configuration_utils.py(1290): from_model_config", "substage"] == "config"
    assert e.loc["transformers/modeling_utils.py(4889): _initialize_missing_keys", "substage"] == "instantiate"
    assert e.loc["aten::_to_copy", "substage_rule"] == "device.module_to"
    assert e.loc["Memcpy HtoD (Pageable -> Device)", "substage"] == "to_device"
    not_load = p.events[p.events["stage"] != "load"]
    assert not_load["substage"].isna().all() and not_load["substage_rule"].isna().all()


def test_load_marks_decide_first(tmp_path):
    p = build(tmp_path, marks=True)
    b = p.load_breakdown.set_index("substep")
    assert b.loc["to_device", "rule"] == "load_mark.to_device"
    assert b.loc["to_device", "time_ns"] == 15 * US  # the mark covers 95-110 us, beyond the frame's 100-110 us
    assert b["time_ns"].sum() == 110 * US


def test_no_python_frames_no_breakdown(tmp_path):
    b = TraceBuilder()
    b.annotation("profparse.stage:load", 0, 50)
    b.op("aten::to", 1, 10)
    training_step(b, 1, 100)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    assert p.load_breakdown.empty
    assert list(p.load_breakdown.columns)[:2] == ["substep", "time_ns"]
    assert (p.events.loc[p.events["stage"] == "load", "substage"] == "unattributed").all()
    assert "Loading sub-steps" not in render_summary(p)


def test_sample_captures(sample_trace):
    p = parsed_once(sample_trace, include_marks="nomarks" not in sample_trace.name)
    b = p.load_breakdown
    if not (p.events["kind"] == "python_function").any():
        assert b.empty
        return
    b = b.set_index("substep")
    load_wall = p.stage_summary.query("scope == 'total' and stage == 'load'")["host_wall_ns"].iloc[0]
    assert b["time_ns"].sum() == load_wall
    for substep in ("config", "class_resolution", "instantiate", "load_weights", "to_device"):
        assert b.loc[substep, "time_ns"] > 0, substep
    assert b.loc["unattributed", "share"] < 0.15
    assert b.loc["instantiate", "op_count"] > 0  # parameter initialisation ops (aten::uniform_ ...)
