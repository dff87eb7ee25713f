"""profparse in Jupyter: ``ParsedTrace._repr_html_`` (the headline and the overview per stage) and
``ParsedTrace.report()`` (the full report inline, ``.save(path)``), with the report's own numbers, no Jupyter
import, and both drawn in headless Chromium as a notebook would embed them."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_TRACES
from conftest import parsed as parsed_once
from test_report import screenshot

from profparse.base.errors import OutputExistsError
from profparse.base.formats import plain
from profparse.cli.main import main as cli
from profparse.outputs.report.headline import trace_headline
from profparse.outputs.summary import summary_data
from profparse.outputs.views._common import STAGE_COLORS, fmt_time
from profparse.trace.kinds import NULL

CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
MI250 = SAMPLE_TRACES / "gpu" / "mi250_minitoy.json.gz"
ROOT = Path(__file__).resolve().parents[1]


def _cells(page: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td>(.*?)</td>", page)]


@pytest.mark.parametrize("path", [CPU_MARKS, MI250], ids=["cpu", "mi250"])
def test_repr_html_shows_headline_and_overview(path: Path) -> None:
    parsed = parsed_once(path)
    page = parsed._repr_html_()
    summary = plain(summary_data(parsed), null=NULL)
    for item in trace_headline(summary):  # every headline box, as the report words it
        assert f'<div class="text">{html.escape(str(item["text"]))}</div>' in page
    gpu = summary["gpu_activity_ns"] > 0
    width = 7 if gpu else 4
    cells = _cells(page)
    assert len(cells) == width * len(summary["totals"])
    for row, total in zip(np.reshape(cells, (-1, width)), summary["totals"], strict=True):
        assert row[0] == total["stage"] and row[1] == fmt_time(total["host_wall_ns"])
        if gpu:
            assert row[4] == fmt_time(total["gpu_busy_ns"] or 0) and row[6] == f"{total['kernel_count']:,}"
    shares = [float(row[2].rstrip("%")) for row in np.reshape(cells, (-1, width))]
    assert abs(sum(shares) - 100) < 0.1 * len(shares)  # the stages' shares add up to the whole


def test_report_inline_and_saved(tmp_path: Path) -> None:
    parsed = parsed_once(CPU_MARKS)
    report = parsed.report()
    frame = report._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="([^"]*)" style="[^"]*" title="[^"]*"></iframe>', frame)
    assert srcdoc is not None and html.unescape(srcdoc.group(1)) == report.html  # the page, escaped once
    saved = report.save(tmp_path / "nb.html")
    assert saved.read_text(encoding="utf-8") == report.html
    with pytest.raises(OutputExistsError):
        report.save(saved)
    assert report.save(saved, force=True) == saved
    # the same page as `profparse report` (its payload block, which holds every number)
    assert cli(["report", "--no-cache", "-q", str(CPU_MARKS), "-o", str(tmp_path / "cli.html")]) == 0
    payload = re.compile(r'<script type="application/json" id="payload">(.*?)</script>', re.S)
    assert payload.search(report.html).group(1) == payload.search((tmp_path / "cli.html").read_text()).group(1)


def test_no_jupyter_import() -> None:
    code = (
        "import sys\n"
        "for name in ('IPython', 'ipykernel', 'jupyter', 'notebook', 'nbformat'): sys.modules[name] = None\n"
        "import profparse\n"
        f"p = profparse.parse({str(CPU_MARKS)!r})\n"
        "assert p._repr_html_().startswith('<style>') and p.report()._repr_html_().startswith('<iframe')\n"
        "print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def _pixels_near(image: np.ndarray, rgb: np.ndarray) -> int:
    return int((np.abs(image - rgb).max(axis=-1) < 0.03).sum())


def test_chromium_draws_both(tmp_path: Path) -> None:
    """A page holding both outputs, as a notebook embeds them: the overview's stage swatches and the report inside
    its frame (its headline and stage colours) are drawn."""
    parsed = parsed_once(CPU_MARKS)
    page = tmp_path / "notebook.html"
    body = f'<div style="height:320px;overflow:hidden">{parsed._repr_html_()}</div>{parsed.report()._repr_html_()}'
    page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{body}</body></html>')
    image = screenshot(page, tmp_path / "notebook.png", size="1300,1000")
    (Path(os.environ.get("PROFPARSE_KEEP_SCREENSHOT", tmp_path)) / "notebook.png").write_bytes(
        (tmp_path / "notebook.png").read_bytes()
    )
    top, frame = image[:320], image[340:]
    for stage in ("forward", "backward", "optimizer"):
        rgb = np.array([int(STAGE_COLORS[stage][i : i + 2], 16) / 255 for i in (1, 3, 5)])
        assert _pixels_near(top, rgb) >= 50, f"{stage} swatch not drawn in the overview"
        assert _pixels_near(frame, rgb) >= 60, f"{stage} not drawn in the inline report"
    assert (frame.mean(axis=-1) < 0.5).sum() > 2000  # the report's text rendered inside the frame


def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Notebooks example of docs/integrations.md, run in a folder holding ``trace.json.gz``."""
    text = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = text.split("\n## Notebooks\n", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))
    shutil.copyfile(CPU_MARKS, tmp_path / "trace.json.gz")
    monkeypatch.chdir(tmp_path)
    names: dict = {"__name__": "docs_example"}
    exec(compile(code, "docs/integrations.md", "exec"), names)
    assert 'class="head"' in names["trace"]._repr_html_()
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == names["trace"].report().html
