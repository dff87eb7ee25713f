"""Broken and hostile traces, generated here: truncations, bit flips, type changes; and invariants (hypothesis)."""

from __future__ import annotations

import copy
import gzip
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracebuilder import AUTOGRAD, MAIN, TraceBuilder, training_step

import profparse
from profparse.cli.main import main
from profparse.errors import ProfparseError
from profparse.outputs.parquet import read_parquet, write_parquet
from profparse.outputs.summary import render_summary

ALLOWED_EXIT = {0, 3, 4, 5}


def base_document() -> dict:
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    b.memory(3, 4096, 4096)
    return b.document()


def cli(capsys, path) -> tuple[int, str]:
    code = main(["summarize", str(path)])
    _, err = capsys.readouterr()
    return code, err


def test_truncation_at_many_offsets(capsys, tmp_path):
    text = json.dumps(base_document(), indent=1).encode()
    path = tmp_path / "cut.json"
    for cut in range(1, len(text), max(1, len(text) // 60)):
        path.write_bytes(text[:cut])
        code, err = cli(capsys, path)
        assert code in ALLOWED_EXIT, (cut, err)
        assert "Traceback" not in err and "internal error" not in err
        assert err.count("\n") <= 8


def test_bit_flips_in_gzip(capsys, tmp_path):
    data = bytearray(gzip.compress(json.dumps(base_document()).encode()))
    rng = random.Random(1234)
    path = tmp_path / "flipped.json.gz"
    for _ in range(40):
        broken = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            broken[rng.randrange(len(broken))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(broken))
        code, err = cli(capsys, path)
        assert code in ALLOWED_EXIT, err
        assert "internal error" not in err


def test_bit_flips_in_plain_json(capsys, tmp_path):
    data = bytearray(json.dumps(base_document()).encode())
    rng = random.Random(99)
    path = tmp_path / "flipped.json"
    for _ in range(60):
        broken = bytearray(data)
        broken[rng.randrange(len(broken))] = rng.choice(b'{}[]",:0a\\\x00\xff')
        path.write_bytes(bytes(broken))
        code, err = cli(capsys, path)
        assert code in ALLOWED_EXIT, err
        assert "internal error" not in err


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=5), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    index=st.integers(0, 40),
    field=st.sampled_from(["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id", "correlation", "Bytes"]),
    value=ODD_VALUES,
)
def test_type_changes_never_crash(tmp_path, index, field, value):
    doc = base_document()
    event = doc["traceEvents"][index % len(doc["traceEvents"])]
    if field in ("correlation", "Bytes"):
        event.setdefault("args", {})[field] = value
    else:
        event[field] = value
    path = tmp_path / "typed.json"
    path.write_text(json.dumps(doc))
    try:
        parsed = profparse.parse(path)
    except ProfparseError:
        return
    render_summary(parsed)
    assert parsed.events["stage"].notna().all()


def test_hostile_sizes_are_refused_or_bounded(tmp_path):
    doc = base_document()
    doc["traceEvents"][5]["name"] = "x" * (3 << 20)  # a 3 MB name: fine, kept once
    path = tmp_path / "long.json"
    path.write_text(json.dumps(doc))
    parsed = profparse.parse(path)
    assert len(parsed.events) == len(doc["traceEvents"])
    deep = '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": ' + "[" * 100000 + "]" * 100000 + "}]}"
    (tmp_path / "deep.json").write_text(deep)
    with pytest.raises(ProfparseError):
        profparse.parse(tmp_path / "deep.json")


# -- invariants on random well-formed traces ------------------------------------------------------------------


@st.composite
def random_trace(draw) -> dict:
    b = TraceBuilder()
    t = 0.0
    for step in range(draw(st.integers(0, 3))):
        b.annotation(f"ProfilerStep#{step}", t, 1000)
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["fwd", "bwd", "opt", "plain", "load"]))
            start = t + draw(st.floats(0, 900))
            length = draw(st.floats(0.001, 80))
            if kind == "fwd":
                b.py("nn.Module: Linear_0", start, length)
                b.op("aten::mm", start + length / 4, length / 2)
                b.launch(start + length / 3, start + length, draw(st.floats(0.001, 50)), name="mm_kernel")
            elif kind == "bwd":
                b.op("autograd::engine::evaluate_function: MmBackward0", start, length, tid=AUTOGRAD)
                b.launch(start, start + length, draw(st.floats(0.001, 50)), tid=AUTOGRAD, name="mm_bwd")
            elif kind == "opt":
                b.annotation("Optimizer.step#AdamW.step", start, length)
                b.launch(start, start + 1, draw(st.floats(0.001, 50)), name="adam")
            elif kind == "load":
                b.py("transformers/modeling_utils.py(1): from_pretrained", start, length)
            else:
                b.op("aten::add", start, length, tid=draw(st.sampled_from([MAIN, AUTOGRAD, 999])))
                b.memory(start, draw(st.integers(-4096, 4096)), 8192)
        t += 1000
    return b.document()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=random_trace())
def test_invariants(tmp_path, doc):
    path = tmp_path / "random.json"
    path.write_text(json.dumps(doc))
    p = profparse.parse(path)
    events = p.events
    # each event has exactly one stage, from the known set, and a rule
    assert events["stage"].notna().all() and set(events["stage"].astype(str)) <= set(profparse.STAGES)
    assert events["stage_rule"].notna().all()
    # stage sums equal totals
    summary = p.stage_summary
    gpu = int(p.kernels["dur_ns"].sum())
    assert int(summary.loc[summary["scope"] == "total", "gpu_time_ns"].sum()) == gpu
    assert int(summary.loc[summary["scope"] != "total", "gpu_time_ns"].sum()) == gpu
    ops = int(p.ops["self_ns"].sum())
    assert int(summary.loc[summary["scope"] == "total", "host_op_ns"].sum()) == ops
    # deterministic
    again = profparse.parse(path)
    assert render_summary(p, fmt="json") == render_summary(again, fmt="json")
    # Parquet round trip
    out = write_parquet(p, tmp_path / "out", force=True)
    tables = read_parquet(out)
    assert tables["events"]["stage"].astype(str).tolist() == events["stage"].astype(str).tolist()
    assert tables["kernels"]["dur_ns"].astype("int64").tolist() == p.kernels["dur_ns"].astype("int64").tolist()
    assert copy.deepcopy(doc) == json.loads(path.read_text())  # the input is untouched
