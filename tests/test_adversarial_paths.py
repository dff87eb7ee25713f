"""Adversarial inputs for the report paths: deep nesting and cut traces stay linear; hostile names stay inert.

Times are only compared with a valid input of the same size measured in the same test (tests/adversarial.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from adversarial import assert_success, assert_time_within, run_cli, snapshot
from tracebuilder import MAIN, PID, STREAM, TraceBuilder

from profparse.base.formats import display, md_cell, md_code, terminal_safe
from profparse.base.names import shorten_name
from profparse.outputs.summary.analyses import _nested_in_same_class

UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# -- quadratic paths ---------------------------------------------------------------------------------------------------


def modules_trace(path: Path, n: int, *, nested: bool) -> Path:
    """``n`` ``nn.Module`` calls of ``n`` different classes: each inside the one before (``nested``) or in a row."""
    b = TraceBuilder(autograd_thread=False)
    for i in range(n):
        if nested:
            b.py(f"nn.Module: L{i}", 1000 + i, 2 * (n - i) + 1)
        else:
            b.py(f"nn.Module: L{i}", 1000 + 3 * i, 2)
    return b.write(path)


@pytest.mark.parametrize("n", [2000, 8000])
def test_summarize_deep_module_nesting_is_linear(tmp_path, n):
    """10k nested levels took 117 s (flat: 1.5 s): same-class nesting, levels and roll-ups went level by level."""
    flat = run_cli(
        "summarize", "--format", "json", "-q", str(modules_trace(tmp_path / "flat.json", n, nested=False)), fresh=True
    )
    deep = run_cli(
        "summarize", "--format", "json", "-q", str(modules_trace(tmp_path / "deep.json", n, nested=True)), fresh=True
    )
    assert_success(flat)
    assert_success(deep)
    assert_time_within(deep, flat, factor=3.0)
    for run, depth in ((flat, 0), (deep, n - 1)):
        analyses = json.loads(run.stdout)["analyses"]
        assert analyses["module_count"] == n
        classes = analyses["modules_by_class"]
        assert len(classes) == n and max(c["depth"] for c in classes) == depth
    # nested: each module includes all below it, so the outermost holds the whole chain's time
    deep_classes = {c["class"]: c for c in json.loads(deep.stdout)["analyses"]["modules_by_class"]}
    assert deep_classes["L0"]["forward_host_ns"] == (2 * n + 1) * 1000
    assert deep_classes[f"L{n - 1}"]["forward_host_ns"] == 3 * 1000


def test_same_class_nesting_by_hand():
    """Seq_0 > Lin_0 > Seq_1 > Lin_1, and Lin_2 beside Seq_0: Seq_1 and Lin_1 are inside their own class."""
    names = ["Seq_0", "Lin_0", "Seq_1", "Lin_1", "Lin_2"]
    parents = ["", "Seq_0", "Lin_0", "Seq_1", ""]
    classes = ["Seq", "Lin", "Seq", "Lin", "Lin"]
    assert _nested_in_same_class(names, parents, classes) == {"Seq_1", "Lin_1"}
    # parent links in a cycle (a hand-made trace): the walk ends, and a module never counts as its own ancestor
    assert _nested_in_same_class(["A_0", "B_0"], ["B_0", "A_0"], ["A", "B"]) == set()
    assert _nested_in_same_class(["A_0", "A_1"], ["A_1", "A_0"], ["A", "A"]) == {"A_1"}


def big_trace(path: Path, events: int) -> bytes:
    """A trace of ``events`` ops whose args hold argument lists (many ``]`` near the end, as real traces do)."""
    b = TraceBuilder(autograd_thread=False)
    b.annotation("ProfilerStep#1", 0, 10 * events + 10)
    for i in range(events):
        b.op("aten::add", 1 + 10 * i, 5, **{"Input Dims": [[4, 8], [4, 8], []], "Input type": ["float", "", ""]})
    b.write(path)
    return path.read_bytes()


def test_annotate_cut_trace_is_linear(tmp_path):
    """A cut 12.5 MB trace took 196 s to annotate (summarize: 0.7 s): every ']' candidate copied the tail."""
    text = big_trace(tmp_path / "whole.json", 40_000)
    cut = text.rfind(b'"name": "aten::add"') + 5  # inside the last event
    (tmp_path / "cut.json").write_bytes(text[:cut])
    before = snapshot(tmp_path / "whole.json", tmp_path / "cut.json")
    whole = run_cli("annotate", "-q", str(tmp_path / "whole.json"), "-o", str(tmp_path / "a_whole.json"), fresh=True)
    cutrun = run_cli("annotate", "-q", str(tmp_path / "cut.json"), "-o", str(tmp_path / "a_cut.json"), fresh=True)
    assert_success(whole, folders=(tmp_path,))
    assert_success(cutrun, folders=(tmp_path,))
    assert_time_within(cutrun, whole, factor=3.0)
    assert snapshot(tmp_path / "whole.json", tmp_path / "cut.json") == before
    out_whole = json.loads((tmp_path / "a_whole.json").read_text())["traceEvents"]
    out_cut = json.loads((tmp_path / "a_cut.json").read_text())["traceEvents"]
    original = json.loads(text)["traceEvents"]
    assert out_whole[: len(original)] == original
    assert out_cut[: len(original) - 1] == original[:-1]  # every complete event, the cut one left out
    added = out_cut[len(original) - 1 :]
    assert added and all(
        e.get("cat") in ("profparse_stage", "profparse_load", "profparse_critical_path") or e["ph"] == "M"
        for e in added
    )


# -- terminal injection ------------------------------------------------------------------------------------------------

KERNEL = "gemm\x1b[2J\x1b]0;pwned\x07|`x`\r\nrow\x00end"
OP = "aten::mm|``evil``\x9b31m\u202etxt.exe"
THREAD = "thread 100 (\x1b[31mred\x1b[0m)"
DEVICE = "GPU\x07\x1b[1m|bold`"
MODULE = "Lin\u202e|`k`"


def hostile_trace(path: Path, kernel_us: float) -> Path:
    b = TraceBuilder(autograd_thread=False)
    b.events[0]["args"]["name"] = THREAD
    b.header["deviceProperties"] = [{"id": 0, "name": DEVICE}]
    b.annotation("ProfilerStep#1", 0, 200)
    b.py(f"nn.Module: {MODULE}_0", 1, 150)
    b.op(OP, 2, 100)
    b.launch(3, 5, kernel_us, name=KERNEL)
    b.events.append(
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": STREAM, "args": {"name": "stream 7 \x1b[5mblink"}}
    )
    assert PID and MAIN  # the builder's host thread is the one renamed above
    return b.write(path)


def _md_cells(line: str) -> int:
    """Cells in a markdown table row: ``|`` not escaped by a backslash (GFM splits rows on those alone)."""
    return len(re.sub(r"\\.", "", line).split("|")) - 2


def _check_markdown(text: str) -> None:
    assert not UNSAFE.search(text), repr(UNSAFE.search(text))
    width = None
    for line in text.splitlines():
        if line.startswith("|"):
            if width is None:
                width = _md_cells(line)
            assert _md_cells(line) == width, line
            assert line.endswith("|")
        else:
            width = None


def test_hostile_names_are_escaped_in_text_and_markdown(tmp_path):
    a = hostile_trace(tmp_path / "a\x1b[31m.json", 10)
    b = hostile_trace(tmp_path / "b.json", 30)
    runs = {
        "summary text": run_cli("summarize", "-q", str(a)),
        "summary md": run_cli("summarize", "-q", "--format", "markdown", str(a)),
        "diff text": run_cli("diff", "-q", str(a), str(b)),
        "diff md": run_cli("diff", "-q", "--format", "markdown", str(a), str(b)),
    }
    for label, run in runs.items():
        assert_success(run)
        assert not UNSAFE.search(run.stdout), (label, repr(UNSAFE.search(run.stdout)))
        assert "\\x1b" in run.stdout, label  # shown, as a visible escape
        if "md" in label:
            _check_markdown(run.stdout)
    summary = runs["summary text"].stdout
    # kernels show by their short label (outputs/names.py: whitespace, \r\n included, collapses to one space)
    assert display(DEVICE) in summary and shorten_name(KERNEL)[:40] in summary and "\\u202e" in summary
    assert "rownend" not in summary and "`x` row\\x00end" in summary
    for line in runs["diff text"].stdout.splitlines():
        assert "\r" not in line


def test_hostile_names_stay_exact_in_json(tmp_path):
    a = hostile_trace(tmp_path / "a\x1b[31m.json", 10)
    b = hostile_trace(tmp_path / "b.json", 30)
    summary = run_cli("summarize", "-q", "--format", "json", str(a))
    diff = run_cli("diff", "-q", "--format", "json", str(a), str(b))
    assert_success(summary)
    assert_success(diff)
    data = json.loads(summary.stdout)
    assert data["trace"] == str(a) and data["devices"] == [DEVICE]
    assert data["top_kernels"]["forward"][0]["name"] == KERNEL
    assert data["top_ops"]["forward"][0]["name"] == OP
    assert {c["class"] for c in data["analyses"]["modules_by_class"]} == {MODULE}
    moved = json.loads(diff.stdout)
    assert moved["a"]["trace"] == str(a) and [k["name"] for k in moved["kernels"]] == [KERNEL]
    csv = run_cli("summarize", "-q", "--format", "csv", str(a))
    assert_success(csv)
    assert csv.stdout.splitlines()[0].startswith("step,stage")


def test_hostile_names_in_plots(tmp_path):
    """Names reach plot labels escaped, and a '$' pair in one is not parsed as math (it raised at draw time)."""
    a = hostile_trace(tmp_path / "a.json", 10)
    doc = json.loads(a.read_text())
    for e in doc["traceEvents"]:
        if e.get("name") == KERNEL:
            e["name"] = "k$\\frac{$" + KERNEL
    a.write_text(json.dumps(doc))
    run = run_cli("plot", "-q", str(a), "-o", str(tmp_path / "plots"), "--format", "svg")
    assert_success(run, folders=(tmp_path,))
    svgs = list((tmp_path / "plots").glob("*.svg"))
    assert svgs
    for svg in svgs:
        assert not UNSAFE.search(svg.read_text(encoding="utf-8")), svg.name


def test_escape_functions_by_hand():
    escaped = "a\\x1b[1mb\\x07\\r\\n\\x00\\x7f\\x9b\\u202e\\u2066é"
    assert display("a\x1b[1mb\x07\r\n\x00\x7f\x9b\u202e\u2066é") == escaped
    assert display("plain: ünïcode ✓") == "plain: ünïcode ✓"
    assert terminal_safe("one\ntwo\x1b") == "one\ntwo\\x1b"
    assert md_cell("a|b`c<d>\\") == "a\\|b\\`c&lt;d&gt;\\\\"
    assert md_code("x``y|z") == "```x``y\\|z```"
    assert md_code("`edge`") == "`` `edge` ``"
    assert md_code("a\\|b") == "`a\\\\\\|b`"  # the backslash before an escaped pipe is doubled: the pipe stays escaped
    for value in ("a|b", "a\\|b", "a\\\\|b", "`|`"):
        assert _md_cells("| " + md_code(value) + " | " + md_cell(value) + " |") == 2
