"""The summary (outputs/summary): shares of the step and step totals add up, every section is in every format, a
new analysis section is one entry, top kernels have distinct readable labels."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO_GPU_TRACES, SAMPLE_TRACES
from conftest import parsed as cached_parse
from tracebuilder import TraceBuilder, training_step

import profparse
from profparse.base.formats import Column, Table
from profparse.outputs import summary
from profparse.outputs.summary import LABEL_WIDTH, render, render_summary, summary_data

SUMMARY_TRACES = [
    SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz",
    REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz",
    REPO_GPU_TRACES / "mi250_minitoy.json.gz",
]


def _summary_trace(path: Path):
    if not path.is_file():
        pytest.skip(f"{path} not in this clone")
    return cached_parse(path)


@pytest.mark.parametrize("path", SUMMARY_TRACES, ids=[p.name for p in SUMMARY_TRACES])
def test_shares_and_step_totals_add_up(path):
    trace = _summary_trace(path)
    data = summary_data(trace)
    assert sum(r["share"] for r in data["totals"]) == pytest.approx(1.0, abs=1e-12)
    whole = sum(r["host_wall_ns"] for r in data["totals"])
    for r in data["totals"]:
        assert r["share"] == pytest.approx(r["host_wall_ns"] / whole)
    per_step = trace.stage_summary.query("scope == 'step'")
    steps = trace.steps.set_index("step")
    assert [t["step"] for t in data["step_totals"]] == steps.index.tolist()
    for t in data["step_totals"]:
        rows = per_step[per_step["step"] == t["step"]]
        assert t["host_wall_ns"] == rows["host_wall_ns"].sum()
        assert t["gpu_busy_ns"] == rows["gpu_busy_ns"].sum()
        assert t["window_ns"] == steps.loc[t["step"], "end_ns"] - steps.loc[t["step"], "start_ns"]
    # the steps' totals and the time outside them are all the stages' host wall
    outside = trace.stage_summary.query("scope == 'outside_steps'")["host_wall_ns"].sum()
    assert sum(t["host_wall_ns"] for t in data["step_totals"]) + outside == whole
    text = render_summary(trace)
    assert max(len(line) for line in text.splitlines()[1:]) <= 100  # the first line holds the trace's path


def _two_steps(tmp_path: Path) -> Path:
    b = TraceBuilder()
    training_step(b, 1, 0)
    training_step(b, 2, 100)
    return b.write(tmp_path / "two_steps.json")


def test_step_total_and_share_ground_truth(tmp_path):
    # per step (tracebuilder.training_step): forward = nn.Module frame 1-21 us on the main thread (its op and
    # launch inside it), backward = the autograd node 30-60 us, optimizer = Optimizer.step 70-90 us; the rest of
    # the 100 us ProfilerStep is its own time, which belongs to no stage
    data = summary_data(profparse.parse(_two_steps(tmp_path)))
    walls = {r["stage"]: r["host_wall_ns"] for r in data["totals"]}
    assert walls == {"load": 0, "forward": 40_000, "backward": 60_000, "optimizer": 40_000, "other": 0}
    shares = {r["stage"]: r["share"] for r in data["totals"]}
    assert shares == pytest.approx({"load": 0, "forward": 2 / 7, "backward": 3 / 7, "optimizer": 2 / 7, "other": 0})
    assert data["step_totals"] == [  # step 1 holds the first optimizer step: warm-up
        {"step": 1, "host_wall_ns": 70_000, "gpu_busy_ns": 35_000, "window_ns": 100_000, "steady": False},
        {"step": 2, "host_wall_ns": 70_000, "gpu_busy_ns": 35_000, "window_ns": 100_000, "steady": True},
    ]
    steady = {r["stage"]: r["host_wall_ns"] for r in data["steady_totals"]}  # step 2's alone
    assert steady == {"load": 0, "forward": 20_000, "backward": 30_000, "optimizer": 20_000, "other": 0}
    text = render(data)
    per_step = text.split("Per step")[1].split("\n\n")[0]
    row = next(line.split() for line in per_step.splitlines() if line.strip().startswith("1 "))
    # step, load, forward host | busy, backward, optimizer, other, step total host | busy, window
    assert row == ["1", "-", "0.02", "|", "0.01", "0.03", "|", "0.02", "0.02", "|", "0.01", "-", "0.07", "|", "0.04",
                   "0.10"]  # fmt: skip
    totals = text.split("Stage totals")[1].split("\n\n")[0]
    assert [line.split()[2] for line in totals.splitlines()[3:]] == ["0.0%", "28.6%", "42.9%", "28.6%", "0.0%"]


def _section_titles(text: str) -> list[str]:
    """The section titles of a text summary: unindented lines after a blank line, without their note."""
    lines = text.splitlines()
    return [line.split(" (")[0] for prev, line in zip(lines, lines[1:], strict=False) if not prev and line[:1].strip()]


@pytest.mark.parametrize("path", SUMMARY_TRACES, ids=[p.name for p in SUMMARY_TRACES])
def test_markdown_and_csv_carry_every_section_of_the_text(path):
    trace = _summary_trace(path)
    data = summary_data(trace)
    titles = _section_titles(render(data))
    assert {"Stage totals", "Per step", "Top ops", "Which rules decided"} <= set(titles)
    markdown = render(data, "markdown")
    assert [line[3:] for line in markdown.splitlines() if line.startswith("## ")] == titles
    frame = pd.read_csv(io.StringIO(render(data, "csv")))
    assert list(frame.columns[:2]) == ["step", "stage"]
    assert list(dict.fromkeys(frame["section"])) == titles
    # csv keeps raw numbers: the stage totals are the json's
    totals = frame[(frame["section"] == "Stage totals") & (frame["column"] == "host_wall_ns")]
    assert dict(zip(totals["stage"], totals["value"].astype("int64"), strict=True)) == {
        r["stage"]: r["host_wall_ns"] for r in data["totals"]
    }
    window = frame[(frame["section"] == "Per step") & (frame["column"] == "window_ns")]
    assert window["value"].astype("int64").tolist() == [t["window_ns"] for t in data["step_totals"]]


def test_a_new_section_is_one_entry(monkeypatch, tmp_path):
    extra = summary.Section(
        data=lambda parsed: {"answer": [{"stage": "forward", "value_ns": 42_000_000}]},
        tables=lambda data: [
            Table("Answers", [Column("stage", "stage"), Column("value_ns", "ms", lambda v: f"{v / 1e6:.2f}")],
                  data["analyses"]["answer"])
        ],
    )  # fmt: skip
    monkeypatch.setattr(summary, "SECTIONS", [*summary.SECTIONS, extra])
    data = summary_data(profparse.parse(_two_steps(tmp_path)))
    assert data["analyses"]["answer"] == [{"stage": "forward", "value_ns": 42_000_000}]
    assert "\nAnswers\n" in render(data) and "42.00" in render(data)
    assert "## Answers" in render(data, "markdown")
    assert "forward,Answers,,value_ns,42000000" in render(data, "csv")


def test_top_kernels_have_distinct_readable_labels_and_json_keeps_the_name():
    trace = _summary_trace(REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz")
    data = summary_data(trace)
    items = [item for key in ("top_kernels", "top_ops") for stage in data[key].values() for item in stage]
    full = set(trace.kernels["name"].astype(str)) | set(trace.ops["name"].astype(str))
    assert all(item["name"] in full for item in items)  # the exact name, as the trace has it
    labels = {}
    for item in items:
        assert labels.setdefault(item["name"], item["label"]) == item["label"]  # one label per name
        assert len(item["label"]) <= LABEL_WIDTH
    assert len(set(labels.values())) == len(labels)
    multi = [item["label"] for item in data["top_kernels"]["optimizer"]]
    assert len(multi) == 2
    assert all(x.startswith("multi_tensor_apply_kernel<TensorListMetadata, BinaryOp") for x in multi)
    assert not any("[2]" in x or "at::" in x or "anonymous" in x for x in multi)  # told apart by their functors
    text = render(data)
    assert all(x in text for x in multi) and "void at::native" not in text


def test_the_steps_line_names_a_loading_step():
    """scripts/capture.py announces "load + 3 steps": the summary's four ProfilerSteps say that step 0 is the load."""
    from conftest import SAMPLE_TRACES, SHARED_TRACES

    import profparse

    marked = profparse.summarize(str(SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz")).splitlines()[1]
    assert "4 steps (ProfilerStep): step 0 loads the model, 3 training steps" in marked
    ddp = profparse.summarize(str(SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz")).splitlines()[1]
    assert "steps (ProfilerStep)," in ddp and "load" not in ddp  # no step there only loads


def test_release_gives_back_what_the_summary_computed_and_keeps_what_was_held() -> None:
    """``summary_data(release=True)`` (summarize's): the same data, with the tables and values it made only for
    itself given back (the path, the replay model, the FLOP counts, ops and kernels: half of summarize's peak on
    a big trace); what the caller held before is kept, and a table given back is made again, equal, if asked."""
    trace = REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz"
    plain = summary_data(profparse.parse(trace))
    released = profparse.parse(trace)
    released.table("ops")  # held by the caller: kept
    data = summary_data(released, release=True)
    assert data == plain
    held = released.computed()
    assert "ops" in held
    assert not {"critical_path", "replay_model", "flop_counts", "kernels"} & held, held
    assert released.table("critical_path").equals(profparse.parse(trace).table("critical_path"))


def test_the_report_payload_released_is_the_same_and_gives_back_what_only_one_part_reads() -> None:
    """``trace_payload(release=True)`` (the report verb's): the same page data; the summary gives back the big
    tables it made, and each view what no other view reads once it is made (those views first); only those are
    made twice; what the caller held before is kept."""
    from profparse.outputs.report import trace_payload
    from profparse.outputs.views import READ_ONLY_BY

    trace = REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz"
    plain = trace_payload(profparse.parse(trace))
    released = profparse.parse(trace)
    released.table("kernels")  # held by the caller: kept, made once
    made: list[str] = []
    table, value = type(released).table, type(released).value

    def counted(self, name, keep=True):
        if name not in self.computed():
            made.append(name)
        return table(self, name, keep)

    def counted_value(self, name):
        if name not in self.computed():
            made.append(name)
        return value(self, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(released), "table", counted)
        patch.setattr(type(released), "value", counted_value)
        payload = trace_payload(released, release=True)
    assert payload == plain
    given_back = {name for names in READ_ONLY_BY.values() for name in names} - {"kernels"}
    assert not (given_back | {"replay_model"}) & released.computed(), released.computed()
    assert "kernels" in released.computed()
    twice = sorted({name for name in made if made.count(name) > 1})
    assert set(twice) <= given_back and "critical_path" in twice, twice
    assert made.count("kernels") == 0


def test_a_long_capture_prints_its_first_and_last_steps(tmp_path):
    """40 steps: the terminal's per-step table shows the first 14 and the last 5 with a row of dots between and
    says how many it left out; markdown and csv keep every step."""
    b = TraceBuilder()
    t = 0.0
    for step in range(1, 41):
        t = training_step(b, step, t) + 1
    data = summary_data(profparse.parse(b.write(tmp_path / "steps.json")))
    table = render(data).split("\nPer step")[1].split("\n\n")[0].splitlines()
    body = table[3 : next(i for i, line in enumerate(table) if line.startswith("  ("))]  # title, head, rule
    rows = [line.split()[0] for line in body]
    assert rows == [str(s) for s in range(1, 15)] + ["..."] + [str(s) for s in range(36, 41)]
    assert "  (21 rows left out here: --format markdown, csv or json lists them all)" in table
    markdown = render(data, "markdown").split("## Per step")[1].split("\n## ")[0]
    assert all(f"\n| {s} |" in markdown for s in range(1, 41))
    frame = pd.read_csv(io.StringIO(render(data, "csv")))
    per_step = frame[(frame["section"] == "Per step") & (frame["column"] == "window_ns")]
    assert sorted(per_step["step"].astype(int)) == list(range(1, 41))


def test_per_step_footer_names_a_step_with_only_gpu_work(tmp_path):
    """A kernel still running when the trace began is GPU work of a step whose host part is not in the trace: its
    row has no window, and the footer says why; a trace without one says nothing of it."""
    from test_report import ground_truth_trace
    from tracebuilder import gpu_work_before_first_step

    text = render(summary_data(cached_parse(gpu_work_before_first_step(tmp_path / "t.json"))))
    row = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert row.split()[-1] == "-"
    assert "step 0: only GPU work in the trace (no window" in text
    plain = render(summary_data(cached_parse(ground_truth_trace(tmp_path / "gt.json"))))
    assert "window: the step's span" in plain and "only GPU work" not in plain


def _top_by_pandas(frame: pd.DataFrame, value: str, n: int) -> dict[str, list[tuple[str, int, int, float]]]:
    """The top table as plain pandas says it: (name, count, total, share) of each stage's ``n`` largest sums,
    ties by name."""
    out: dict[str, list[tuple[str, int, int, float]]] = {}
    for stage in profparse.STAGES:
        rows = frame[frame["stage"] == stage]
        total = int(rows[value].sum())
        sums = rows.dropna(subset=["name"]).groupby("name", observed=True)[value].agg(["sum", "count"])
        ranked = sorted(
            ((-int(s), str(k), int(c)) for k, s, c in zip(sums.index, sums["sum"], sums["count"], strict=True))
        )
        out[stage] = [(name, c, -s, (-s / total) if total else 0.0) for s, name, c in ranked[:n]]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_top_names_per_stage_are_the_largest_sums_ties_by_name(seed: int) -> None:
    """Random kernels-like frames: names missing or shared, equal sums, stages missing or empty, any order."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = int(rng.integers(0, 60))
    names = [f"k{i}" for i in range(int(rng.integers(1, 9)))] + ["z", "a"]
    stage = pd.Categorical(rng.choice([*profparse.STAGES, None], rows), categories=list(profparse.STAGES))
    name = pd.Categorical(rng.choice([*names, None], rows), categories=[*names, "unused"])
    frame = pd.DataFrame({"stage": stage, "name": name, "dur_ns": rng.choice([0, 5, 10, 2**40], rows)})
    for n in (1, 3, 5):
        got = summary._top(frame, "dur_ns", n, kernel=True)
        assert list(got) == list(profparse.STAGES)
        plain = {s: [(r["name"], r["count"], r["total_ns"], r["share"]) for r in got[s]] for s in got}
        assert plain == _top_by_pandas(frame, "dur_ns", n)
