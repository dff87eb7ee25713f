"""The report's "Findings" section: the summary's findings (planted, with known savings and evidence), first on the
page under the headline, each with its saving, fix and evidence; one line when there are none."""

from __future__ import annotations

import html.parser

import pytest
import test_report as pages  # the page helpers (a module: its tests are not collected here)
from test_advise_cmd import plant
from tracebuilder import TraceBuilder, training_step


class Findings(html.parser.HTMLParser):
    """The ids of the page's sections in order, and each finding item's kind and saving."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.items: list[tuple[str, str]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and a.get("id"):
            self.sections.append(a["id"])
        if tag == "li" and "finding" in a.get("class", "").split():
            self.items.append((a["data-kind"], a["data-saving"]))

    def handle_data(self, data: str) -> None:
        self.text += data


def three_step_trace(path):
    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        t = training_step(b, step, t)
    return b.write(path)


def test_the_payload_carries_the_findings_the_summary_has(tmp_path, monkeypatch):
    plant(monkeypatch)
    page = pages.write(three_step_trace(tmp_path / "t.json.gz"), tmp_path / "r.html")
    findings = pages.payload(page)["summary"]["findings"]
    assert [f["kind"] for f in findings] == ["data_loading", "grad_zeroing"]  # the one under 1% is not a finding
    assert findings[1]["evidence"]["top_events"][0]["name"] == "aten::zero_"


def test_the_page_shows_the_findings_first_with_their_numbers(tmp_path, monkeypatch):
    plant(monkeypatch)
    page = pages.write(three_step_trace(tmp_path / "t.json.gz"), tmp_path / "r.html")
    dom = pages.dump_dom(page)
    pages.read_dom(dom)  # the script finished, no page errors
    seen = Findings()
    seen.feed(dom)
    findings = pages.payload(page)["summary"]["findings"]
    assert seen.sections[:2] == ["findings", "overview"]  # on top, under the headline
    assert seen.items == [(f["kind"], str(f["saving_ns_per_step"])) for f in findings]
    assert "fix: " + findings[0]["fix"] in seen.text and "train.py(42): <module>" in seen.text
    assert "aten::zero_" in seen.text and "steps 1-2" in seen.text
    image = pages.screenshot(page, tmp_path / "f.png", "?only=findings", size="1000,500")
    assert (image.std(axis=(0, 1)) > 0.05).any()  # drawn: text on the page, not a blank screen


def test_no_findings_is_one_line_on_the_page(tmp_path, monkeypatch):
    plant(monkeypatch, ())
    page = pages.write(three_step_trace(tmp_path / "t.json.gz"), tmp_path / "r.html")
    dom = pages.dump_dom(page)
    pages.read_dom(dom)
    seen = Findings()
    seen.feed(dom)
    assert seen.items == [] and "No finding saves 1% of a step or more." in seen.text


@pytest.mark.parametrize("n, late_rank", [(2, 1)])
def test_the_ranks_page_lists_the_late_rank_finding(tmp_path, monkeypatch, n, late_rank):
    import test_ranks_late as late_traces

    plant(monkeypatch, ())
    folder = late_traces.ranks_folder(tmp_path, n, late_rank, [300.0, 120.0])
    page = pages.write(folder, tmp_path / "r.html", "-j", "1")
    findings = pages.payload(page)["ranks"]["findings"]
    assert [(f["kind"], f["rank"], f["stage"]) for f in findings] == [("late_rank", late_rank, "backward")]
    dom = pages.dump_dom(page)
    pages.read_dom(dom)
    seen = Findings()
    seen.feed(dom)
    assert seen.items == [("late_rank", str(findings[0]["saving_ns_per_step"]))] and f"rank {late_rank} · " in seen.text
