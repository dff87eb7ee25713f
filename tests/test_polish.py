"""First-screen polish (issue 10, section 3): the ParsedTrace repr, a capture's run folder, memory rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO_GPU_TRACES, SAMPLE_TRACES
from conftest import parsed as cached_parse
from tracebuilder import TraceBuilder, memory_event, training_step

import profparse
from profparse.cli.main import main
from profparse.outputs.summary import render_summary

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
