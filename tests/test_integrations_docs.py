"""docs/integrations.md runs as written: the code blocks under each heading are extracted and executed in order in
an empty folder holding ``trace.json.gz`` and ``traces/`` (two rank traces), then what they wrote is checked."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TRACES

PAGE = REPO / "docs" / "integrations.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def section_blocks(title: str) -> list[tuple[str, str]]:
    """The ``(language, code)`` blocks under the ``## title`` heading, in order (python and sh only)."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return [(lang, code) for lang, code in BLOCK.findall(body) if lang in ("python", "sh")]


def run_section(title: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Execute the section's blocks in ``folder``: Python in this process (one namespace), each ``profparse`` line
    of a shell block as ``python -m profparse`` (which must exit 0). The Python namespace after the last block."""
    blocks = section_blocks(title)
    assert blocks, f"no code under '## {title}'"
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__docs__"}
    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, f"{PAGE.name}:{title}", "exec"), namespace)
            continue
        for line in code.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                assert words[0] == "profparse", line
                subprocess.run([sys.executable, "-m", "profparse", *words[1:], "-q"], check=True, timeout=600)
    return namespace


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copy(SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz", tmp_path / "trace.json.gz")
    (tmp_path / "traces").mkdir()
    shutil.copy(SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz", tmp_path / "traces" / "rank0.json.gz")
    shutil.copy(SAMPLE_TRACES / "qwen2_tiny_cpu_nomarks.json.gz", tmp_path / "traces" / "rank1.json.gz")
    return tmp_path


def test_the_handler_example(folder: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    pytest.importorskip("torch")
    namespace = run_section("torch.profiler handler", folder, monkeypatch)
    (files,) = namespace["handler"].cycles
    assert Path(files.folder).resolve() == folder / "prof" / "step-5"  # the folder the page's commands name
    assert {Path(files.trace).exists(), Path(files.summary).exists(), Path(files.report).exists()} == {True}
    assert (folder / "ranks.html").stat().st_size > 0
    assert "biggest stage" in capfd.readouterr().out


def test_the_duckdb_example(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("duckdb")
    import profparse

    per_stage = run_section("DuckDB over the Parquet output", folder, monkeypatch)["per_stage"]
    ops = profparse.load(folder / "trace.json.gz").ops
    assert sorted(per_stage["stage"]) == sorted(ops["stage"].astype(str).unique())
    assert per_stage["ops"].sum() == len(ops)
    assert per_stage["self_ms"].sum() == pytest.approx(ops["self_ns"].sum() / 1e6)


def test_the_dask_example(folder: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("duckdb")
    namespace = run_section("Dask for many ranks", folder, monkeypatch)
    assert not namespace["run"].failed
    out = capsys.readouterr().out
    assert {int(m) for m in re.findall(r"^│\s+(\d+) │", out, re.MULTILINE)} == {0, 1}  # duckdb's rows, per rank
