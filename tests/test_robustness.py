"""Broken and hostile traces, generated here: truncations, bit flips, type changes; and invariants (hypothesis)."""

from __future__ import annotations

import copy
import gzip
import json
import random
import zlib

import pytest
import tracebuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracebuilder import AUTOGRAD, MAIN, TraceBuilder, training_step

import profparse
from profparse.base.errors import ProfparseError
from profparse.cli.main import main
from profparse.outputs.parquet import read_parquet, write_parquet
from profparse.outputs.summary import render_summary
from profparse.trace import decode
from profparse.trace.events import read_trace


def base_document(steps: int = 3) -> dict:
    b = TraceBuilder()
    for step in range(steps):
        training_step(b, step, step * 100)
    b.memory(3, 4096, 4096)
    return b.document()


def cli(capsys, path) -> tuple[int, str]:
    """``summarize PATH``'s exit code and stderr. Without the cache: each broken file is read once, and storing
    its tables was a third of each run (the cache's own handling of cut and broken traces is tested in
    test_cache_replay.py and test_adversarial_cache.py)."""
    code = main(["summarize", str(path), "--no-cache"])
    _, err = capsys.readouterr()
    return code, err


def complete_events(text: bytes) -> int:
    """How many events of a (possibly cut) document are complete, by the standard json module; -1 without an
    event array."""
    if b'"traceEvents": [' not in text:
        return -1
    return sum(1 for _ in tracebuilder.complete_events(text))


def test_truncation_at_many_offsets(capsys, tmp_path):
    doc = base_document()
    text = json.dumps(doc, indent=1).encode()
    path = tmp_path / "cut.json"
    for cut in range(1, len(text), max(1, len(text) // 40)):  # 40 cuts: each is a whole summarize
        path.write_bytes(text[:cut])
        code, err = cli(capsys, path)
        expected = complete_events(text[:cut])
        if expected < 0:  # cut before the event array starts: not a trace
            assert code == 4 and err.startswith("profparse: error:"), (cut, err)
            continue
        assert code == 0 and "truncated" in err, (cut, err)
        assert "Traceback" not in err and "internal error" not in err
        raw = read_trace(path)
        assert raw.report.truncated and raw.report.events_read == expected, cut  # every complete event, no more


def test_bit_flips_in_gzip(capsys, tmp_path):
    text = json.dumps(base_document()).encode()
    data = bytearray(gzip.compress(text))
    rng = random.Random(1234)
    path = tmp_path / "flipped.json.gz"
    seen = set()
    for _ in range(40):
        broken = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            broken[rng.randrange(10, len(broken))] ^= 1 << rng.randrange(8)  # past the header (mtime, flags)
        path.write_bytes(bytes(broken))
        code, err = cli(capsys, path)
        inflate = zlib.decompressobj(31)
        try:
            inflated = inflate.decompress(bytes(broken))
        except zlib.error:
            seen.add("corrupt")
            assert code == 4 and "corrupt compressed data" in err, err
            continue
        if not inflate.eof:  # the flips ended the deflate stream early: read like a cut file
            seen.add("cut")
            expect_code = 0 if complete_events(inflated) >= 0 else 4
            assert code == expect_code, err
        else:  # only bits inflate ignores (padding after the last block) were hit
            seen.add("intact")
            assert inflated == text and code == 0, err
    assert "corrupt" in seen


def test_byte_changes_in_plain_json(capsys, tmp_path):
    """One byte changed inside the event array: a valid document reads whole; a broken event is skipped (exit 0,
    counted) in a large file, and is an error where it is more than 1% of a small one."""
    doc = base_document(steps=300)
    data = bytearray(json.dumps(doc).encode())
    first, last = data.index(b'"traceEvents": [') + 17, data.rindex(b"]")
    rng = random.Random(99)
    path = tmp_path / "changed.json"
    outcomes = set()
    for _ in range(25):
        broken = bytearray(data)
        broken[rng.randrange(first, last)] = rng.choice(b'{}[]",:0a\\\x00\xff')
        path.write_bytes(bytes(broken))
        code, err = cli(capsys, path)
        assert code == 0 and "internal error" not in err, err
        try:
            json.loads(bytes(broken))
        except ValueError:
            outcomes.add("malformed")
            raw = read_trace(path)
            skipped = raw.report.dropped.get("malformed JSON (skipped to the next event)", 0)
            assert skipped == 1 and "malformed JSON" in err, err
            assert len(doc["traceEvents"]) - 3 <= len(raw.events) + sum(raw.report.dropped.values()) - 1
        else:
            outcomes.add("valid")
            assert "malformed" not in err
    assert "malformed" in outcomes
    small = json.dumps(base_document()).encode()
    at = small.index(b'"pid": 1', len(small) // 2)
    path.write_bytes(small[:at] + b'"pid" 1' + small[at + 8 :])
    code, err = cli(capsys, path)
    assert code == 4 and "malformed JSON near byte" in err and "more than 1%" in err, err


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=5), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    index=st.integers(0, 40),
    field=st.sampled_from(["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id", "correlation", "Bytes"]),
    value=ODD_VALUES,
)
def test_type_changes_are_repaired_or_dropped_never_raised(tmp_path, index, field, value):
    doc = base_document()
    event = doc["traceEvents"][index % len(doc["traceEvents"])]
    if field in ("correlation", "Bytes"):
        event.setdefault("args", {})[field] = value
    else:
        event[field] = value
    path = tmp_path / "typed.json"
    path.write_text(json.dumps(doc))
    parsed = profparse.parse(path)  # a value of an odd type is never a reason to refuse the trace
    render_summary(parsed)
    assert parsed.events["stage"].notna().all()
    kept, dropped = len(parsed.raw.events), sum(parsed.raw.report.dropped.values())
    assert kept + dropped == len(doc["traceEvents"])  # every event is kept or counted as dropped
    assert dropped <= 1


def test_hostile_sizes_are_refused_or_bounded(tmp_path, monkeypatch):
    doc = base_document()
    doc["traceEvents"][5]["name"] = "x" * (3 << 20)  # a 3 MB name: kept exactly, once
    path = tmp_path / "long.json"
    path.write_text(json.dumps(doc))
    parsed = profparse.parse(path)
    assert len(parsed.events) == len(doc["traceEvents"])
    assert parsed.raw.events["name"].iloc[5] == doc["traceEvents"][5]["name"]
    monkeypatch.setattr(decode, "MAX_EVENT_BYTES", 2 << 20)  # the bound: one event may not exceed it
    with pytest.raises(ProfparseError, match="an event larger than 2 MB"):
        read_trace(path, workers=1)
    deep = '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": ' + "[" * 100000 + "]" * 100000 + "}]}"
    (tmp_path / "deep.json").write_text(deep)
    with pytest.raises(ProfparseError, match="nested too deeply"):
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


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
