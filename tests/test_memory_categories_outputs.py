"""Issue 23's last outputs: the memory timeline stacked by category (plot and report) and diff per category.

Ground truth: the stacked categories add up to the allocator's Total Allocated at every point drawn, and a real
trace rewritten with one activation made N bytes bigger diffs as exactly +N in activation and nowhere else."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_TRACES, parsed

from profparse.analysis.memory_categories import CATEGORIES
from profparse.diff import diff_data, render
from profparse.outputs.report import render_html, trace_payload
from profparse.outputs.views import memory as memory_view
from profparse.trace.kinds import NULL

CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
GROWTH = 12_345  # bytes added to one activation live at the peak


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} is absent")
    return path


def stack_matches_total(prepared: dict) -> int:
    """Asserts every device's categories add up to its drawn Total Allocated; the number of devices stacked."""
    stacked = 0
    for device in prepared["devices"]:
        categories = device.get("categories")
        if not categories:
            continue
        assert set(categories) <= set(CATEGORIES)
        total = np.sum([np.asarray(v) for v in categories.values()], axis=0)
        np.testing.assert_array_equal(total, np.asarray(device["bytes"]))
        stacked += 1
    return stacked


@pytest.mark.parametrize("points", [memory_view.MAX_MEMORY_POINTS, 300])
def test_stacked_categories_add_up_to_total_allocated_at_every_point(monkeypatch, points):
    """Both unreduced (3927 events) and reduced to 300 bins, where each point keeps its own row."""
    monkeypatch.setattr(memory_view, "MAX_MEMORY_POINTS", points)
    prepared, why = memory_view.data(parsed(need(CPU_MARKS)))
    assert prepared is not None, why
    assert stack_matches_total(prepared) == 1
    device = prepared["devices"][0]
    assert len(device["ts_ns"]) <= points and np.all(np.diff(device["ts_ns"]) >= 0)
    assert {"activation", "gradient", "optimizer_state", "temporary"} <= set(device["categories"])
    if points < 3927:  # the reduction keeps each bin's highest point: the trace's peak is still drawn
        full = parsed(CPU_MARKS).memory["allocated_bytes"].max()
        assert max(device["bytes"]) == full


def test_categories_add_up_on_real_gpu_traces(shared_trace):
    """On the shared traces holding [memory] events, at every event of every device (before any reduction)."""
    p = parsed(shared_trace)
    by_device = memory_view.category_series(p)
    if not by_device:
        pytest.skip("no [memory] events in this trace")
    series = {label: values for label, _, values in memory_view.memory_series(p)}
    for label, (_, live) in by_device.items():
        np.testing.assert_array_equal(live.sum(axis=1), series[label])


def test_plot_draws_one_band_per_category():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    prepared, _ = memory_view.data(parsed(need(CPU_MARKS)))
    fig = memory_view.draw(prepared)
    try:
        ax = fig.axes[0]
        shown = prepared["devices"][0]["categories"]
        colors = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in ax.collections if len(c.get_facecolor())}
        wanted = {tuple(np.round(matplotlib.colors.to_rgb(memory_view.CATEGORY_COLORS[c]), 3)) for c in shown}
        assert wanted <= colors
        assert "stacked by category" in fig.get_suptitle()
        legend = next(leg for leg in fig.legends if leg.get_title().get_text() == "category")
        assert [t.get_text() for t in legend.get_texts()] == [c for c in CATEGORIES if c in shown]
    finally:
        plt.close(fig)


def test_report_stacks_the_timeline_and_shows_the_peak_table(tmp_path):
    payload = trace_payload(parsed(need(CPU_MARKS)))
    device = payload["views"]["memory"]["data"]["devices"][0]
    total = np.sum([v for v in device["categories"].values()], axis=0)
    assert np.array_equal(total, device["bytes"])
    page = tmp_path / "report.html"
    page.write_text(render_html(payload), encoding="utf-8")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chrome is None:
        pytest.skip("no Chromium: the page is not rendered")
    cmd = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom"]
    dom = subprocess.run([*cmd, page.as_uri()], capture_output=True, timeout=120).stdout.decode()
    assert 'data-count="0"' in dom, "the page reported an error"
    for category in device["categories"]:  # one band per category and device
        assert dom.count(f'data-category="{category}"></polygon>') == 1
    peaks = payload["summary"]["memory_categories"]["step_peaks"]
    assert dom.count('<tr data-device="cpu">') == len(peaks)


# -- diff ----------------------------------------------------------------------------------------------------------


def test_diff_of_a_trace_with_itself_has_no_memory_change():
    p = parsed(need(CPU_MARKS))
    rows = diff_data(p, p)["memory_peak_categories"]
    assert {r["category"] for r in rows} >= {"activation", "optimizer_state", "all"}
    assert all(r["delta_bytes"] == 0 and r["a_bytes"] == r["b_bytes"] for r in rows)
    peak = p.memory["allocated_bytes"].max()
    assert next(r["b_bytes"] for r in rows if r["category"] == "all") == peak
    assert sum(r["a_bytes"] for r in rows if r["category"] != "all") == peak


def grown_activation(source: Path, out: Path, growth: int) -> Path:
    """``source`` with the biggest activation live at the CPU's peak made ``growth`` bytes bigger: its alloc and
    free events' Bytes, and Total Allocated of every [memory] event of the device while it is alive."""
    p = parsed(source)
    memory, table = p.table("memory"), p.table("memory_categories")
    peaks = p.table("memory_peak_categories")
    at = int(peaks.loc[peaks["peak_allocated_bytes"].idxmax(), "peak_ts_ns"])
    live = (table["category"] == "activation") & (table["ts_ns"] <= at) & (table["free_ts_ns"] > at)
    chosen = table[live.to_numpy() & (table["free_ts_ns"] != NULL).to_numpy()].sort_values("bytes").iloc[-1]
    rows = memory.reset_index(drop=True)
    first = int(np.flatnonzero(rows["trace_index"].to_numpy() == chosen["trace_index"])[0])
    after = (rows.index > first) & (rows["ts_ns"] == chosen["free_ts_ns"]) & (rows["bytes"] == -chosen["bytes"])
    last = int(np.flatnonzero(after)[0])
    with gzip.open(source, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    alloc, free = events[int(chosen["trace_index"])], events[int(rows.loc[last, "trace_index"])]
    assert alloc["name"] == "[memory]" and alloc["args"]["Bytes"] == chosen["bytes"] == -free["args"]["Bytes"]
    alloc["args"]["Bytes"] += growth
    free["args"]["Bytes"] -= growth
    for index in rows["trace_index"].to_numpy()[first:last]:
        events[int(index)]["args"]["Total Allocated"] += growth
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    return out


def test_diff_shows_one_bigger_activation_as_exactly_that_change(tmp_path):
    a = parsed(need(CPU_MARKS))
    b = parsed(grown_activation(CPU_MARKS, tmp_path / "grown.json.gz", GROWTH))
    rows = {(r["device"], r["category"]): r for r in diff_data(a, b)["memory_peak_categories"]}
    changed = {key: r["delta_bytes"] for key, r in rows.items() if r["delta_bytes"]}
    assert changed == {("cpu", "activation"): GROWTH, ("cpu", "all"): GROWTH}
    text = render(diff_data(a, b), "text")
    assert "Memory at the peak by category" in text
    assert "+12.1 KiB" in text
    markdown = render(diff_data(a, b), "markdown")
    assert "| cpu | activation |" in markdown and "| +12.1 KiB |" in markdown
    assert json.loads(render(diff_data(a, b), "json"))["memory_peak_categories"] == list(rows.values())
