"""First-screen polish (issue 10, section 3): the ParsedTrace repr, a capture's run folder, memory rows, the summary's
shares, step totals, kernel labels and sections in every format."""

from __future__ import annotations

import ast
import importlib.metadata
import io
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, REPO_GPU_TRACES, SAMPLE_TRACES
from conftest import parsed as cached_parse
from tracebuilder import TraceBuilder, memory_event, training_step

import profparse
from profparse.outputs.summary import analyses as analysis_report
from profparse.base.formats import Column, Table
from profparse.cli.main import main
from profparse.hta import HTA_DISTRIBUTIONS, hta_distribution
from profparse.outputs.summary import LABEL_WIDTH, render, render_summary, summary_data

REPR_TRACES = [SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz", REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz"]


@pytest.mark.parametrize("path", REPR_TRACES, ids=[p.name for p in REPR_TRACES])
def test_repr_is_a_few_lines_with_the_facts(path):
    if not path.is_file():
        pytest.skip(f"{path} not in this clone")
    trace = cached_parse(path)
    text = repr(trace)
    lines = text.splitlines()
    assert len(lines) <= 10 and len(text) <= 800, text
    assert lines[0] == f"ParsedTrace({str(path)!r})"
    assert f"{len(trace.events):,}" in lines[1]
    steps = trace.steps
    assert f"steps:    {len(steps)} ({steps['step'].min()}-{steps['step'].max()}" in text
    totals = trace.stage_summary.query("scope == 'total'")
    stages_line = next(line for line in lines if line.lstrip().startswith("stages:"))
    for row in totals.itertuples():
        assert (f"{row.stage} " in stages_line) == (row.host_wall_ns > 0), (row.stage, stages_line)
    devices_line = next(line for line in lines if line.lstrip().startswith("devices:"))
    gpu_devices = sorted(set(trace.kernels["device"].dropna().astype(int)))
    assert devices_line.split(":", 1)[1].split(";")[0].strip() == ", ".join(["CPU"] + [f"GPU {d}" for d in gpu_devices])
    assert f"warnings: {len(trace.warnings)} " in text


# -- a capture's run folder ------------------------------------------------------------------------------------------


def _run_folder(folder: Path, manifest: dict | None = None, extra_trace: bool = False) -> Path:
    """A hand-built trace written as ``profparse capture`` lays out a run: trace.json.gz + manifest.json."""
    folder.mkdir()
    b = TraceBuilder()
    for step in range(3):
        training_step(b, step, step * 100)
    b.write(folder / "trace.json.gz")
    if extra_trace:
        b.write(folder / "trace2.json.gz")
    if manifest is None:
        manifest = {"format": 1, "kind": "profparse.capture", "trace": {"file": "trace.json.gz"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_on_a_capture_run_folder_is_its_trace(capsys, tmp_path):
    folder = _run_folder(tmp_path / "run")
    code, folder_out, _ = _cli(capsys, "summarize", str(folder), "--format", "json")
    assert code == 0
    code, trace_out, _ = _cli(capsys, "summarize", str(folder / "trace.json.gz"), "--format", "json")
    assert code == 0
    assert folder_out == trace_out
    data = json.loads(folder_out)
    assert data["trace"] == str(folder / "trace.json.gz") and "stragglers" not in data
    code, text, _ = _cli(capsys, "summarize", str(folder))
    assert code == 0 and "straggler" not in text.lower() and "forward" in text


@pytest.mark.parametrize(
    ("manifest", "extra_trace"),
    [({"kind": "something else", "trace": {"file": "trace.json.gz"}}, False), (None, True)],
    ids=["foreign-manifest", "two-traces"],
)
def test_other_folders_stay_folders_of_ranks(capsys, tmp_path, manifest, extra_trace):
    folder = _run_folder(tmp_path / "run", manifest, extra_trace)
    code, folder_out, _ = _cli(capsys, "summarize", str(folder), "--format", "json")
    _, trace_out, _ = _cli(capsys, "summarize", str(folder / "trace.json.gz"), "--format", "json")
    assert code == 0 and folder_out != trace_out
    assert "stragglers" in json.loads(folder_out)  # the folder-of-ranks table


def test_parse_on_a_capture_run_folder_writes_one_trace_tables(capsys, tmp_path):
    folder = _run_folder(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, _, _ = _cli(capsys, "parse", str(folder), "-o", str(tmp_path / "tables"), "--quiet")
    assert code == 0
    assert (tmp_path / "tables" / "events.parquet").is_file()
    assert not list((tmp_path / "tables").glob("*/rank=*"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# -- memory rows that add up -----------------------------------------------------------------------------------------


def test_reserve_only_events_are_not_counted_as_allocated(tmp_path):
    b = TraceBuilder()
    training_step(b, 1, 0)  # forward op 2-17 us
    host = {"device_type": 0, "device_id": -1}
    memory_event(b, 3, 8, 8, reserved=0, **host)
    memory_event(b, 4, 16, 24, reserved=0, **host)
    memory_event(b, 5, 1_000_000, 24, reserved=1_000_000, **host)  # a pool reserved: Total Allocated unchanged
    memory_event(b, 6, -8, 16, reserved=0, **host)
    memory_event(b, 7, 32, 48, reserved=0, **host)
    trace = profparse.parse(b.write(tmp_path / "t.json"))
    m = trace.memory_by_stage
    row = m[(m["scope"] == "total") & (m["stage"] == "forward")].iloc[0]
    assert (row["start_allocated_bytes"], row["end_allocated_bytes"], row["peak_allocated_bytes"]) == (0, 48, 48)
    assert (row["alloc_bytes"], row["freed_bytes"], row["alloc_count"], row["free_count"]) == (56, 8, 3, 1)
    assert row["peak_reserved_bytes"] == 1_000_000
    assert list(trace.memory["bytes"]) == [8, 16, 1_000_000, -8, 32]  # the timeline keeps every event as read
    text = render_summary(trace)
    assert "reserve-only events count in reserved peak" in text


def test_sample_capture_load_row_adds_up():
    path = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not in this clone")
    m = cached_parse(path).memory_by_stage
    load = m[(m["scope"] == "total") & (m["stage"] == "load")].iloc[0]
    assert load["start_allocated_bytes"] + load["alloc_bytes"] - load["freed_bytes"] == load["end_allocated_bytes"]
    assert load["alloc_bytes"] <= load["peak_allocated_bytes"] - load["start_allocated_bytes"] + load["freed_bytes"]
    assert load["peak_reserved_bytes"] > load["peak_allocated_bytes"]  # the reserved pool is still shown


# -- the summary: share of the step, step total, readable kernel names, every section in every format ---------------

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
    assert data["step_totals"] == [
        {"step": 1, "host_wall_ns": 70_000, "gpu_busy_ns": 35_000, "window_ns": 100_000},
        {"step": 2, "host_wall_ns": 70_000, "gpu_busy_ns": 35_000, "window_ns": 100_000},
    ]
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


def test_a_new_analysis_section_is_one_entry(monkeypatch, tmp_path):
    extra = analysis_report.Section(
        data=lambda parsed: {"answer": [{"stage": "forward", "value_ns": 42_000_000}]},
        tables=lambda analyses: [
            Table("Answers", [Column("stage", "stage"), Column("value_ns", "ms", lambda v: f"{v / 1e6:.2f}")],
                  analyses["answer"])
        ],
    )  # fmt: skip
    monkeypatch.setattr(analysis_report, "SECTIONS", [*analysis_report.SECTIONS, extra])
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


# -- packaging: every import declared, HTA from either distribution -------------------------------------------------

#: Imports that only optional code makes, and the extra that declares them; every other import of src/ is core.
OPTIONAL_IMPORTS = {"hta": "hta", "torch": "capture", "transformers": "capture", "safetensors": "capture",
                    "distributed": "dask", "dask": "dask"}  # fmt: skip


def _third_party_imports(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "profparse"}


def _requirement_names(requirements: list[str]) -> set[str]:
    """Distribution names a list of requirements installs; ``dask[distributed]`` counts ``distributed`` too (that
    extra of dask is the distribution of that name)."""
    names = set()
    for r in requirements:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", r)
        names.add(match.group(1))
        names |= {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return {n.lower().replace("_", "-") for n in names}


def test_every_import_of_src_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    # a module's distribution as installed here; the HTA module comes from either of two
    dist_of = {
        m: {d.lower().replace("_", "-") for d in ds} for m, ds in importlib.metadata.packages_distributions().items()
    }
    dist_of["hta"] = {d.lower() for d in HTA_DISTRIBUTIONS}
    imports = _third_party_imports(REPO / "src" / "profparse")
    assert {"numpy", "pandas", "pyarrow", "msgspec", "matplotlib", "tqdm", "hta", "torch"} <= imports
    for module in sorted(imports):
        dists = dist_of.get(module, {module})
        extra = OPTIONAL_IMPORTS.get(module)
        if extra is None:
            assert dists & core, f"src imports {module} ({dists}) but it is not a core dependency"
        else:
            assert dists & extras[extra], f"{module} ({dists}) is not in the {extra} extra"
            assert not dists & core, f"{module} is optional (the {extra} extra), not core"
    assert extras["hta"] == {"traceinsight"}  # the maintained distribution of HTA (0.6+)


def test_hta_distribution_prefers_traceinsight(monkeypatch):
    installed = {"traceinsight": "0.6.1", "HolisticTraceAnalysis": "0.5.0"}

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert hta_distribution() == ("traceinsight", "0.6.1")
    del installed["traceinsight"]
    assert hta_distribution() == ("HolisticTraceAnalysis", "0.5.0")
    installed.clear()
    assert hta_distribution() is None


def test_install_hints_say_checkout_and_index(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "hta", None)  # makes "import hta" fail
    assert main(["hta", str(tmp_path / "whatever.json.gz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("profparse: error: HTA is not installed") and err.count("\n") == 1
    assert "pip install -e '.[hta]'" in err and "pip install 'profparse[hta]'" in err
    hinted = [p for p in (REPO / "src").rglob("*.py") if "profparse[" in p.read_text(encoding="utf-8")]
    assert [p.name for p in hinted] == ["errors.py"]  # every hint comes from errors.install_hint
