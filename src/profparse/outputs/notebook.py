"""profparse in Jupyter: what a :class:`~profparse.tables.parsed.ParsedTrace` shows as a cell's result, and the
full report inline.

``ParsedTrace._repr_html_`` and ``ParsedTrace.report()`` name these functions as ``"module:function"`` strings
resolved when called (the tables layer sits below outputs). The numbers are the report's: the headline items of
:mod:`profparse.outputs.report.headline` and the overview of ``summarize --format json``. Nothing here imports
Jupyter or IPython: a notebook finds ``_repr_html_`` by name.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.base.formats import plain
from profparse.outputs.report import render_html, trace_payload, write_report
from profparse.outputs.report.headline import trace_headline
from profparse.outputs.views._common import STAGE_COLORS, fmt_time
from profparse.trace.kinds import NULL

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

#: Height of the inline report's frame (the page scrolls inside it).
REPORT_HEIGHT_PX = 720

_STYLE = (
    "<style>.profparse-nb{font:13px system-ui,sans-serif;color:#222}"
    ".profparse-nb .head{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}"
    ".profparse-nb .item{border:1px solid #ddd;border-radius:4px;padding:4px 8px;min-width:120px}"
    ".profparse-nb .label{color:#666;font-size:11px}.profparse-nb .text{font-size:15px;font-weight:600}"
    ".profparse-nb .detail{color:#666;font-size:11px;max-width:260px}"
    ".profparse-nb table{border-collapse:collapse}.profparse-nb td,.profparse-nb th{padding:2px 10px;"
    "text-align:right;border-bottom:1px solid #eee}.profparse-nb td:first-child,.profparse-nb th:first-child"
    "{text-align:left}.profparse-nb .swatch{display:inline-block;width:10px;height:10px;margin-right:5px}</style>"
)


def _headline_html(items: list[dict[str, Any]]) -> str:
    boxes = [
        f'<div class="item" title="{html.escape(str(i["detail"]))}"><div class="label">{html.escape(i["label"])}'
        f'</div><div class="text">{html.escape(str(i["text"]))}</div>'
        f'<div class="detail">{html.escape(str(i["detail"]))}</div></div>'
        for i in items
    ]
    return f'<div class="head">{"".join(boxes)}</div>'


def _overview_html(summary: dict[str, Any]) -> str:
    """Per stage: host wall and its share, host ops and, on a trace with GPU work, GPU busy, idle and kernels."""
    gpu = summary["gpu_activity_ns"] > 0
    columns = ["stage", "host wall", "share", "host ops"] + (["GPU busy", "GPU idle", "kernels"] if gpu else [])
    rows = []
    for total in summary["totals"]:
        color = STAGE_COLORS.get(total["stage"], "#999")
        cells = [
            f'<span class="swatch" style="background:{color}"></span>{html.escape(total["stage"])}',
            fmt_time(total["host_wall_ns"]),
            f"{total['share']:.1%}" if total["share"] is not None else "-",
            fmt_time(total["host_op_ns"]),
        ]
        if gpu:
            cells += [fmt_time(total["gpu_busy_ns"] or 0), fmt_time(total["gpu_idle_ns"] or 0)]
            cells.append(f"{total['kernel_count']:,}")
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    head = "<tr>" + "".join(f"<th>{name}</th>" for name in columns) + "</tr>"
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def trace_html(parsed: ParsedTrace) -> str:
    """A cell's view of a trace: its name, steps and events, the report's headline and the overview per stage."""
    from profparse.outputs.summary import summary_data

    summary = plain(summary_data(parsed), null=NULL)
    steps = len(summary["step_totals"])
    title = (
        f"<b>profparse</b> {html.escape(Path(parsed.path).name)}: {summary['events']:,} events, "
        f"{steps} step{'s' if steps != 1 else ''}"
    )
    hint = "<code>.report()</code> shows the full report; tables: <code>.stage_summary</code>, <code>.kernels</code>, …"
    return (
        f'{_STYLE}<div class="profparse-nb"><div>{title}</div>{_headline_html(trace_headline(summary))}'
        f'{_overview_html(summary)}<div class="label">{hint}</div></div>'
    )


class Report:
    """The full HTML report of a trace (``profparse report``'s page): shown inline in Jupyter, saved by ``save``."""

    def __init__(self, payload: dict[str, Any], source: str) -> None:
        self.payload = payload
        self.source = source
        self._html: str | None = None

    @property
    def html(self) -> str:
        """The page, self-contained (inlined script and styles, no network)."""
        if self._html is None:
            self._html = render_html(self.payload)
        return self._html

    def _repr_html_(self) -> str:
        """The page in an ``<iframe srcdoc>``: its script and styles stay apart from the notebook's."""
        page = html.escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{page}" style="width:100%;height:{REPORT_HEIGHT_PX}px;border:1px solid #ddd" '
            f'title="profparse report: {html.escape(self.payload["title"])}"></iframe>'
        )

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write the page to ``path`` as ``profparse report -o`` does (atomically; replaces a file only with
        ``force``); returns the path."""
        write_report(self.payload, path, force=force, inputs=[self.source])
        return Path(path)

    def __repr__(self) -> str:
        return f"<profparse Report of {self.payload['title']!r}: .save(path) writes it; Jupyter shows it inline>"


def trace_report(parsed: ParsedTrace) -> Report:
    """The report object of ``ParsedTrace.report()``."""
    return Report(trace_payload(parsed), parsed.path)
