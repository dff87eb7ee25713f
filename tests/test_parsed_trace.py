"""ParsedTrace as a user first sees it: its repr is a few lines with the facts."""

from __future__ import annotations

import pytest
from conftest import REPO_GPU_TRACES, SAMPLE_TRACES
from conftest import parsed as cached_parse

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
