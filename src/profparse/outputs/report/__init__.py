"""``profparse report``: one self-contained HTML page (no network) of a trace or a folder of ranks.

The page embeds one JSON payload and renders it with a small vanilla-JS renderer (``assets/report.js``,
``assets/report.css``, inlined): the numbers are :func:`profparse.outputs.summary.summary_data`'s and every
registered view's ``data(parsed)`` (:mod:`profparse.outputs.views`), the same tables ``summarize`` and ``plot``
use. The headline at the top (:mod:`profparse.outputs.report.headline`) picks its numbers from the same data.
Views the renderer does not know yet are shown as their tables (times in ms) plus the PNG their ``draw`` makes.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Collection
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.analysis.memory_categories import CATEGORIES
from profparse.base.files import atomic_file
from profparse.base.formats import LONE_SURROGATE, display, plain
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.base.version import __version__
from profparse.outputs.report.headline import ranks_headline, trace_headline
from profparse.outputs.summary.critical_path import GPU_BOUNDS, LABEL_WIDTH
from profparse.outputs.views import give_back, release_order, views
from profparse.outputs.views._common import STAGE_COLORS
from profparse.outputs.views.memory import CATEGORY_COLORS
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

#: Views the page draws itself; any other registered view is shown as tables plus its PNG.
NATIVE = frozenset(
    {"stages", "timeline", "top_kernels", "top_ops", "top_runtime", "communication", "roofline"}
    | {"memory", "layers", "load", "critical_path"}
)
#: Native views whose picture is still the PNG their ``draw`` makes (the page draws their tables).
PICTURED = frozenset({"roofline"})
TIMELINE_RECTS = 20000  # aggregated spans in the page's timeline (zoomable, so finer than the PNG's 6000)
TIMELINE_PIXELS = 40000  # merge spans closer than 1/40000 of the trace: a 20x zoom still shows single spans
TIMELINE_TRACKS = 32
PATH_RECTS = 6000  # spans of the critical path's row in the timeline (a 5x zoom still separates them)
PATH_PIXELS = 10000
TOP_ROWS = 20  # names per stage in the top tables (the filter box searches these)
#: The page's own options for some views' ``data`` (finer or longer than the PNGs'); other views get none.
OPTIONS: dict[str, dict[str, int]] = {
    "timeline": {"max_tracks": TIMELINE_TRACKS, "max_rects": TIMELINE_RECTS, "pixels": TIMELINE_PIXELS},
    "critical_path": {"max_rects": PATH_RECTS, "pixels": PATH_PIXELS},
    "top_kernels": {"n": TOP_ROWS},
    "top_ops": {"n": TOP_ROWS},
    "top_runtime": {"n": TOP_ROWS},
}


#: The views' PNGs: drawn at PNG_DPI and shown at 90 px per inch (``img.view`` in report.js), so they stay sharp
#: on a high-density screen and their 9-point text reads at ~11 px
PNG_DPI = 144


def _png(module: Any, prepared: Any, titled: bool = True) -> str | None:
    """The view's own figure as a base64 PNG (for views the page cannot draw itself); ``titled=False`` leaves out
    the axes' titles (the page's heading and note above the picture say the same)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from profparse.outputs.views._common import style

    with plt.rc_context(style()):
        fig = module.draw(prepared)
        if not titled:
            for ax in fig.axes:
                ax.set_title("")
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", dpi=PNG_DPI, bbox_inches="tight", facecolor="white")
        finally:
            plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def view_payload(parsed: ParsedTrace, release: bool = False, held: Collection[str] | None = None) -> dict[str, Any]:
    """Every registered view's prepared data (or why it is skipped), in registry order. ``release``: what only a
    view reads (:data:`~profparse.outputs.views.READ_ONLY_BY`) is given back once it is made, unless it is in
    ``held`` (default: what is held now). The views are made in :func:`~profparse.outputs.views.release_order`
    (the biggest temporaries first, while the least is held)."""
    held = parsed.computed() if held is None else held
    registered = views()
    out: dict[str, Any] = {}
    for kind in release_order(registered):
        module = registered[kind]
        prepared, why = module.data(parsed, **OPTIONS.get(kind, {}))
        entry: dict[str, Any] = {"title": module.TITLE, "native": kind in NATIVE}
        if prepared is None:
            entry["skipped"] = why
        else:
            entry["data"] = plain(prepared, null=NULL)
            if kind not in NATIVE or kind in PICTURED:
                entry["png"] = _png(module, prepared, titled=kind not in PICTURED)
                entry["png_dpi"] = PNG_DPI
        out[kind] = entry
        del prepared
        if release:
            give_back(parsed, kind, held)
    return {kind: out[kind] for kind in registered}


def trace_payload(parsed: ParsedTrace, release: bool = False) -> dict[str, Any]:
    """The page's data for one trace: the summary (as ``summarize --format json``) and the views. ``release``:
    the big tables the summary makes are given back before the views are made (``summary_data``), and what only
    one view reads once it is made (:func:`view_payload`): the path, the kernels and the ops are made twice (a
    few tenths of a second on a 300 MB trace), but no view is made on top of the summary's tables."""
    from profparse.outputs.summary import summary_data

    held = parsed.computed()  # the caller's: given back by neither the summary nor the views
    summary = plain(summary_data(parsed, release=release), null=NULL)
    top = (summary.get("critical_path") or {}).get("longest") or []
    return {
        "kind": "trace",
        "title": display(Path(parsed.path).name),
        "headline": trace_headline(summary),
        "summary": summary,
        "views": view_payload(parsed, release=release, held=held),
        # the longest events on the critical path as summarize labels them (the summary keeps the full names)
        "critical_path_labels": [shorten_name(r["name"], LABEL_WIDTH, kernel=r["bound"] in GPU_BOUNDS) for r in top],
    }


def ranks_payload(data: dict[str, Any], folder: str) -> dict[str, Any]:
    """The page's data for a folder of ranks: ``data`` is ``ranks.ranks_summary_data``'s (heatmap, stragglers, late
    ranks, per rank), which the caller computes (outputs sit below the ranks layer). The late ranks' kernel and op
    names get the labels ``summarize`` shows (``label``; the full name stays in ``name``)."""
    data = plain(data, null=NULL)
    for stage in (data.get("late_ranks") or {}).get("stages") or []:
        for kind, rows in (stage.get("differences") or {}).items():
            for row in rows:
                row["label"] = shorten_name(row["name"], kernel=kind == "kernels")
    title = display(Path(folder).name or folder)
    return {"kind": "ranks", "title": title, "headline": ranks_headline(data), "ranks": data}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def render_html(payload: dict[str, Any]) -> str:
    """The page: inlined CSS, the JSON payload (every ``<`` escaped, so no string can end the script) and the JS."""
    meta = {
        "version": __version__,
        "stages": list(STAGES),
        "colors": STAGE_COLORS,
        "categories": list(CATEGORIES),
        "category_colors": CATEGORY_COLORS,
    }
    body = json.dumps({**payload, "meta": meta}, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    body = body.replace("<", "\\u003c")  # no trace text can close the script or open a comment
    # a lone surrogate (a file name that is not UTF-8, a "\\ud800" escape in a name) cannot be written as UTF-8;
    # as a JSON escape the page reads it back as the same string
    body = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", body)
    title = html.escape(f"profparse report: {payload['title']}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title>'
        f"<style>{_asset('report.css')}</style></head>\n<body>"
        '<pre id="errors" data-count="0" hidden></pre><main id="app">Loading…</main>\n'
        f'<script type="application/json" id="payload">{body}</script>\n'
        f"<script>{_asset('report.js')}</script>\n</body></html>\n"
    )


def write_report(payload: dict[str, Any], out: str | Path, *, force: bool = False, inputs: list[str]) -> int:
    """Write the page atomically (nothing half-written, inputs never touched); returns its size in bytes."""
    text = render_html(payload).encode("utf-8")
    with atomic_file(out, force=force, inputs=inputs) as tmp:
        tmp.write_bytes(text)
    return len(text)
