"""Random GPU training traces (tests/random_gpu_traces.py) through every verb: no internal error, stage times that
add up, and the same answer from the cache as from the JSON; and real GPU runs as a capture of one activity kind
gives them. The seeds include ones that found faults (a diff of two traces without ops in a step, a zero-length
only step, overlapping steps); fuzz runs of the same generator and of real traces with parts taken out
(``scripts/fuzz_verbs.py``) found those."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from random_gpu_traces import random_gpu_trace, shifted

import profparse
from profparse.cli.main import main
from profparse.tables.registry import public_tables

#: pairs (A, B) of seeds: B is run through every verb, and diffed against A (B = 2, 1025, 7 found faults)
SEEDS = [(1, 2), (1024, 1025), (3, 4), (8, 7), (11, 12)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(folder: Path, seed: int) -> Path:
    path = folder / f"random{seed}.json"
    path.write_text(json.dumps(random_gpu_trace(seed)))
    return path


@pytest.mark.parametrize(("seed_a", "seed_b"), SEEDS, ids=[str(b) for _, b in SEEDS])
def test_every_verb_reads_a_random_gpu_trace(tmp_path, capsys, seed_a: int, seed_b: int) -> None:
    a, b = write(tmp_path, seed_a), write(tmp_path, seed_b)
    text = b.read_text()
    fresh = run(capsys, "summarize", str(b), "--no-cache", "--format", "json")
    assert fresh[0] == 0 and "internal error" not in fresh[2], fresh[2]
    verbs = [
        ["summarize", str(b), "--format", "json"],  # stored in the cache
        ["summarize", str(b), "--format", "json"],  # read from it
        ["summarize", str(b)],
        ["summarize", str(b), "--format", "csv"],
        ["summarize", str(b), "--no-marks"],
        ["advise", str(b)],
        ["report", str(b), "-o", str(tmp_path / "report.html")],
        ["annotate", str(b), "-o", str(tmp_path / "annotated.json")],
        ["parse", str(b), "-o", str(tmp_path / "tables")],
        ["diff", str(a), str(b)],
        ["diff", str(b), str(a), "--per-step"],
    ]
    for argv in verbs:
        code, out, err = run(capsys, *argv)
        assert code == 0 and "internal error" not in err, (argv, code, err)
        if argv[-2:] == ["--format", "json"]:
            assert out == fresh[1], argv  # the cache's answer is the JSON's
    assert b.read_text() == text  # the input is untouched
    assert_annotated(json.loads(text)["traceEvents"], tmp_path / "annotated.json")
    parsed = profparse.parse(b)
    summary = parsed.stage_summary
    total = summary[summary["scope"] == "total"]
    assert total["gpu_time_ns"].sum() == parsed.kernels["dur_ns"].sum()
    assert total["host_op_ns"].sum() == parsed.ops["self_ns"].sum()
    assert parsed.events["stage"].notna().all() and parsed.events["stage_rule"].notna().all()


@pytest.mark.parametrize("seed", [0, 5])
def test_every_table_is_the_same_in_any_order_and_from_the_cache(tmp_path, monkeypatch, seed: int) -> None:
    """Tables computed in a shuffled order, and read back from the cache, equal those computed in the registry's
    order from the JSON (seed 0: no allocation inside an op, whose op names the cache read back as None, not NaN)."""
    monkeypatch.setenv("PROFPARSE_CACHE_DIR", str(tmp_path / "cache"))
    path = write(tmp_path, seed)
    names = [spec.name for spec in public_tables()]
    fresh = profparse.load(path, cache=False)
    expected = {name: getattr(fresh, name) for name in names}
    random.Random(seed).shuffle(names)
    shuffled = profparse.load(path, cache=True)  # computes and stores them in this order
    stored = profparse.load(path, cache=True)
    for name in names:
        pd.testing.assert_frame_equal(getattr(shuffled, name), expected[name], obj=name)
    for name in names:
        pd.testing.assert_frame_equal(getattr(stored, name), expected[name], obj=f"{name} from the cache")


@pytest.mark.parametrize("seed", [8, 11])
def test_findings_do_not_move_with_the_trace_clock(tmp_path, capsys, seed: int) -> None:
    """The same trace with its clock ~54 years later (epoch microseconds, as 2021's Kineto wrote them) gives the
    same findings: a fix's host intervals were made float64 before the replay's base was taken off, and rounded
    to 256 ns there (seed 8: 111.5 us saved per step read 111.564)."""
    doc = random_gpu_trace(seed)
    early, late = tmp_path / "early.json", tmp_path / "late.json"
    early.write_text(json.dumps(doc))
    late.write_text(shifted(doc, 1_700_000_000_000_000))
    answers = []
    for path in (early, late):
        code, out, err = run(capsys, "advise", str(path), "--format", "json", "--no-cache")
        assert code == 0, err
        answers.append(json.loads(out.replace(str(path), "<trace>")))
    assert answers[0]["findings"] and answers[0] == answers[1]


def _without_positions(answer: dict) -> dict:
    """A summary without what names an event by its place in the file (``trace_index``)."""
    text = re.sub(r'"trace_index": \d+', '"trace_index": 0', json.dumps(answer))
    return json.loads(text)


@pytest.mark.parametrize("seed", [29, 35, 39, 49, 12, 73, 204, 206, 89, 497, 612])
def test_the_summary_does_not_depend_on_the_order_of_events_in_the_file(tmp_path, capsys, seed: int) -> None:
    """The trace's events shuffled give the same summary. Found by shuffling random traces: the main thread was
    the one holding the first ProfilerStep in the file (seed 35: steps on two threads), step ranges starting
    together were numbered in file order (29), and ties in the stream-overlap check (49), the top tables and the
    sync warning's names (39), the critical path's longest events (12, 73), the ops no FLOP formula counts (204),
    the host event the replayed path labels a piece by, where two cover it up to the step's end (206), and which
    of two host events with one span holds the other (89, 497: a step range and a user range, an autograd op)
    and the parent of a module called from two places (612: the class's time) followed the file."""
    doc = random_gpu_trace(seed)
    events = list(doc["traceEvents"])
    random.Random(str(seed)).shuffle(events)
    answers = []
    for name, listed in (("ordered", doc["traceEvents"]), ("shuffled", events), ("reversed", events[::-1])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**doc, "traceEvents": listed}))
        code, out, err = run(capsys, "summarize", str(path), "--format", "json", "--no-cache")
        assert code == 0, err
        answers.append(_without_positions(json.loads(out.replace(str(path), "<trace>"))))
    assert answers[0] == answers[1] == answers[2]


def assert_annotated(original: list[dict], annotated: Path) -> None:
    """annotate's promises: the trace's events first and unchanged, the new ones on a pid of their own, and no
    track's slices overlapping (Perfetto cannot draw that)."""
    events = json.loads(annotated.read_text())["traceEvents"]
    assert events[: len(original)] == original
    added = events[len(original) :]
    assert not {e["pid"] for e in added} & {e["pid"] for e in original}
    tracks = defaultdict(list)
    for e in added:
        if e["ph"] == "X":
            tracks[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for slices in tracks.values():
        slices.sort()
        assert all(end <= start + 1e-6 for (_, end), (start, _) in zip(slices[:-1], slices[1:], strict=True))


@pytest.mark.parametrize("keep", ["host", "gpu"])
@pytest.mark.parametrize("name", ["a100_ddp_rank0_nccl.json.gz", "mi250_minitoy.json.gz"])
def test_every_verb_reads_a_gpu_run_captured_with_one_activity_kind(tmp_path, capsys, name: str, keep: str) -> None:
    """``activities=[ProfilerActivity.CPU]`` on a GPU run (runtime calls and syncs, no GPU activity) and
    ``activities=[ProfilerActivity.CUDA]`` (GPU activity only), made from real traces: every verb answers (the
    host-only one made every verb exit 70)."""
    from conftest import REPO_GPU_TRACES

    from profparse.trace.kinds import GPU_TRACK_KINDS

    source = REPO_GPU_TRACES / name
    if not source.exists():
        pytest.skip(f"{source} not present")
    doc = json.loads(gzip.decompress(source.read_bytes()))
    on_gpu = lambda e: e.get("cat") in GPU_TRACK_KINDS  # noqa: E731
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M" or on_gpu(e) == (keep == "gpu")]
    path = tmp_path / f"{keep}_only.json"
    path.write_text(json.dumps(doc))
    for argv in (
        ["summarize", str(path)],
        ["advise", str(path)],
        ["report", str(path), "-o", str(tmp_path / "report.html")],
        ["annotate", str(path), "-o", str(tmp_path / "annotated.json")],
        ["diff", str(source), str(path)],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 0 and "internal error" not in err, (argv, code, err)
    parsed = profparse.parse(path)
    assert parsed.kernels.empty == (keep == "host") and parsed.ops.empty == (keep == "gpu")
    said = set(parsed.warnings["check"])  # and says which side the capture left out
    assert ("no_gpu_activity" in said, "no_host_events" in said) == (keep == "host", keep == "gpu")
    assert not {"no_gpu_activity", "no_host_events"} & set(profparse.parse(source).warnings["check"])
