"""``profparse report``: one self-contained HTML page whose numbers are the summary's, checked in headless Chromium.

Browser tests run Chromium's own ``--headless --dump-dom`` / ``--screenshot``; the page writes any script error
into ``#errors`` (``data-count``), which the tests read. Without a browser they skip, saying how to get one.
"""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from adversarial import assert_clean_failure, assert_success, run_cli, snapshot
from conftest import SAMPLE_TRACES, SHARED_TRACES
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder, training_step

from profparse.base.formats import plain
from profparse.cli.main import main
from profparse.outputs import report
from profparse.outputs.summary import summary_data
from profparse.outputs.views import VIEWS
from profparse.trace.kinds import NULL

CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
MI250 = SHARED_TRACES / "mi250_minitoy.json.gz"
EXISTS, REFUSED, BAD_INPUT, MISSING = 6, 9, 4, 3


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium found: install it (Debian/Ubuntu: apt-get install -y chromium) to run the browser tests")


def chrome(*args: str) -> list[str]:
    return [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", *args]


def dump_dom(page: Path, query: str = "") -> str:
    done = subprocess.run(chrome("--dump-dom", page.as_uri() + query), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


def screenshot(page: Path, out: Path, query: str = "", size: str = "1300,900") -> np.ndarray:
    import matplotlib.image as mpimg

    cmd = chrome("--hide-scrollbars", f"--window-size={size}", f"--screenshot={out}", page.as_uri() + query)
    done = subprocess.run(cmd, capture_output=True, timeout=120)
    assert done.returncode == 0 and out.exists(), done.stderr.decode(errors="replace")[-2000:]
    return mpimg.imread(out)[..., :3]


class Cells(html.parser.HTMLParser):
    """Attributes of every element carrying ``data-value`` (and the errors element)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.errors: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.error_text = ""
        self._in_errors = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        if a.get("id") == "errors":
            self.errors, self._in_errors = a, True
        if tag == "body":
            self.body = a
        if "data-value" in a:
            self.cells.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_errors = False

    def handle_data(self, data: str) -> None:
        if self._in_errors:
            self.error_text += data


def read_dom(dom: str) -> Cells:
    cells = Cells()
    cells.feed(dom)
    assert cells.body.get("data-ready") == "1", "the page script did not finish"
    assert cells.errors.get("data-count") == "0", f"page errors: {cells.error_text}"
    return cells


def payload(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    body = re.search(r'<script type="application/json" id="payload">(.*?)</script>', text, re.S).group(1)
    return json.loads(body)


def ground_truth_trace(path: Path) -> Path:
    """Two training steps: forward 20 us, backward 30 us, optimizer 20 us of host wall each (GPU 10/20/5 us)."""
    b = TraceBuilder()
    t = 0.0
    for step in range(2):
        t = training_step(b, step, t)
    return b.write(path)


def write(trace: Path, out: Path, *extra: str) -> Path:
    assert main(["report", str(trace), "-o", str(out), "-q", *extra]) == 0
    return out


# -- the page's data (no browser) ----------------------------------------------------------------------------------


def test_report_embeds_the_summary_and_every_view(tmp_path):
    trace = ground_truth_trace(tmp_path / "gt.json")
    page = write(trace, tmp_path / "r.html")
    data = payload(page)
    parsed = parsed_once(trace)
    assert data["summary"] == json.loads(json.dumps(plain(summary_data(parsed), null=NULL)))
    assert list(data["views"]) == list(VIEWS)  # every registered view has its section, in order
    totals = {r["stage"]: r["host_wall_ns"] for r in data["summary"]["totals"]}
    assert totals == {"load": 0, "forward": 40_000, "backward": 60_000, "optimizer": 40_000, "other": 0}
    # the stages view's host bars add up to the summary's host wall (parts = whole)
    panels = {title: frame for frame, title in data["views"]["stages"]["data"]["panels"]}
    host = panels["Host threads"]
    for i, stage in enumerate(host["index"]):
        assert sum(host["cols"][c][i] for c in host["columns"]) == totals[stage]


def test_report_is_self_contained(tmp_path):
    page = write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    text = page.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert not re.search(r"url\(\s*['\"]?https?:", text)


def test_a_new_registered_view_gets_a_section(tmp_path, monkeypatch):
    import types

    import pandas as pd

    def data(parsed):
        return {"title": "x", "table": pd.DataFrame({"stage": ["forward"], "flops": [1.5e9]})}, None

    def draw(prepared):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.bar([0], [1.5])
        return fig

    extra = types.SimpleNamespace(KIND="flops_demo", TITLE="FLOPs demo", data=data, draw=draw)
    monkeypatch.setitem(VIEWS, "flops_demo", extra)
    page = write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    entry = payload(page)["views"]["flops_demo"]
    assert entry["title"] == "FLOPs demo" and not entry["native"]
    assert entry["data"]["table"]["cols"]["flops"] == [1.5e9] and entry["png"]
    if shutil.which("chromium"):  # the page draws it with the generic renderer, without errors
        dom = dump_dom(page)
        read_dom(dom)
        section = re.search(r'<section id="view-flops_demo".*?</section>', dom, re.S).group(0)
        assert "<img" in section and "1,500,000,000" in section


def test_large_trace_report_stays_small(tmp_path):
    """The timeline is aggregated: a report holds at most TIMELINE_RECTS-ish spans, whatever the trace's size."""
    b = TraceBuilder()
    t = 0.0
    for step in range(300):
        t = training_step(b, step, t)
    trace = b.write(tmp_path / "many.json")
    page = write(trace, tmp_path / "r.html")
    spans = payload(page)["views"]["timeline"]["data"]["spans"]
    assert 0 < len(spans["index"]) <= report.TIMELINE_RECTS
    assert page.stat().st_size < trace.stat().st_size  # the page is smaller than the trace it describes


# -- the command line ----------------------------------------------------------------------------------------------


def test_report_output_rules(tmp_path):
    (tmp_path / "in").mkdir()
    trace = ground_truth_trace(tmp_path / "in" / "gt.json")
    out = tmp_path / "r.html"
    before = snapshot(tmp_path / "in")
    assert_success(run_cli("report", str(trace), "-o", str(out), "-q"), folders=(tmp_path,))
    first = out.read_bytes()
    assert_clean_failure(run_cli("report", str(trace), "-o", str(out), "-q"), EXISTS, contains="--force")
    assert out.read_bytes() == first
    assert_success(run_cli("report", str(trace), "-o", str(out), "-q", "--force"), folders=(tmp_path,))
    for target, words in ((trace, "is the input"), (tmp_path / "in", "folder")):
        run = run_cli("report", str(trace), "-o", str(target), "--force", "-q")
        assert_clean_failure(run, REFUSED, contains=words, before=before, after=snapshot(tmp_path / "in"))
    link = tmp_path / "link.html"
    link.symlink_to(out)
    assert_clean_failure(run_cli("report", str(trace), "-o", str(link), "--force", "-q"), REFUSED)
    assert snapshot(tmp_path / "in") == before


@pytest.mark.parametrize(
    ("content", "code"),
    [(b"", BAD_INPUT), (b"not json at all", BAD_INPUT), (b'{"foo": 1}', BAD_INPUT), (None, MISSING)],
    ids=["empty", "not_json", "no_trace_events", "missing"],
)
def test_report_bad_input_is_one_line_and_writes_nothing(tmp_path, content, code):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)
    out = tmp_path / "out" / "r.html"
    before = snapshot(tmp_path)
    run = run_cli("report", str(bad), "-o", str(out))
    assert_clean_failure(run, code, before=before, after=snapshot(tmp_path), folders=(tmp_path,))
    assert not out.exists()


def test_report_of_a_folder_of_ranks(tmp_path):
    trace = ground_truth_trace(tmp_path / "gt.json")
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(trace, folder / f"rank{r}.json")
    (folder / "rank2.json").write_bytes(b"not json")
    out = tmp_path / "ranks.html"
    run = run_cli("report", str(folder), "-o", str(out), "-j", "1")
    assert run.code == 7 and "rank 2" in run.stderr and "Traceback" not in run.stderr  # written, then exit 7
    data = payload(out)["ranks"]
    assert [r["status"] for r in data["ranks"]] == ["ok", "ok", "failed"]
    walls = {(r["rank"], r["stage"]): r[data["metric_column"]] for r in data["per_rank"]}
    assert walls[(0, "backward")] == walls[(1, "backward")]
    assert_success(run_cli("report", str(folder), "-o", str(out), "-j", "1", "--force", "--keep-going", "-q"))


# -- in a real browser ---------------------------------------------------------------------------------------------


def _dom_totals(cells: Cells) -> dict[tuple[str, str], int]:
    return {(c["data-stage"], c["data-field"]): int(c["data-value"]) for c in cells.cells if "data-field" in c}


@pytest.mark.parametrize("trace", [None, CPU_MARKS, MI250], ids=["ground_truth", "cpu_marks", "mi250"])
def test_page_opens_without_errors_and_shows_the_summary_numbers(tmp_path, trace):
    trace = ground_truth_trace(tmp_path / "gt.json") if trace is None else need(trace)
    page = write(trace, tmp_path / "r.html")
    cells = read_dom(dump_dom(page))
    expected = summary_data(parsed_once(trace))
    dom = _dom_totals(cells)
    fields = {f for _, f in dom}
    assert "host_wall_ns" in fields
    for row in expected["totals"]:
        for field in fields:
            assert dom[(row["stage"], field)] == row[field], (row["stage"], field)
    steps = [c for c in cells.cells if "data-step" in c and "data-stage" in c]
    per_step = {(r["step"], r["stage"]): r["host_wall_ns"] for r in expected["per_step"]}
    assert steps and all(int(c["data-value"]) == per_step[(int(c["data-step"]), c["data-stage"])] for c in steps)


def test_names_with_markup_stay_text(tmp_path):
    b = TraceBuilder()
    t = training_step(b, 0, 0.0)
    hostile = "</script><script>window.pwned=1</script><!-- <b>bold</b>"
    b.annotation("ProfilerStep#1", t, 50)
    b.op(hostile, t + 5, 30)
    page = write(b.write(tmp_path / "markup.json"), tmp_path / "r.html")
    assert hostile not in page.read_text(encoding="utf-8")  # only its escaped form is in the file
    dom = dump_dom(page)
    read_dom(dom)
    assert "window.pwned" in dom and "<b>bold</b>" not in dom  # shown as text (escaped), never run or parsed


def test_timeline_canvas_is_drawn(tmp_path):
    page = write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    image = screenshot(page, tmp_path / "t.png", "?only=view-timeline")
    from matplotlib.colors import to_rgb

    from profparse.outputs.views._common import STAGE_COLORS

    for stage in ("forward", "backward", "optimizer"):
        colour = np.array(to_rgb(STAGE_COLORS[stage]))
        hits = int((np.abs(image - colour).max(axis=2) < 0.02).sum())
        assert hits > 2000, f"{stage}: only {hits} pixels of its colour: the timeline canvas looks blank"


def test_timeline_hover_names_the_span_under_the_pointer(tmp_path):
    page = write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    timeline = payload(page)["views"]["timeline"]["data"]
    spans = timeline["spans"]["cols"]
    labels = timeline["tracks"]["cols"]["label"]
    j = spans["stage"].index("backward")
    row, mid = spans["row"][j], (spans["start_ns"][j] + spans["end_ns"][j]) // 2
    tip = re.search(r'data-probe="([^"]*)"', dump_dom(page, f"?probe={row},{mid}")).group(1)
    assert tip.startswith(labels[row]) and "stage: backward" in tip and f"rule: {spans['rule'][j]}" in tip
    ends = [e for r, e in zip(spans["row"], spans["end_ns"], strict=True) if r == row]
    starts = [s for r, s in zip(spans["row"], spans["start_ns"], strict=True) if r == row]
    gap = next(e + 1 for e in sorted(ends) if not any(s <= e + 1 < x for s, x in zip(starts, ends, strict=True)))
    tip = re.search(r'data-probe="([^"]*)"', dump_dom(page, f"?probe={row},{gap}")).group(1)
    assert tip == "none"  # between spans: nothing to show


def _top_ops_rows(dom: str) -> tuple[int, list[tuple[str, bool]]]:
    """The top-ops section's data-visible count and its rows (name, shown)."""
    section = re.search(r'<section id="view-top_ops"[^>]*data-visible="(\d+)"[^>]*>(.*?)</section>', dom, re.S)
    assert section, "top ops section has no data-visible count"
    rows = re.findall(r'<tr class="toprow" data-name="([^"]*)"( hidden="")?', section.group(2))
    return int(section.group(1)), [(name, not hidden) for name, hidden in rows]


def test_filter_box_filters(tmp_path):
    page = write(need(CPU_MARKS), tmp_path / "r.html")
    dom = dump_dom(page)
    read_dom(dom)
    count, rows = _top_ops_rows(dom)
    assert count == len(rows) > 0 and all(shown for _, shown in rows)  # no filter: every row
    dom = dump_dom(page, "?filter=ATEN::MM")
    read_dom(dom)
    count, rows = _top_ops_rows(dom)
    shown = [name for name, on in rows if on]
    assert shown and all("aten::mm" in name for name in shown)  # case-insensitive substring
    assert count == len(shown) < len(rows)


def test_ranks_page_heatmap_is_the_ranks_summary(tmp_path):
    from profparse import ranks

    trace = ground_truth_trace(tmp_path / "gt.json")
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(trace, folder / f"rank{r}.json")
    page = write(folder, tmp_path / "ranks.html", "-j", "1")
    dom = dump_dom(page)
    cells = read_dom(dom)
    run = ranks.parse_ranks(str(folder), None, jobs=1)
    expected = ranks.ranks_summary_data(run.results)
    column = expected["metric_column"]
    want = {(str(r["rank"]), r["stage"]): r[column] for r in expected["per_rank"]}
    got = {(c["data-rank"], c["data-stage"]): int(c["data-value"]) for c in cells.cells if "data-rank" in c}
    assert got == want and got[("0", "backward")] == 60_000
    for rank in (0, 1):  # each rank links to its own section
        assert f'href="#rank-{rank}"' in dom and f'id="rank-{rank}"' in dom
    dataset = tmp_path / "dataset"  # a rank dataset written by parse gives the same page numbers
    assert main(["parse", str(folder), "-o", str(dataset), "-q", "-j", "1"]) == 0
    from_dataset = payload(write(dataset, tmp_path / "dataset.html"))["ranks"]
    assert from_dataset["per_rank"] == payload(page)["ranks"]["per_rank"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
