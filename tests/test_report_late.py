"""The ranks page's "Late ranks" section, in headless Chromium: the numbers ``summarize FOLDER`` prints, drawn.

The input is test_ranks_late's hand-built run: 3 ranks, rank 1 runs an extra 200 us / 100 us kernel before its
backward allreduce in steps 0 / 1, so the others wait exactly that long for it. Without Chromium the tests skip.
"""

from __future__ import annotations

import html.parser
import json
import re
import shutil
from pathlib import Path

from test_ranks_late import ranks_folder
from test_report import dump_dom, ground_truth_trace, payload, read_dom, write

from profparse.base.names import shorten_name
from profparse.cli.main import main

DELAYS_US = [200.0, 100.0]
STAGE_FIELDS = ("collectives", "late", "late_rank", "times_last", "mean_delay_ns", "max_delay_ns", "waiting_ns",
                "transfer_ns")  # fmt: skip


class LateCells(html.parser.HTMLParser):
    """The ``data-late-*`` attributes of the late ranks section, and the section's state."""

    def __init__(self) -> None:
        super().__init__()
        self.stage: dict[tuple[str, str], str] = {}  # (stage, field) -> value
        self.rank: dict[tuple[str, str, int], str] = {}  # (stage, field, rank) -> value
        self.names: list[tuple[str, str, str]] = []  # (stage, kernel|op, name) of the differences
        self.state = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        if a.get("id") == "late-ranks":
            self.state = a.get("data-late", "")
        if "data-late-name" in a:
            self.names.append((a["data-late-stage"], a["data-late-kind"], a["data-late-name"]))
        if "data-late-field" not in a:
            return
        if "data-late-rank" in a:
            self.rank[(a["data-late-stage"], a["data-late-field"], int(a["data-late-rank"]))] = a["data-late-value"]
        else:
            self.stage[(a["data-late-stage"], a["data-late-field"])] = a["data-late-value"]


def late_cells(page: Path) -> tuple[LateCells, str]:
    """The page's late cells and its visible text (tags stripped), after checking it rendered without errors."""
    dom = dump_dom(page)
    read_dom(dom)  # data-ready=1 and #errors data-count=0
    cells = LateCells()
    cells.feed(dom)
    text = " ".join(re.sub(r"<[^>]+>", " ", dom.split('id="payload"')[0]).split())
    return cells, text


def summarize(source: Path, capsys, fmt: str) -> str:
    assert main(["summarize", str(source), "--format", fmt, "-q", "-j", "1"]) == 0
    return capsys.readouterr().out


def _value(v) -> str:
    return "" if v is None else str(v)


def test_late_ranks_section_shows_what_summarize_prints(tmp_path, capsys):
    folder = ranks_folder(tmp_path, 3, 1, DELAYS_US)
    dataset = tmp_path / "tables"
    assert main(["parse", str(folder), "-o", str(dataset), "-j", "1", "-q"]) == 0
    for source in (folder, dataset):
        printed = json.loads(summarize(source, capsys, "json"))["late_ranks"]
        assert "backward: rank 1 arrived last in 2 of 2 collectives" in summarize(source, capsys, "text")
        page = write(source, tmp_path / f"{source.name}.html", "-j", "1")
        cells, text = late_cells(page)
        assert cells.state == "shown", source
        headline = {h["key"]: h for h in payload(page)["headline"]}  # the first screen names the late rank
        assert (headline["late_rank"]["value"], headline["late_rank"]["stage"]) == (1, "backward"), source
        assert headline["late_rank"]["href"] == "#late-ranks" and "rank 1" in text
        assert (headline["straggler"]["text"], headline["ranks"]["text"]) == ("rank 1", "3 parsed"), source
        # the same numbers summarize prints, per stage and per (stage, rank)
        want = {(s["stage"], f): _value(s[f]) for s in printed["stages"] for f in STAGE_FIELDS}
        assert cells.stage == want, source
        late_stages = {s["stage"] for s in printed["stages"] if s["late_rank"] is not None}
        assert late_stages == {"backward"}  # per-rank tables only where a rank was late
        want_ranks = {(r["stage"], f"rank_{f}", r["rank"]): str(r[f]) for r in printed["per_rank"]
                      for f in ("times_last", "waiting_ns", "transfer_ns") if r["stage"] in late_stages}  # fmt: skip
        assert cells.rank == want_ranks, source
        # ground truth: rank 1 is last in both backward allreduces, the others each wait 200 + 100 us for it
        assert cells.stage[("backward", "late_rank")] == "1" and cells.stage[("forward", "late_rank")] == ""
        assert (cells.stage[("backward", "times_last")], cells.stage[("backward", "collectives")]) == ("2", "2")
        assert cells.stage[("backward", "mean_delay_ns")] == "150000"
        assert cells.stage[("backward", "max_delay_ns")] == "200000"
        assert [cells.rank[("backward", "rank_waiting_ns", r)] for r in range(3)] == ["300000", "0", "300000"]
        for stage in late_stages:  # invariant: the ranks' waiting and transfer add up to the stage's
            for field in ("waiting_ns", "transfer_ns"):
                parts = sum(int(v) for (st, f, _), v in cells.rank.items() if (st, f) == (stage, f"rank_{field}"))
                assert parts == int(cells.stage[(stage, field)]), (source, stage, field)
        assert "backward: rank 1 arrived last in 2 of 2 collectives" in text
        assert "forward: rank" not in text  # nobody was late in forward: no paragraph for it
        diffs = printed["stages"][-1]["differences"]
        assert cells.names == [("backward", kind[:-1], d["name"]) for kind in ("kernels", "ops") for d in diffs[kind]]
        assert {("backward", "kernel", "slow_kernel"), ("backward", "op", "aten::slow_op")} <= set(cells.names)
        shown = payload(page)["ranks"]["late_ranks"]["stages"][-1]["differences"]  # labelled as summarize labels
        assert all(d["label"] == shorten_name(d["name"], kernel=k == "kernels") for k in shown for d in shown[k])


def test_late_ranks_section_says_why_it_is_empty(tmp_path, capsys):
    older = tmp_path / "older"  # a dataset from before collective_matches existed
    assert main(["parse", str(ranks_folder(tmp_path, 2, 1, [100.0])), "-o", str(older), "-j", "1", "-q"]) == 0
    shutil.rmtree(older / "collective_matches")
    assert "not in this dataset" in summarize(older, capsys, "text")
    cells, text = late_cells(write(older, tmp_path / "older.html"))
    assert cells.state == "unavailable" and not cells.stage
    assert "written by an older profparse" in text
    trace = ground_truth_trace(tmp_path / "gt.json")  # no collective kernels at all
    plain = tmp_path / "plain"
    plain.mkdir()
    for r in (0, 1):
        shutil.copy(trace, plain / f"rank{r}.json")
    assert "no collective was matched" in summarize(plain, capsys, "text")
    cells, text = late_cells(write(plain, tmp_path / "plain.html", "-j", "1"))
    assert cells.state == "none" and not cells.stage
    assert "No collective was matched across ranks" in text


def test_match_warnings_are_on_the_page(tmp_path, capsys):
    """Rank 1 recorded one more allreduce: summarize's warning is on the page, and the rest is still matched."""
    folder = ranks_folder(tmp_path, 2, 1, DELAYS_US, extra_allreduce=True)
    warnings = json.loads(summarize(folder, capsys, "json"))["late_ranks"]["warnings"]
    assert len(warnings) == 1 and "different numbers of collectives" in warnings[0]
    cells, text = late_cells(write(folder, tmp_path / "page.html", "-j", "1"))
    assert cells.state == "shown" and f"warning: {warnings[0]}" in text
    assert cells.stage[("backward", "late_rank")] == "1" and cells.stage[("backward", "times_last")] == "2"


class WaitCells(html.parser.HTMLParser):
    """The ``data-wait-*`` cells of the path waits table: {(rank, stage, field): value}."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[int, str, str], str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-wait-field" in a:
            self.cells[(int(a["data-wait-rank"]), a["data-wait-stage"], a["data-wait-field"])] = a["data-wait-value"]


def test_the_path_waits_summarize_prints_are_on_the_page(tmp_path, capsys):
    """Ranks 0 and 2 wait 200 + 100 us for rank 1 at the backward allreduces: the time of that on their critical
    paths, as summarize's JSON gives it, is the page's table, cell by cell; rank 1 waits for nobody."""
    folder = ranks_folder(tmp_path, 3, 1, DELAYS_US)
    printed = json.loads(summarize(folder, capsys, "json"))["late_ranks"]["path_waits"]
    assert {w["rank"] for w in printed} == {0, 2} and {w["waited_rank"] for w in printed} == {1}
    assert all(0 < w["wait_ns"] <= 1000 * sum(DELAYS_US) for w in printed)  # at most the windows they waited in
    dom = dump_dom(write(folder, tmp_path / "page.html", "-j", "1"))
    read_dom(dom)
    cells = WaitCells()
    cells.feed(dom)
    want = {(w["rank"], w["stage"], f): str(w[f]) for w in printed for f in ("waited_rank", "wait_ns", "steps")}
    assert {k: v for k, v in cells.cells.items() if k[2] != "per_step_ns"} == want
    assert {k[:2]: float(v) for k, v in cells.cells.items() if k[2] == "per_step_ns"} == {
        (w["rank"], w["stage"]): w["per_step_ns"] for w in printed
    }
    assert "waiting for a later rank" in dom
