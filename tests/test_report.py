"""``profparse report``: one self-contained HTML page whose numbers are the summary's, checked in headless Chromium.

Browser tests run Chromium's own ``--headless --dump-dom`` / ``--screenshot``; the page writes any script error
into ``#errors`` (``data-count``), which the tests read. Without a browser they skip, saying how to get one.
"""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from adversarial import assert_clean_failure, assert_success, run_cli, snapshot
from conftest import SAMPLE_TRACES, SHARED_TRACES
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder, gpu_work_before_first_step, training_step

from profparse.base.formats import plain, utilisation_text
from profparse.cli.main import main
from profparse.outputs import report
from profparse.outputs.summary import summary_data
from profparse.outputs.views import views
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


def dump_dom(page: Path, query: str = "", *args: str) -> str:
    done = subprocess.run(chrome(*args, "--dump-dom", page.as_uri() + query), capture_output=True, timeout=120)
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
    assert list(data["views"]) == list(views())  # every registered view has its section, in order
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
    monkeypatch.setitem(views(), "flops_demo", extra)
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


@pytest.mark.parametrize("trace", [CPU_MARKS, MI250], ids=["cpu_marks", "mi250"])
def test_nothing_runs_off_the_right_of_a_laptop_window(tmp_path, trace):
    """In a 1300 px window every element ends inside it: the checks' messages wrap (one line each ran 60-330 px
    past the window's edge, the profiler-cost message on every trace)."""
    page = write(need(trace), tmp_path / "r.html")
    body = re.search(r"<body([^>]*)>", dump_dom(page, "?widths", "--window-size=1300,900")).group(1)
    right, width = (
        int(re.search(rf'{name}="(\d+)"', body).group(1)) for name in ("data-right-edge", "data-client-width")
    )
    assert 1200 < width and right <= width, (right, width)


def test_a_long_capture_folds_its_steps_and_shortens_a_findings_step_list(tmp_path):
    """36 steps, a stall in two of every three: the per-step table and the critical path's bars per step show 20
    steps and fold the rest (still in the page, behind a button); the finding's step list reads as the summary's
    heading does, the whole list on hover."""
    from test_advice import _gap_steps

    from profparse.analysis.advice.finding import parse_steps, steps_text
    from profparse.outputs.summary.findings import steps_label

    trace = _gap_steps(tmp_path, [9_000, 9_000, 1_000] * 12)
    dom = dump_dom(write(trace, tmp_path / "r.html"))
    read_dom(dom)
    rows = re.findall(r'<tr data-step="(\d+)"( class="more")?>', dom)
    assert [int(n) for n, _ in rows] == list(range(36))
    assert [bool(more) for _, more in rows] == [False] * 20 + [True] * 16
    assert 'id="per-step-more">show all 36 steps</button>' in dom
    assert '<table class="per-step folded">' in dom  # the stylesheet hides a folded box's rows "more"
    bars = re.findall(r'<div class="lab( more)?">step (\d+)</div>', dom)  # the critical path's bars per step
    assert [int(n) for _, n in bars] == list(range(36)) and [bool(m) for m, _ in bars] == [False] * 20 + [True] * 16
    assert 'id="cp-step-more">show all 36 steps</button>' in dom
    found = parsed_once(trace).findings
    steps = parse_steps(found.loc[found["kind"] == "between_steps", "steps"].iloc[0])
    label = steps_label(steps)
    assert "..." in label and f"({len(steps)} steps)" in label
    assert f'<span title="steps {steps_text(steps)}"> · {label}</span>' in dom


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


# -- the first screen: the headline, efficiency, tables as the summary shows them ----------------------------------

#: the trace headline's items; the last is "top_warning" instead where the trace has no finding
HEADLINE = ["step_time", "biggest_stage", "gpu_idle", "exposed_comm", "mfu", "top_finding"]
LONG_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)
MI300X = SHARED_TRACES / "mi300x_resnet18_train.json.gz"
A100 = SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz"
GROUPED_NS = re.compile(r"^-?\d{1,3}(,\d{3}){2,}$")  # a bare count of 1,000,000 or more: nanoseconds left raw


class Page(html.parser.HTMLParser):
    """What a reader sees: element ids, the headline's links and values, table headers and cells (with titles)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: dict[str, str] = {}  # headline key -> href
        self.values: dict[str, str] = {}  # headline key -> the value shown
        self.headers: list[str] = []
        self.cells: list[tuple[str, str]] = []  # (title, text) of each td
        self.attrs: list[dict[str, str]] = []
        self._open: tuple[str, str, str] | None = None  # (tag, key, title) of the element whose text is read
        self._text = ""
        self._key = ""
        self._spans = 0  # spans open inside a headline value (its stage chip)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        self.attrs.append(a)
        if "id" in a:
            self.ids.add(a["id"])
        if "data-headline" in a:
            self._key = a["data-headline"]
            self.links[self._key] = a.get("href", "")
        if self._open and self._open[0] == "span" and tag == "span":
            self._spans += 1
        elif tag in ("th", "td") or "hl-value" in a.get("class", "").split():
            self._open, self._text, self._spans = (tag, self._key, a.get("title", "")), "", 0

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[0] == "span" == tag and self._spans:
            self._spans -= 1
        elif self._open and tag == self._open[0]:
            kind, key, title = self._open
            text = " ".join(self._text.split())
            if kind == "th":
                self.headers.append(text)
            elif kind == "td":
                self.cells.append((title, text))
            else:
                self.values[key] = text
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text += data


def read_page(page: Path, query: str = "") -> Page:
    dom = dump_dom(page, query)
    read_dom(dom)  # rendered, no page error
    seen = Page()
    seen.feed(dom.split('id="payload"')[0])
    return seen


def _no_profiler_cost(trace: Path) -> Path:
    """The built trace calibrated at no cost per event: no profiler ran (docs/without_profiler.md)."""
    import gzip

    from profparse.analysis.profiler_cost import CALIBRATION_KEY
    from profparse.analysis.replay import OVERHEAD_KINDS

    doc = json.loads(gzip.decompress(trace.read_bytes()))
    doc[CALIBRATION_KEY] = {"per_event_ns": dict.fromkeys(OVERHEAD_KINDS, 0)}
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return trace


def test_headline_is_the_summary_and_links_to_its_sections(tmp_path):
    """One rank of test_ranks_late's run: two steps of 990 us windows, a 50 us broadcast (forward) and allreduce
    (backward) per step that nothing overlaps: 200 us of exposed communication, all of the collectives' time; the
    headline reads the steady step (the second: the first holds the first optimizer step): 100 us of it."""
    from test_ranks_late import STEP_US, TRANSFER_US, rank_trace

    trace = _no_profiler_cost(rank_trace(tmp_path / "rank0.json.gz", [0.0, 0.0]))
    page = write(trace, tmp_path / "r.html")
    data = payload(page)
    items = {h["key"]: h for h in data["headline"]}
    keys = HEADLINE
    assert [h["key"] for h in data["headline"]] == keys
    assert items["step_time"]["value"] == (STEP_US - 10) * 1000  # ground truth: the ProfilerStep windows
    # step 0 holds the first optimizer step: warm-up, left out and shown apart
    assert items["step_time"]["warm_up"] == [0] and "; 1 steady step; step 0:" in items["step_time"]["detail"]
    assert items["exposed_comm"]["value"] == 2 * TRANSFER_US * 1000  # the steady step's two transfers
    assert items["exposed_comm"]["detail"].startswith("100.0% of 100 µs collective time")
    assert items["exposed_comm"]["detail"].endswith("of the steady steps' time")
    summary = data["summary"]  # the other items are the summary's numbers (of the steady step), picked
    steady = summary["steady_totals"]
    biggest = max(steady, key=lambda t: t["host_wall_ns"])
    top = items["biggest_stage"]
    assert (top["stage"], top["value"]) == (biggest["stage"], biggest["host_wall_ns"])
    idle = sum(t["gpu_idle_ns"] for t in steady)
    span = idle + sum(t["gpu_busy_ns"] + t["gpu_overlap_ns"] for t in steady)
    assert 0 < idle < span and items["gpu_idle"]["value"] == pytest.approx(idle / span)
    assert items["mfu"]["text"] == "-"  # no shapes
    assert summary["warnings"] == []  # no check fired (calibrated: no uncalibrated check either)
    assert items["step_time"]["without_profiler_ns"] == summary["without_profiler"]["step_ns"]
    assert items["step_time"]["detail"].startswith("~")  # the step without the profiler comes first
    # 20 us of launches of 5 us of kernels in the optimizer: launch-bound, and no other finding; replayed without
    # them (docs/advice.md, "Savings are simulated") the step loses their 20 us: the kernels run under later host work
    first = summary["findings"][0]
    assert (
        (items["top_finding"]["kind"], items["top_finding"]["value"])
        == ("launch_bound", 20_000)
        == (
            first["kind"],
            first["saving_ns_per_step"],
        )
    )
    seen = read_page(page)
    assert seen.links == {key: items[key]["href"] for key in keys}
    for key, href in seen.links.items():  # every item links to a section that is on the page
        assert href.startswith("#") and href[1:] in seen.ids, (key, href)
    assert seen.values == {key: items[key]["text"] for key in keys}


def test_headline_ends_with_the_top_finding_and_the_printed_lines_name_it(tmp_path, monkeypatch):
    """Planted findings (test_advise_cmd.PLANTED): data_loading saves 30% of the mean step, grad_zeroing 10%, the
    third is under 1% and dropped. The last item is the biggest, worded from its numbers, its fix (shortened) as
    the detail, linking to the Findings section; the integrations' printed lines end with it."""
    from test_advise_cmd import plant

    from profparse.analysis.advice.kinds import KINDS
    from profparse.integrations import torch_profiler, transformers
    from profparse.outputs.report.headline import FIX_CHARS
    from profparse.outputs.views._common import fmt_time

    plant(monkeypatch)
    page = write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    data = payload(page)
    item, summary = data["headline"][-1], data["summary"]
    window = statistics.mean(s["window_ns"] for s in summary["step_totals"])
    saving = int(0.30 * window)  # ground truth: the planted share of the mean step window
    assert (item["key"], item["kind"], item["stage"], item["href"]) == (
        "top_finding",
        "data_loading",
        "load",
        "#findings",
    )
    assert item["value"] == pytest.approx(saving, abs=1)
    per = "steady step" if not all(s["steady"] for s in summary["step_totals"]) else "step"  # warm-up left out
    assert item["text"] == f"data_loading · load: saves {fmt_time(saving)}/{per} (30.0%)"
    fix = KINDS["data_loading"].fix
    assert item["detail"].endswith(" (+1 more)") and len(item["detail"]) <= FIX_CHARS + len(" (+1 more)")
    assert fix.startswith(item["detail"].removesuffix(" (+1 more)").removesuffix(" …"))
    seen = read_page(page)
    assert seen.values["top_finding"] == item["text"] and seen.links["top_finding"][1:] in seen.ids
    files = torch_profiler.CycleFiles("prof", "prof/h.pt.trace.json.gz", "prof/h.summary.txt", None)
    assert torch_profiler.headline_line(files, summary).endswith(f"; top finding {item['text']}")
    line = transformers.headline_line([Path("prof/t.json.gz")], data["headline"])
    assert line.endswith(f"; top finding {item['text']}")


def test_a_finding_of_the_detectors_is_the_headlines_last_item(tmp_path):
    """A simulated launch-bound forward (100 adds of 5 us kernels, tests/advice_sim.py): the real detectors find
    it, and the headline shows the first (biggest) finding's kind and saving."""
    from test_advice_gpu import PROGRAM

    from profparse.api import parse
    from profparse.outputs.report.headline import trace_headline
    from tests.advice_sim import Sim, run

    def eager(s: Sim) -> None:
        for _ in range(100):
            s.op("aten::add", 30, 5, "vectorized_elementwise_kernel")

    trace, _ = run(tmp_path / "launch.json", 4, **{**PROGRAM, "forward": eager})
    summary = plain(summary_data(parse(trace)), null=NULL)
    findings = summary["findings"]
    assert "launch_bound" in [f["kind"] for f in findings]
    biggest = max(findings, key=lambda f: f["saving_ns_per_step"])
    item = trace_headline(summary)[-1]
    assert (item["key"], item["kind"], item["value"]) == ("top_finding", biggest["kind"], biggest["saving_ns_per_step"])
    assert item["text"].startswith(f"{biggest['kind']} · {biggest['stage']}: saves ")


def test_without_findings_the_last_item_is_the_top_warning_as_before(monkeypatch):
    """No finding (detectors planted empty; the CPU sample has none anyway) on a trace whose checks fire: the last
    item is the top warning, worded as before findings existed, and the printed lines name no finding."""
    from test_advise_cmd import plant

    from profparse.api import parse
    from profparse.integrations import torch_profiler, transformers
    from profparse.outputs.report.headline import SEVERITY_ORDER, top_warning, trace_headline

    plant(monkeypatch, ())
    summary = plain(summary_data(parse(need(CPU_MARKS))), null=NULL)
    assert summary["findings"] == [] and summary["warnings"]
    headline, warnings = trace_headline(summary), summary["warnings"]
    first = min(warnings, key=lambda w: SEVERITY_ORDER.index(w["severity"]))  # the most severe, first of its kind
    more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
    assert (
        headline[-1]
        == top_warning(warnings)
        == {
            "key": "top_warning",
            "label": "Top warning",
            "text": f"{first['severity']}: {first['check']}",
            "detail": first["message"] + more,
            "href": "#checks",
            "value": first["severity"],
        }
    )
    files = torch_profiler.CycleFiles("prof", "prof/h.pt.trace.json.gz", "prof/h.summary.txt", None)
    assert "top finding" not in torch_profiler.headline_line(files, summary)
    assert "top finding" not in transformers.headline_line([Path("prof/t.json.gz")], headline)


def _long_kernel_trace(path: Path) -> Path:
    b = TraceBuilder()
    t = 0.0
    for step in range(2):
        b.launch(t + 4, t + 16, 3, name=LONG_KERNEL)  # inside the forward op, after its gemm
        t = training_step(b, step, t)
    return b.write(path)


def _shared_or_skip(path: Path) -> list[Path]:
    return [path] if path.exists() else []


def test_tables_show_times_and_words_not_raw_columns(tmp_path):
    """No header is a raw column name (``comm_ns``, ``#``), no cell a bare nanosecond count, on a trace page with
    each section the trace has (communication: A100; efficiency and roofline: MI300X) and on a ranks page."""
    from test_ranks_late import ranks_folder

    pages = [write(_long_kernel_trace(tmp_path / "gt.json"), tmp_path / "gt.html")]
    pages += [write(t, tmp_path / f"{t.name}.html") for t in _shared_or_skip(A100) + _shared_or_skip(MI300X)]
    pages.append(write(ranks_folder(tmp_path, 2, 1, [100.0]), tmp_path / "ranks.html", "-j", "1"))
    for page in pages:
        seen = read_page(page)
        assert seen.headers, page
        raw = [h for h in seen.headers if "_" in h or h == "#"]
        assert not raw, (page.name, raw)
        bare = [text for _, text in seen.cells if GROUPED_NS.match(text)]
        assert not bare, (page.name, bare)
    if A100.exists():  # communication as the summary shows it: per stage and per collective, in ms
        text = " ".join(t for _, t in read_page(pages[1], "?only=view-communication").cells)
        assert "all_reduce" in text and "46.76 ms" in text and "39.08 ms" in text


def test_kernel_names_are_shortened_as_summarize_shortens_them(tmp_path):
    from profparse.base.names import shorten_name

    page = write(_long_kernel_trace(tmp_path / "gt.json"), tmp_path / "r.html")
    forward = next(s for s in payload(page)["views"]["top_kernels"]["data"]["stages"] if s["stage"] == "forward")
    label = shorten_name(LONG_KERNEL)
    assert label == "vectorized_elementwise_kernel<CUDAFunctor_add>"
    assert forward["top"]["cols"]["label"][forward["top"]["cols"]["name"].index(LONG_KERNEL)] == label
    cells = read_page(page).cells
    assert (LONG_KERNEL, label) in cells  # the short label shown, the full name on hover
    assert all(text != LONG_KERNEL for _, text in cells)


def test_efficiency_section_and_mfu_headline_are_the_summarys(tmp_path):
    trace = need(MI300X)
    page = write(trace, tmp_path / "r.html")
    data = payload(page)
    section = data["summary"]["efficiency"]
    known = {s["stage"]: s["mfu"] for s in section["stages"] if s["mfu"] is not None and s["flops"] > 0}
    assert known and {h["key"]: h for h in data["headline"]}["mfu"]["value"] == known
    dom = dump_dom(page)
    read_dom(dom)
    seen = Page()
    seen.feed(dom.split('id="payload"')[0])
    shown = {a["data-eff-stage"]: a["data-eff-mfu"] for a in seen.attrs if "data-eff-stage" in a}
    assert shown == {s["stage"]: "" if s["mfu"] is None else str(s["mfu"]) for s in section["stages"]}
    # each MFU as summarize writes it, also where it is tiny (a peak 1000x the device's: 0.0041%, not 0.0%)
    tiny = dump_dom(write(trace, tmp_path / "tiny.html", "--peak-tflops", "1000000"))
    for page_dom in (dom, tiny):
        written = re.findall(r'data-eff-mfu="([^"]*)">([^<]*)<', page_dom)
        assert written and all(text == utilisation_text(float(v) if v else None) for v, text in written), written
    assert any(0 < float(v) < 1e-3 for v, _ in re.findall(r'data-eff-mfu="([^"]+)">([^<]*)<', tiny))
    steps = {a["data-eff-step"] for a in seen.attrs if "data-eff-step" in a}
    assert steps == {str(s["step"]) for s in section["steps"]} and steps  # MFU per step
    basis = re.search(r'id="mfu-basis"[^>]*>([^<]*)<', dom).group(1)
    assert html.unescape(basis).startswith(section["peak"]["note"])  # the peak (and its basis) MFU divides by


def test_cpu_trace_first_screen_says_what_is_not_there(tmp_path):
    page = write(need(CPU_MARKS), tmp_path / "r.html")
    items = {h["key"]: h for h in payload(page)["headline"]}
    assert items["gpu_idle"]["text"] == "no GPU" and items["exposed_comm"]["text"] == "none"
    assert items["mfu"]["text"] == "no MFU" and "CPU-only" in items["mfu"]["detail"]
    dom = dump_dom(page)
    read_dom(dom)
    # views without data are one line each at the end, not a section each
    assert '<section id="view-top_kernels"' not in dom
    absent = re.search(r'<section id="not-shown".*?</section>', dom, re.S).group(0)
    assert 'id="view-top_kernels"' in absent and "no GPU activity" in absent


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_per_step_table_shows_each_steps_window_and_names_a_step_with_gpu_work_only(tmp_path):
    """The page's per-step table has summarize's window column (a step's span: the headline's step time is over
    windows, the stages' total leaves out time in no stage); a step with only GPU work in the trace has none and
    the note under the table names it."""
    trace = gpu_work_before_first_step(tmp_path / "t.json")
    expected = summary_data(parsed_once(trace))
    assert {r["step"] for r in expected["per_step"]} - {t["step"] for t in expected["step_totals"]} == {0}
    dom = dump_dom(write(trace, tmp_path / "r.html"))
    read_dom(dom)
    assert re.findall(r'<td data-window="(\d+)">', dom) == [str(t["window_ns"]) for t in expected["step_totals"]]
    row = re.search(r'<tr data-step="0">(.*?)</tr>', dom).group(1)
    assert "data-window" not in row and "<td>-</td>" in row
    assert "Step 0: only GPU work in the trace (no window" in dom
    page = dump_dom(write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "gt.html"))
    shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the page's text, not its code
    assert "window: the step's span" in shown and "only GPU work" not in shown


def test_one_finding_is_counted_in_the_singular(tmp_path):
    from test_advice import _gap_steps

    trace = _gap_steps(tmp_path, [5_000] * 5)
    assert len(parsed_once(trace).findings) == 1
    note = re.search(r'<p class="note">(\d+ findings?[;,][^<]*)</p>', dump_dom(write(trace, tmp_path / "r.html")))
    assert note.group(1).startswith("1 finding; saving:"), note.group(1)


def test_roofline_picture_leaves_its_title_to_the_section_and_is_drawn_sharp(tmp_path, monkeypatch):
    """The roofline's PNG on the page has no title (the heading and the note above it say the same: it repeated
    both), where ``profparse plot``'s keeps it, and is drawn at ``PNG_DPI``, which the page shows at 90 px per
    inch."""
    import base64
    import io

    import matplotlib.image as mpimg

    from profparse.outputs.views import roofline

    drawn = []
    draw = roofline.draw
    monkeypatch.setattr(roofline, "draw", lambda prepared: drawn.append(draw(prepared)) or drawn[-1])
    page = write(need(CPU_MARKS), tmp_path / "r.html")
    assert len(drawn) == 1 and [ax.get_title() for ax in drawn[0].axes] == [""]
    prepared, _ = roofline.data(parsed_once(need(CPU_MARKS)))
    assert draw(prepared).axes[0].get_title().startswith(roofline.TITLE)  # the plot verb's figure
    entry = payload(page)["views"]["roofline"]
    assert entry["png_dpi"] == report.PNG_DPI
    shown = mpimg.imread(io.BytesIO(base64.b64decode(entry["png"])), format="png")
    width = re.search(r'<img class="view" alt="Roofline[^"]*"[^>]*style="width: (\d+)px;"', dump_dom(page)).group(1)
    assert abs(int(width) - shown.shape[1] * 90 / report.PNG_DPI) <= 1


def test_findings_measured_in_warm_up_say_so_on_the_page(tmp_path):
    """The MI250 trace's one complete step may be warm-up: the findings section says so above the list."""
    from conftest import REPO_GPU_TRACES

    dom = dump_dom(write(REPO_GPU_TRACES / "mi250_minitoy.json.gz", tmp_path / "r.html"))
    read_dom(dom)
    shown = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    assert '<p class="note warm">Measured in steps that may be warm-up, so all at low confidence' in shown
    gt = dump_dom(write(ground_truth_trace(tmp_path / "gt.json"), tmp_path / "gt.html"))
    assert 'class="note warm"' not in re.sub(r"<script.*?</script>", "", gt, flags=re.S)


def test_timeline_canvas_draws_the_stages_over_an_overlapping_other_span(tmp_path):
    """On the page's timeline too, a ProfilerStep#1 range that overlaps step 1's stages without holding them
    leaves them visible (one step: no other step's stages to count)."""
    from matplotlib.colors import to_rgb
    from tracebuilder import step_begun_before_its_frame

    from profparse.outputs.views._common import STAGE_COLORS

    page = write(step_begun_before_its_frame(tmp_path / "t.json", steps=1), tmp_path / "r.html")
    image = screenshot(page, tmp_path / "t.png", "?only=view-timeline")
    for stage in ("forward", "optimizer"):
        hits = int((np.abs(image - np.array(to_rgb(STAGE_COLORS[stage]))).max(axis=2) < 0.02).sum())
        assert hits > 2000, f"{stage}: {hits} pixels of its colour"
