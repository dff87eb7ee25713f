"""Adversarial command lines, file names and options (issue 25, items 7-10, 14 and nits).

Each case runs the CLI as a user does, in a fresh process (tests/adversarial.py), and asserts the documented
exit code, one ``profparse:`` line, no traceback, nothing left behind and inputs unchanged. Times are only compared
with a valid input measured in the same test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from adversarial import assert_clean_failure, assert_success, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes, /proc (Linux)")

#: b"tr\xffce.json" as Python holds it (PEP 383): a name that is not UTF-8, as a Linux file system allows
NOT_UTF8 = b"tr\xffce.json".decode("utf-8", "surrogateescape")


def small_trace(path: Path, steps: int = 3, kernel: str = "gemm_fwd") -> Path:
    """A few training steps with GPU kernels; ``kernel`` names the forward kernel."""
    b = TraceBuilder()
    t = 1000.0
    for step in range(steps):
        t = training_step(b, step, t)
        b.launch(t - 60, t - 58, 3, name=kernel)
    return b.write(path)


# -- 7. file names that are not UTF-8 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "extra"),
    [
        ("summarize", ["--format", "json"]),
        ("summarize", ["--format", "markdown"]),
        ("parse", ["-o", "{tmp}/out"]),
        ("plot", ["-o", "{tmp}/plots", "--kind", "stages", "--kind", "top_kernels", "--format", "png"]),
        ("report", ["-o", "{tmp}/page.html"]),
    ],
)
def test_a_trace_named_in_bytes_that_are_not_utf8(tmp_path: Path, verb: str, extra: list[str]) -> None:
    """report, parse and plot exited 70 (UnicodeEncodeError writing the page, the Parquet metadata; matplotlib's
    set_text on the title): the name is shown with the byte escaped, ``tr\\xffce.json``, everywhere."""
    trace = small_trace(tmp_path / NOT_UTF8)
    before = snapshot(trace)
    argv = [verb, str(trace), "--no-cache", *(a.format(tmp=tmp_path) for a in extra)]
    run = run_cli(*argv)
    assert_success(run, folders=(tmp_path,))
    assert snapshot(trace) == before
    if verb == "summarize":
        shown = json.loads(run.stdout)["trace"] if "json" in argv else run.stdout
        assert "tr\\xffce.json" in shown
    elif verb == "parse":
        import pyarrow.parquet as pq

        source = pq.read_schema(tmp_path / "out" / "events.parquet").metadata[b"profparse.source"]
        assert source.decode("utf-8").endswith("tr\\xffce.json")
    elif verb == "plot":
        assert (tmp_path / "plots" / "stages.png").stat().st_size > 0
    else:
        page = (tmp_path / "page.html").read_bytes().decode("utf-8")  # strict: the page is valid UTF-8
        assert "<title>profparse report: tr\\xffce.json</title>" in page


def test_a_rank_folder_of_names_that_are_not_utf8(tmp_path: Path) -> None:
    """``parse DIR`` wrote each rank's name into the dataset's tables (Arrow: UTF-8 only): every rank failed with
    an internal error, exit 70."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        small_trace(ranks / (b"rank%d_\xfe.json" % rank).decode("utf-8", "surrogateescape"), steps=2 + rank)
    out = tmp_path / "dataset"
    run = run_cli("parse", str(ranks), "-o", str(out), "--no-cache", "-j", "1")
    assert_success(run, folders=(tmp_path,))
    listed = run_cli("summarize", str(out), "--format", "json")
    assert_success(listed)
    files = sorted(r["file"] for r in json.loads(listed.stdout)["ranks"])
    assert [Path(f).name for f in files] == ["rank0_\\xfe.json", "rank1_\\xfe.json"], files


def test_an_output_folder_named_in_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Arrow takes paths as UTF-8 text: ``parse -o`` such a name is refused before any work (exit 11), not an
    internal error after parsing."""
    trace = small_trace(tmp_path / "t.json")
    out = tmp_path / b"out\xfe".decode("utf-8", "surrogateescape")
    run = run_cli("parse", str(trace), "-o", str(out), "--no-cache")
    assert_clean_failure(run, 11, contains="out\\xfe: cannot write", folders=(tmp_path,))
    assert not out.exists()
