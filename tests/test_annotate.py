"""``profparse annotate``: the original trace byte for byte plus stage tracks that cover the host and GPU activity."""

from __future__ import annotations

import gzip
import hashlib
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES, shared_traces
from conftest import parsed as parsed_once

import profparse
from profparse.analysis.stage_tracks import stage_intervals
from profparse.cli.main import main
from profparse.outputs.perfetto import LOAD_CATEGORY, PATH_CATEGORY, STAGE_CATEGORY, STAGE_PROCESS_NAME, write_annotated
from profparse.trace.kinds import GPU_ACTIVITY_KINDS

CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
TRACES = [CPU_MARKS, *shared_traces()]


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    x = np.frombuffer(a[:n], dtype=np.uint8)
    y = np.frombuffer(b[:n], dtype=np.uint8)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


def ns(us: Decimal | int) -> int:
    """Microseconds as written in the file (exact with ``parse_float=Decimal``) -> nanoseconds."""
    return int(Decimal(us) * 1000)


def covered(starts: np.ndarray, ends: np.ndarray, s: np.ndarray, e: np.ndarray, slack: int = 0) -> np.ndarray:
    """For each [s, e): is it inside one of the sorted, non-overlapping intervals [starts, ends)?"""
    i = np.searchsorted(starts, s + slack, side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    return ok & (starts[i] <= s + slack) & (ends[i] >= e - slack)


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_annotated_trace_keeps_every_original_byte_and_adds_stage_tracks(tmp_path, trace):
    parsed = parsed_once(need(trace))
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    out = tmp_path / "annotated.json.gz"
    result = write_annotated(parsed, out)
    assert result.path == out and not result.truncated_input
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before  # input untouched
    assert not [p for p in tmp_path.iterdir() if p.name != out.name]  # no temporary leftovers

    # byte level: output = input with one block inserted
    original, annotated = read(trace), read(out)
    k = first_difference(original, annotated)
    assert annotated[len(annotated) - (len(original) - k) :] == original[k:]
    assert len(annotated) > len(original)

    # JSON level: every original event, in order and unchanged; top-level keys unchanged
    doc, new_doc = json.loads(original), json.loads(annotated)
    n = len(doc["traceEvents"])
    assert new_doc["traceEvents"][:n] == doc["traceEvents"]
    assert {k: v for k, v in new_doc.items() if k != "traceEvents"} == {
        k: v for k, v in doc.items() if k != "traceEvents"
    }
    added = new_doc["traceEvents"][n:]
    pids = {e.get("pid") for e in doc["traceEvents"]}
    (pid,) = {e["pid"] for e in added}
    assert pid not in pids
    names = {(e["name"], e["tid"]): e["args"]["name"] for e in added if e["ph"] == "M" and "name" in e["args"]}
    assert names[("process_name", 0)] == STAGE_PROCESS_NAME
    slices = [e for e in added if e["ph"] == "X" and e["cat"] == STAGE_CATEGORY]
    assert len(slices) == result.intervals > 0
    substeps = [e for e in added if e["ph"] == "X" and e["cat"] == LOAD_CATEGORY]
    assert len(substeps) == result.substeps
    path = [e for e in added if e["ph"] == "X" and e["cat"] == PATH_CATEGORY]  # tests/test_critical_path_outputs.py
    assert len(path) == result.path_segments == len(parsed.critical_path)
    assert len(slices) + len(substeps) + len(path) == sum(1 for e in added if e["ph"] == "X")
    for e in slices:
        assert e["cat"] == STAGE_CATEGORY
        assert e["name"] == e["args"]["stage"]
        assert e["args"]["rule"]
        assert "step" in e["args"]
        assert e["dur"] >= 0
        assert ("thread_name", e["tid"]) in names


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_stage_slices_cover_gpu_and_host_activity(tmp_path, trace):
    parsed = parsed_once(need(trace))
    out = tmp_path / "annotated.json"
    write_annotated(parsed, out)
    doc = json.loads(out.read_bytes(), parse_float=Decimal)
    tracks = stage_intervals(parsed, disjoint=True).tracks
    label_to_key = {f"stages: {r.label}": (r.pid, r.tid) for r in tracks.itertuples(index=False)}
    thread_names = {
        e["tid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == 0x7F0000
    }
    slices: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == STAGE_CATEGORY:
            key = label_to_key[thread_names[e["tid"]]]
            slices.setdefault(key, []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["args"]["stage"]))
    # slices on one track never overlap (Perfetto nests or rejects overlapping slices)
    for items in slices.values():
        items.sort()
        assert all(a[1] <= b[0] for a, b in zip(items, items[1:], strict=False))

    events = parsed.events
    kind = events["kind"].astype(str)
    gpu = events[kind.isin(GPU_ACTIVITY_KINDS)]
    host = events[kind.isin(["cpu_op", "cuda_runtime"]) & (events["dur_ns"] > 0)]
    for frame, must_match_stage in ((gpu, True), (host, False)):
        for (pid, tid), group in frame.groupby(["pid", "tid"]):
            items = slices.get((pid, tid))
            assert items, f"no stage track for {(pid, tid)}"
            starts = np.array([a for a, _, _ in items])
            ends = np.array([b for _, b, _ in items])
            s = group["ts_ns"].to_numpy()
            e = s + group["dur_ns"].to_numpy()
            inside = covered(starts, ends, s, e)
            assert inside.mean() >= (1.0 if must_match_stage else 0.99), (pid, tid, inside.mean())
            if must_match_stage:  # a GPU activity lies in a slice of its own stage
                idx = np.searchsorted(starts, s, side="right") - 1
                got = np.array([items[i][2] for i in idx])
                assert (got == group["stage"].astype(str).to_numpy()).all()


def test_a_step_range_that_overlaps_its_stages_does_not_replace_them(tmp_path):
    """prof.step() opens ProfilerStep#1 before the loop enters the Python frame that runs the step: the range
    overlaps the step's stages without holding them. The annotated main-thread track showed all of step 1 as
    "other" (its forward and optimizer slices clipped away behind the range's); each stage keeps its slice, and
    every op on the thread lies in a slice of its own stage."""
    from tracebuilder import step_begun_before_its_frame

    parsed = parsed_once(step_begun_before_its_frame(tmp_path / "t.json"))
    out = tmp_path / "annotated.json"
    write_annotated(parsed, out)
    doc = json.loads(out.read_bytes(), parse_float=Decimal)
    main_label = "stages: thread 100 (pt_main_thread)"
    tid = next(e["tid"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("pid") == 0x7F0000
               and e.get("name") == "thread_name" and e["args"]["name"] == main_label)  # fmt: skip
    slices = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["args"]["stage"]) for e in doc["traceEvents"]
                    if e.get("cat") == STAGE_CATEGORY and e["tid"] == tid)  # fmt: skip
    starts = np.array([a for a, _, _ in slices])
    ops = parsed.events[(parsed.events["kind"] == "cpu_op") & (parsed.events["tid"] == 100)]
    where = np.searchsorted(starts, ops["ts_ns"].to_numpy(), side="right") - 1
    assert [slices[i][2] for i in where] == ops["stage"].astype(str).tolist() == ["forward", "optimizer"] * 2


def test_loading_sub_steps_get_their_own_track(tmp_path):
    parsed = parsed_once(need(CPU_MARKS))
    breakdown = getattr(parsed, "load_breakdown", None)
    if breakdown is None or breakdown.empty:
        pytest.skip("no loading sub-steps (profparse.analysis not available)")
    out = tmp_path / "a.json"
    result = write_annotated(parsed, out)
    assert result.substeps > 0
    doc = json.loads(out.read_bytes(), parse_float=Decimal)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    slices = [e for e in doc["traceEvents"] if e.get("cat") == LOAD_CATEGORY]
    assert {names[e["tid"]] for e in slices} == {"load sub-steps: thread 8297 (python)"}
    spans = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in slices)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    per_step: dict[str, int] = {}
    for e in slices:
        assert e["args"]["stage"] == "load" and e["name"] == e["args"]["substep"]
        per_step[e["name"]] = per_step.get(e["name"], 0) + ns(e["dur"])
    expected = breakdown.set_index(breakdown["substep"].astype(str))["time_ns"]
    assert set(per_step) == set(expected[expected > 0].index)
    for name, total in per_step.items():  # the slices hold the sub-step's time (gaps and overlaps aside)
        assert total == pytest.approx(int(expected[name]), rel=0.15, abs=50_000), name


def test_truncated_input_keeps_its_complete_events(tmp_path):
    full = read(need(SHARED_TRACES / "mi250_minitoy.json.gz"))
    doc = json.loads(full)
    cut = full[: int(len(full) * 0.6)]
    src = tmp_path / "cut.json"
    src.write_bytes(cut)
    parsed = profparse.parse(src)
    assert parsed.raw.report.truncated
    out = tmp_path / "cut_annotated.json"
    result = write_annotated(parsed, out)
    assert result.truncated_input
    new_doc = json.loads(out.read_bytes())
    kept = [e for e in new_doc["traceEvents"] if e.get("cat") != STAGE_CATEGORY and e.get("pid") != 0x7F0000]
    assert kept == doc["traceEvents"][: len(kept)]
    assert len(kept) == parsed.raw.report.events_read
    assert out.read_bytes().startswith(cut[: first_difference(cut, out.read_bytes())])


def test_annotate_verb_never_overwrites_or_touches_its_input(tmp_path, capsys):
    trace = need(CPU_MARKS)
    out = tmp_path / "a.json.gz"
    assert main(["annotate", str(trace), "-o", str(out)]) == 0
    assert "stage slices" in capsys.readouterr().err
    stamp = out.stat().st_mtime_ns
    assert main(["annotate", str(trace), "-o", str(out), "-q"]) == 6
    assert out.stat().st_mtime_ns == stamp
    copy = tmp_path / "copy.json.gz"
    copy.write_bytes(trace.read_bytes())
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert main(["annotate", str(copy), "-o", str(copy), "--force", "-q"]) == 9  # refused: it is the input
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_labels_are_each_rows_text_and_nan_where_missing() -> None:
    """A categorical column's texts, each made once, are its rows' (and "nan" where missing: a JSON string, as
    pandas 2's ``astype(str)`` gave; pandas 3 keeps it missing, which would write JSON's invalid ``NaN``)."""
    import pandas as pd

    from profparse.outputs.perfetto import _labels

    quoted = 'é"x'
    column = pd.Series(pd.Categorical(["b", None, "a", quoted, "b", None], categories=["a", "b", quoted, "unused"]))
    for values in (column, column.astype(object)):  # categorical, or plain strings
        codes, texts = _labels(values)
        assert [texts[c] for c in codes] == ["b", "nan", "a", quoted, "b", "nan"]


@pytest.mark.parametrize("count", [0, 1, 5, 6, 13])
def test_new_events_written_a_block_at_a_time_are_the_joined_text(monkeypatch, count: int) -> None:
    """The new events go out a block at a time: the same bytes as all of them joined by ``,\\n``, and the
    loading sub-step and critical path slices counted."""
    import io

    from profparse.outputs import perfetto

    monkeypatch.setattr(perfetto._NewEvents, "BLOCK", 3)
    categories = [perfetto.LOAD_CATEGORY, perfetto.PATH_CATEGORY, perfetto.STAGE_CATEGORY]
    events = [f'{{"ph":"X","cat":"{categories[i % 3]}","name":"é{i}"}}' for i in range(count)]
    new = perfetto._NewEvents(iter(events))
    out = io.BytesIO()
    new.write(out)
    assert out.getvalue() == ",\n".join(events).encode("utf-8")
    assert new.counts == {perfetto.LOAD_CATEGORY: (count + 2) // 3, perfetto.PATH_CATEGORY: (count + 1) // 3}
