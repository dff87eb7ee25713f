"""The critical path's outputs (issue 21): the report's view and section, the ``critical path`` track of
``annotate`` and the path's make-up in ``diff``. A hand-built step with a known path (python 0-10 us, an op, its
launch, an 885 us kernel, a synchronize) gives exact answers; a copy whose kernel runs 100 us longer changes the
path by exactly that; real traces check that the outputs equal the ``critical_path`` table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import SHARED_TRACES
from conftest import parsed as parsed_once
from test_report import dump_dom, payload, read_dom, write
from tracebuilder import GPU_PID, TraceBuilder, complete_events

import profparse
from profparse.diff import diff_data, render
from profparse.outputs.perfetto import CRITICAL_PATH_TRACK, PATH_CATEGORY, write_annotated
from profparse.outputs.summary import summary_data
from profparse.outputs.views import critical_path as view
from profparse.outputs.views import views
from profparse.tables.parsed import ParsedTrace

US = 1000
KERNEL_US = 885
REAL = [SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz", SHARED_TRACES / "v100_ns_resolution_5steps.json.gz"]


def _step_trace(path: Path, longer_us: float = 0) -> Path:
    """One step: Python 10 us, aten::mm 2 us launching a kernel of 885 (+ ``longer_us``) us, a synchronize that
    returns 5 us after the kernel, Python to the step's end (test_critical_path.test_gpu_compute_bound)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000 + longer_us)
    b.op("aten::mm", 10, 10)
    b.launch(12, 15, KERNEL_US + longer_us, name="gemm")
    b.correlation += 1
    b.span("cudaDeviceSynchronize", 30, 875 + longer_us, "cuda_runtime", correlation=b.correlation)
    return b.write(path)


@pytest.fixture(scope="module")
def step(tmp_path_factory) -> ParsedTrace:
    return profparse.load(_step_trace(tmp_path_factory.mktemp("cp") / "step.json"), cache=False)


def _ns_by_bound(parsed: ParsedTrace) -> dict[str, int]:
    path = parsed.table("critical_path")
    ns = path["end_ns"] - path["start_ns"]
    return {str(k): int(v) for k, v in ns.groupby(path["bound"].astype(str)).sum().items() if v}


# -- the view ---------------------------------------------------------------------------------------------------


def test_view_spans_are_the_known_path(step) -> None:
    prepared, why = view.data(step, pixels=100_000)  # a pixel of 10 ns: only same-bound runs merge
    assert why is None
    spans = prepared["spans"]
    bounds = [prepared["bounds"][code] for code in spans.bound]
    columns = (bounds, spans.start_ns, spans.end_ns, spans.segments)
    got = [(b, s // US, e // US, n) for b, s, e, n in zip(*columns, strict=True)]
    assert got == [
        ("python", 0, 10, 1),
        ("cpu_op", 10, 12, 1),
        ("launch", 12, 15, 2),  # the call and the latency to the kernel's start on an idle stream
        ("gpu_compute", 15, 900, 1),
        ("sync_wait", 900, 905, 1),
        ("python", 905, 1000, 1),
    ]
    assert prepared["names"][spans.name[3]] == "gemm"
    assert prepared["stages"][spans.stage[3]] == str(step.table("critical_path")["stage"].iloc[4])
    make_up = {b: int(ns) for b, ns in prepared["per_step"].loc[1].items()}
    assert make_up == {"python": 105 * US, "cpu_op": 2 * US, "launch": 3 * US, "gpu_compute": 885 * US,
                       "sync_wait": 5 * US}  # fmt: skip


def test_view_merges_segments_shorter_than_a_pixel_by_their_main_bound(step) -> None:
    prepared, _ = view.data(step, pixels=2)  # a pixel of 500 us
    spans = prepared["spans"]
    bounds = [prepared["bounds"][code] for code in spans.bound]
    columns = (bounds, spans.start_ns, spans.end_ns, spans.segments)
    got = [(b, s // US, e // US, n) for b, s, e, n in zip(*columns, strict=True)]
    # 0-15: python 10 us beats launch 3 us and cpu_op 2 us; 900-1000: python 95 us beats sync_wait 5 us
    assert got == [("python", 0, 15, 4), ("gpu_compute", 15, 900, 1), ("python", 900, 1000, 2)]


def test_view_names_a_span_by_its_longest_segment_the_first_of_equals() -> None:
    """A span merges short segments of one step: it is named by the longest of them, the first where two are as
    long, and takes the bound with most time."""
    import pandas as pd

    rows = [  # step, start, end, bound, name: one 10 us pixel holds 0-10 in step 1, 10-20 in step 2
        (1, 0, 3, "python", "a"), (1, 3, 6, "cpu_op", "b"), (1, 6, 9, "python", "c"), (1, 9, 10, "launch", "d"),
        (2, 10, 12, "cpu_op", "e"), (2, 12, 16, "python", "f"), (2, 16, 20, "cpu_op", "g"),
    ]  # fmt: skip
    path = pd.DataFrame(rows, columns=["step", "start_ns", "end_ns", "bound", "name"])
    path = path.assign(stage="forward", bound=path["bound"].astype("category"), name=path["name"].astype("category"))
    spans = view._runs(path, 10, 0)
    assert spans["name"].tolist() == ["a", "f"]  # 3 ns each for a, b, c: the first; f and g 4 ns: the first
    assert spans["bound"].tolist() == ["python", "cpu_op"]  # python 6 of 10 ns; cpu_op 6 of 10
    assert spans["segments"].tolist() == [4, 3]


def test_summary_section_sums_the_path_by_stage_and_bound_and_ranks_events_by_their_time_on_it() -> None:
    """The summary's section against a plain pandas count of the same rows: ns per stage and bound, and the
    longest events (all their segments summed; rows without an event left out; of equals, the one first on the
    path, then the earlier in the file; an event whose segments are all empty still ranks, after every longer
    one)."""
    import numpy as np
    import pandas as pd

    from profparse.analysis.critical_path import BOUNDS
    from profparse.base.marks import STAGES
    from profparse.outputs.summary.critical_path import critical_path_data
    from profparse.trace.kinds import NULL

    rng = np.random.default_rng(7)
    n = 400
    index = rng.integers(0, 60, n)
    index[rng.random(n) < 0.1] = NULL  # GPU idle: no event
    lengths = rng.integers(0, 50, n)
    lengths[index == 5] = 0  # event 5: on the path, 0 ns
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    path = pd.DataFrame(
        {
            "step": rng.integers(1, 4, n),
            "stage": pd.Categorical(rng.choice(["forward", "backward", "optimizer"], n), categories=list(STAGES)),
            "bound": pd.Categorical(rng.choice(["python", "cpu_op", "gpu_compute"], n), categories=list(BOUNDS)),
            "start_ns": starts,
            "end_ns": starts + lengths,
            "trace_index": index,
        }
    )
    path["name"] = pd.Categorical([f"e{i}" for i in index])
    # two events of 1 ns each, below every other one but 5: the one first on the path first
    for event in (12, 11):
        rows = path.index[path["trace_index"] == event]
        path.loc[rows, "end_ns"] = path.loc[rows, "start_ns"]
        path.loc[rows[:1], "end_ns"] += 1

    data = critical_path_data(path, top=70)
    ns = path["end_ns"] - path["start_ns"]
    cells = ns.groupby([path["stage"], path["bound"]], observed=True).sum()
    expected = {
        stage: {bound: int(v) for (s, bound), v in cells.items() if s == stage and v}
        for stage in STAGES
        if cells.get(stage, pd.Series(dtype=int)).sum()
    }
    assert {r["stage"]: r["bounds"] for r in data["per_stage"]} == expected
    assert [r["stage"] for r in data["per_stage"]] == [s for s in STAGES if s in expected]
    assert all(r["total_ns"] == sum(r["bounds"].values()) for r in data["per_stage"])
    assert data["steps"] == path["step"].nunique()

    on_path = path[path["trace_index"] != NULL]
    totals = ns[on_path.index].groupby(on_path["trace_index"]).sum()
    first = on_path.groupby("trace_index")["start_ns"].min()
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], first[kv[0]], kv[0]))
    assert [(r["trace_index"], r["ns"]) for r in data["longest"]] == ranked[:70]
    assert len(ranked) < 70 and ranked[-1] == (5, 0)  # the empty event is listed, last
    ones = [k for k, v in ranked if v == 1]  # equals: the earlier on the path first, whatever their indexes
    assert sorted(ones) == [11, 12] and first[ones[0]] < first[ones[1]]
    cut = critical_path_data(path, top=len(ranked) - 2)["longest"]  # between the two of 1 ns
    assert [r["trace_index"] for r in cut] == [k for k, _ in ranked[:-2]] and cut[-1]["trace_index"] == ones[0]
    first = on_path.groupby("trace_index", observed=True).first()
    for r in data["longest"]:
        assert (r["name"], r["step"], r["stage"], r["bound"]) == tuple(
            str(first.loc[r["trace_index"], c]) if c != "step" else int(first.loc[r["trace_index"], c])
            for c in ("name", "step", "stage", "bound")
        )


@pytest.mark.parametrize("trace", REAL, ids=[p.name for p in REAL])
def test_view_spans_tile_the_steps_as_the_table_does(trace: Path) -> None:
    if not trace.exists():
        pytest.skip(f"{trace} not present")
    parsed = parsed_once(trace)
    prepared, _ = view.data(parsed, max_rects=2000, pixels=40_000)
    spans, path = prepared["spans"], parsed.table("critical_path")
    assert len(spans) <= 2000 < len(path)
    assert int((spans.end_ns - spans.start_ns).sum()) == int((path.end_ns - path.start_ns).sum())
    assert (spans.start_ns.to_numpy()[1:] >= spans.end_ns.to_numpy()[:-1]).all()  # in order, never overlapping
    assert int(spans.segments.sum()) == len(path) == prepared["segments"]
    make_up = {b: int(ns) for b, ns in prepared["per_step"].sum().items() if ns}
    assert make_up == _ns_by_bound(parsed)
    per_step = path.assign(ns=path.end_ns - path.start_ns).groupby("step")["ns"].sum()
    assert prepared["per_step"].sum(axis=1).to_dict() == per_step.to_dict()  # each step's path is its window
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.close(views()["critical_path"].draw(prepared))


# -- annotate -----------------------------------------------------------------------------------------------------


def test_annotate_track_is_the_path(step, tmp_path) -> None:
    out = write_annotated(step, tmp_path / "annotated.json")
    events = list(complete_events(out.path.read_bytes()))
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices = [e for e in events if e.get("cat") == PATH_CATEGORY]
    assert {names[e["tid"]] for e in slices} == {CRITICAL_PATH_TRACK}
    assert out.path_segments == len(slices) == 7
    t0 = min(e["ts"] for e in events if e.get("pid") != GPU_PID and e.get("name") == "ProfilerStep#1")
    got = [(e["name"], round(e["ts"] - t0, 3), round(e["ts"] + e["dur"] - t0, 3)) for e in slices]
    assert got == [("python", 0, 10), ("cpu_op", 10, 12), ("launch", 12, 13), ("launch", 13, 15),
                   ("gpu_compute", 15, 900), ("sync_wait", 900, 905), ("python", 905, 1000)]  # fmt: skip
    assert all(e["args"]["bound"] == e["name"] and e["args"]["step"] == 1 for e in slices)
    kernel = slices[4]["args"]
    assert kernel["event"] == "gemm" and kernel["trace_index"] >= 0


def test_annotate_puts_overlapping_steps_on_tracks_of_their_own(tmp_path) -> None:
    """Steps whose ranges overlap (steps 1 and 2 here; 3 follows both) each tile their window, so their paths
    overlap: the later overlapping step goes on ``critical path 2`` (Perfetto cannot draw overlapping slices on one
    track) and step 3 back on the first track, which is free by then."""
    b = TraceBuilder()
    for step, start, length in ((1, 0, 100), (2, 60, 100), (3, 200, 50)):
        b.annotation(f"ProfilerStep#{step}", start, length)
        b.op("aten::add", start + 5, 20)
        b.launch(start + 6, start + 30, 10, name=f"add_{step}")
    parsed = profparse.load(b.write(tmp_path / "overlap.json"), cache=False)
    out = write_annotated(parsed, tmp_path / "annotated.json")
    events = list(complete_events(out.path.read_bytes()))
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    slices = [e for e in events if e.get("cat") == PATH_CATEGORY]
    pid = slices[0]["pid"]
    track_of = {e["args"]["step"]: names[e["tid"]] for e in slices}
    assert track_of == {1: CRITICAL_PATH_TRACK, 2: f"{CRITICAL_PATH_TRACK} 2", 3: CRITICAL_PATH_TRACK}
    assert out.path_segments == len(slices) == len(parsed.table("critical_path"))
    for tid in {e["tid"] for e in slices}:
        on = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["tid"] == tid)
        assert all(end <= start + 1e-6 for (_, end), (start, _) in zip(on[:-1], on[1:], strict=True)), names[tid]
    for step, window in ((1, 100), (2, 100), (3, 50)):  # each step's slices still tile its window
        assert sum(e["dur"] for e in slices if e["args"]["step"] == step) == pytest.approx(window)
    named = [e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == pid]
    assert len(named) == len(set(named))  # the extra track takes no other track's tid


# -- diff ---------------------------------------------------------------------------------------------------------


def _path_rows(data: dict) -> dict[tuple[str, str], dict]:
    return {(r["stage"], r["bound"]): r for r in data["critical_path"]}


def test_diff_of_a_trace_against_itself_is_zero(step) -> None:
    rows = _path_rows(diff_data(step, step))
    assert rows and all(r["delta_ns"] == 0 and r["a_ns"] == r["b_ns"] for r in rows.values())
    assert rows[("all", "all")]["a_ns"] == 1000 * US
    assert {b: int(rows[("all", b)]["a_ns"]) for b in _ns_by_bound(step)} == _ns_by_bound(step)


def test_diff_shows_exactly_one_known_change(step, tmp_path) -> None:
    longer = profparse.load(_step_trace(tmp_path / "longer.json", longer_us=100), cache=False)
    data = diff_data(step, longer)
    changed = {key: r["delta_ns"] for key, r in _path_rows(data).items() if r["delta_ns"]}
    stage = str(step.table("critical_path").set_index("bound").loc["gpu_compute", "stage"])
    assert changed == {(stage, "gpu_compute"): 100 * US, (stage, "all"): 100 * US, ("all", "gpu_compute"): 100 * US,
                       ("all", "all"): 100 * US}  # fmt: skip
    text = render(data, "text")
    section = text[text.index("Critical path by stage and bound") :]
    assert re.search(r"all\s+gpu_compute\s+0\.89\s+0\.98\s+\+0\.10\s+\+11\.3%", section), section
    markdown = render(data, "markdown")
    assert "## Critical path by stage and bound" in markdown
    assert "| all | gpu_compute | 0.89 | 0.98 | +0.10 | +11.3% |" in markdown
    assert json.loads(render(data, "json"))["critical_path"] == json.loads(json.dumps(data["critical_path"]))


def test_diff_per_step_divides_by_the_steps(step) -> None:
    rows = _path_rows(diff_data(step, step, per_step=True))
    assert rows[("all", "all")]["a_ns"] == 1000 * US  # one step


# -- the report ---------------------------------------------------------------------------------------------------


def _cp_cells(dom: str) -> dict[tuple[str, str], int]:
    cells = re.findall(r'data-cp-stage="([^"]+)" data-cp-bound="([^"]+)" data-cp-value="(\d+)"', dom)
    return {(s, b): int(v) for s, b, v in cells}


def _summary_cells(parsed: ParsedTrace) -> dict[tuple[str, str], int]:
    """The summary's critical path cells as the report's table keys them, with its column replayed without the
    profiler (``without_profiler``) where the trace has steady steps."""
    section = summary_data(parsed)["critical_path"]
    cells = {(r["stage"], b): ns for r in section["per_stage"] for b, ns in r["bounds"].items()}
    free = section.get("without_profiler") or {}
    return cells | {("without_profiler", b): ns for b, ns in (free.get("bounds") or {}).items() if ns}


def test_report_draws_the_path_on_the_timeline_and_shows_the_summarys_table(tmp_path) -> None:
    trace = _step_trace(tmp_path / "step.json")
    page = write(trace, tmp_path / "r.html")
    views = payload(page)["views"]
    assert views["critical_path"]["native"] and "png" not in views["critical_path"]
    cp, tl = views["critical_path"]["data"], views["timeline"]["data"]
    dom = dump_dom(page)
    read_dom(dom)
    cells = _cp_cells(dom)
    expected = _summary_cells(profparse.load(trace, cache=False))
    assert {k: v for k, v in cells.items() if k[1] != "all" and k[0] != "total" and v} == expected
    assert cells[("total", "all")] == 1000 * US
    row = int(re.search(r'data-path-row="(\d+)"', dom).group(1))
    assert row == len(tl["tracks"]["index"])  # the row below the tracks
    j = cp["spans"]["cols"]["bound"].index(cp["bounds"].index("gpu_compute"))  # the kernel, at the middle of its span
    mid = (
        cp["origin_ns"] - tl["origin_ns"] + (cp["spans"]["cols"]["start_ns"][j] + cp["spans"]["cols"]["end_ns"][j]) // 2
    )
    tip = re.search(r'data-probe="([^"]*)"', dump_dom(page, f"?probe={row},{mid}")).group(1)
    assert tip.startswith("critical path, step 1") and "bound: gpu_compute" in tip and "event: gemm" in tip


@pytest.mark.parametrize("trace", REAL, ids=[p.name for p in REAL])
def test_report_of_a_real_trace_shows_the_path(trace: Path, tmp_path) -> None:
    if not trace.exists():
        pytest.skip(f"{trace} not present")
    page = write(trace, tmp_path / "r.html")
    dom = dump_dom(page)
    read_dom(dom)
    cells = _cp_cells(dom)
    parsed = parsed_once(trace)
    assert {k: v for k, v in cells.items() if k[1] != "all" and k[0] != "total" and v} == _summary_cells(parsed)
    path = parsed.table("critical_path")
    assert cells[("total", "all")] == int((path.end_ns - path.start_ns).sum())
    free = {b: ns for (s, b), ns in cells.items() if s == "without_profiler" and b != "all"}
    assert cells.get(("without_profiler", "all"), 0) == sum(free.values())  # the replayed column adds up
    assert re.search(r'data-path-row="\d+"', dom)


def test_docs_example_table_is_todays_output() -> None:
    """docs/critical_path.md's "What bounds each step" example is the text summary of the trace it names, as
    profparse prints it today (it had gone stale: a column and the python/other split had changed)."""
    trace = SHARED_TRACES / "v100_resnet50_legacy2021.json.gz"
    if not trace.is_file():
        pytest.skip("no ../shared/traces/v100_resnet50_legacy2021.json.gz")
    from profparse.outputs.summary import render_summary

    text = render_summary(parsed_once(trace))
    doc = (Path(__file__).resolve().parents[1] / "docs" / "critical_path.md").read_text()
    block = doc[doc.index("```\nWhat bounds each step") + 4 :]
    block = block[: block.index("```")].rstrip("\n")
    start = text.index("What bounds each step")
    assert text[start : start + len(block)] == block
