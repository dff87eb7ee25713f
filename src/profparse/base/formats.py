"""One way to turn report data into text: a renderer per format, JSON for free.

Names in a trace (kernels, ops, threads, devices, files, modules, rules) are whatever its writer put there.
Human-readable outputs (text, markdown, plot labels) show them through :func:`display` (control characters
and bidi overrides as visible escapes), markdown tables through :func:`md_cell` / :func:`md_code`, and
:func:`render_as` passes every text and markdown rendering through :func:`terminal_safe` as a last guard. CSV
and JSON keep names exact.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Renderer = Callable[[dict[str, Any]], str]
PLAIN_FORMATS = frozenset({"json", "csv"})  # machine-readable: names stay exact

# C0 controls (ESC, BEL, CR, NUL, newline, ...), DEL, C1 controls (CSI ...), bidi marks, embeddings, overrides and
# isolates, and the line/paragraph separators: what can move the cursor, recolour or clear a terminal, reorder
# the text around it, or break a line or a table row; and lone surrogates, which no UTF-8 writer (a terminal, an
# HTML page, matplotlib, Arrow metadata) accepts: Python keeps the bytes of a file name that is not UTF-8 as
# U+DC80-U+DCFF (PEP 383), shown as the byte they stand for (``tr\xffce.json``)
_OTHER_UNSAFE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_OTHER_UNSAFE}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHER_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_BACKTICKS = re.compile("`+")
_PIPE = re.compile(r"(\\*)\|")


#: a lone surrogate: what no UTF-8 writer accepts (a byte of a file name that is not UTF-8, a "\\ud800" escape)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTES = range(0xDC80, 0xDD00)  # a byte 0x80-0xff of a name that is not UTF-8 (surrogateescape)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code in _ESCAPED_BYTES:
        return f"\\x{code - 0xDC00:02x}"
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def display(value: Any) -> str:
    """``value`` as text that is safe to print: each unsafe character (see ``_UNSAFE``) becomes a visible escape
    (``\\x1b``, ``\\n``, ``\\u202e``); everything else, other non-ASCII text included, is kept."""
    text = str(value)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def path_text(path: Any) -> str:
    """``path`` as text any UTF-8 writer accepts (Parquet metadata, JSON), otherwise exact: only the bytes of a
    name that is not UTF-8 become visible escapes (``tr\\xffce.json``), as :func:`display` shows them."""
    text = str(path)
    return LONE_SURROGATE.sub(_escape, text) if LONE_SURROGATE.search(text) else text


def terminal_safe(text: str) -> str:
    """A whole rendering with its line breaks kept and any other unsafe character escaped (a last guard)."""
    return _UNSAFE_BUT_NEWLINE.sub(_escape, text) if _UNSAFE_BUT_NEWLINE.search(text) else text


def md_cell(value: Any) -> str:
    """``value`` as markdown text in a table cell: displayed safely; backslashes, ``|`` and backticks escaped,
    ``<`` ``>`` as entities (no raw HTML)."""
    text = display(value).replace("\\", "\\\\")
    for char, escaped in (("|", "\\|"), ("`", "\\`"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def md_code(value: Any) -> str:
    """``value`` as a markdown code span (in a table cell or not): displayed safely, ``|`` escaped (the
    backslashes before one doubled, so the escape holds), delimited by one more backtick than its longest run
    of backticks (CommonMark), padded where it starts or ends with one."""
    text = _PIPE.sub(lambda m: m.group(1) * 2 + "\\|", display(value))
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_table(headers: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    """Markdown table lines; cells are given already escaped (:func:`md_cell`, :func:`md_code`, numbers).

    ``align``: one letter per column, ``l`` or ``r`` (default: all ``---``)."""
    rule = [":---" if a == "l" else "---:" if a == "r" else "---" for a in align] or ["---"] * len(headers)
    return ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def render_as(data: dict[str, Any], fmt: str, renderers: Mapping[str, Renderer]) -> str:
    """Render ``data`` with the renderer for ``fmt``; ``json`` is always available."""
    if fmt in renderers:
        text = renderers[fmt](data)
        return text if fmt in PLAIN_FORMATS else terminal_safe(text)
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    choices = ", ".join([*renderers, "json"])
    raise ValueError(f"unknown format {fmt!r}; expected one of {choices}")


# -- JSON-ready data and the numbers shown in tables ------------------------------------------------------------------


def plain(value: Any, *, null: int | None = None) -> Any:
    """``value`` as JSON-ready data, the one converter of every JSON output (summary, ranks, report page).

    Recursive: DataFrames as ``{"index", "columns", "cols"}`` (columnar), Series and arrays as lists, dicts (keys as
    text), lists and tuples as lists. numpy scalars become Python ones; missing values (None, ``pd.NA``, ``pd.NaT``,
    NaN, infinities) become None, and so does ``null``, an int that stands for a missing one (the tables' NULL
    sentinel, passed by callers that read tables holding it). Text and bools are kept, anything else becomes text.
    numpy and pandas are imported here, not with this module: the CLI starts without them."""
    import math

    import numpy as np
    import pandas as pd

    def convert(v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, bool | np.bool_):
            return bool(v)
        if isinstance(v, int | np.integer):
            return None if null is not None and v == null else int(v)
        if isinstance(v, float | np.floating):
            return float(v) if math.isfinite(v) else None
        if isinstance(v, dict):
            return {str(k): convert(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [convert(x) for x in v]
        if isinstance(v, pd.DataFrame):
            return {
                "index": [convert(i) for i in v.index],
                "columns": [str(c) for c in v.columns],
                "cols": {str(c): convert(v[c].to_numpy()) for c in v.columns},
            }
        if isinstance(v, pd.Series):
            v = v.to_numpy()
        if isinstance(v, np.ndarray):
            if v.dtype.kind in "iu":
                return v.tolist() if null is None else [None if x == null else x for x in v.tolist()]
            if v.dtype.kind == "f":
                return [x if math.isfinite(x) else None for x in v.tolist()]
            return [convert(x) for x in v.tolist()]
        return None if v is pd.NA or v is pd.NaT else str(v)

    return convert(value)


def ms_text(ns: Any) -> str:
    """Nanoseconds as milliseconds with two decimals and thousands separators; ``-`` for None."""
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def us_text(ns: Any) -> str:
    """Nanoseconds as microseconds with one decimal and thousands separators; ``-`` for None."""
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def share_text(x: Any) -> str:
    """A fraction as a percentage with one decimal (``0.253`` -> ``25.3%``); ``-`` for None."""
    return "-" if x is None else f"{x:.1%}"


def count_text(count: int, noun: str) -> str:
    """``count`` of ``noun`` with thousands separators, the noun plural but for one: ``1 GPU event``, ``1,204 GPU
    events``."""
    return f"{int(count):,} {noun}{'' if count == 1 else 's'}"


def utilisation_text(x: Any) -> str:
    """An MFU or HFU as a percentage: :func:`share_text`, but two significant digits under 0.1% (a tiny model's
    ``0.033%``, which one decimal shows as ``0.0%``), and ``<0.0001%`` below that; ``-`` for None."""
    if x is None or not 0 < x < 0.001:
        return share_text(x)
    if x < 1e-6:
        return "<0.0001%"
    return f"{x * 100:.2g}%"  # from 1e-4 (%) up, ``g`` writes it without an exponent


def bytes_text(n: Any) -> str:
    """A byte count in the largest binary unit it reaches (``1.5 MiB``, ``-2.0 KiB``, ``512 B``); ``-`` for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:,.1f} {unit}"
    return f"{sign}{n} B"


def total_bytes_text(n: Any) -> str:
    """A byte total (memcpy, collectives) as :func:`bytes_text` shows it, or ``0`` when there is none."""
    return bytes_text(n) if n else "0"


TEXT_WIDTH = 100  # a summary line fits a terminal of this width (a longer last, left-aligned column wraps)


def text_table(headers: list[str], rows: list[list[str]], align_left: int = 1, *, last_left: bool = False) -> str:
    """A plain text table: the first ``align_left`` columns (and the last, with ``last_left``) left-aligned, the
    rest right-aligned; cells shown through :func:`display`, so a name cannot break a row or reach a terminal.
    With ``last_left``, a last column that would pass :data:`TEXT_WIDTH` wraps onto continuation lines."""
    headers = [display(h) for h in headers]
    rows = [[display(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    if last_left and len(widths) > 1:
        room = max(30, TEXT_WIDTH - 2 - sum(widths[:-1]) - 2 * (len(widths) - 1))
        if widths[-1] > room:
            widths[-1] = max(room, len(headers[-1]))
            wrapped = []
            for r in rows:
                pieces = textwrap.wrap(r[-1], widths[-1], break_long_words=True) or [""]
                wrapped.append([*r[:-1], pieces[0]])
                wrapped += [["" for _ in r[:-1]] + [piece] for piece in pieces[1:]]
            rows = wrapped
    left = set(range(align_left)) | ({len(headers) - 1} if last_left else set())
    lines = []
    for row in [headers, *rows]:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  " + "  ".join(cells).rstrip())
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- sections as tables: one description, rendered as text, markdown and csv -----------------------------------------

CSV_COLUMNS = ("step", "stage", "section", "name", "column", "value")


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`: ``key`` in its rows (and csv's ``column``), ``label`` shown as header,
    ``fmt`` turns a raw value into the cell shown in text and markdown; ``code``: a name (markdown code span)."""

    key: str
    label: str
    fmt: Callable[[Any], str] = str
    code: bool = False


@dataclass
class Table:
    """A section of a report as data: the renderers below show it as text, markdown and csv alike.

    ``rows`` hold raw values by column key; the first ``index`` columns name a row (left-aligned; csv's ``step``,
    ``stage`` and ``name``), the rest are its values. ``note`` follows the title in parentheses, ``footer`` the
    table. ``group``: a repeated first cell is shown once. ``records`` replace the csv rows derived from ``rows``
    (for a pivoted table whose cells hold several values). ``text_rows``: at most that many rows in a terminal,
    the first and the last few, with a row saying how many are left out (markdown and csv keep them all)."""

    title: str
    columns: list[Column]
    rows: list[dict[str, Any]]
    note: str = ""
    footer: str = ""
    index: int = 1
    last_left: bool = False
    group: bool = False
    records: list[dict[str, Any]] | None = field(default=None)
    text_rows: int | None = None

    def cells(self) -> list[list[str]]:
        out, previous = [], None
        for row in self.rows:
            cells = [c.fmt(row.get(c.key)) for c in self.columns]
            if self.group and cells and cells[0] == previous:
                cells[0], previous = "", cells[0]
            elif cells:
                previous = cells[0]
            out.append(cells)
        return out

    def csv_records(self) -> list[dict[str, Any]]:
        if self.records is not None:
            return [{"section": self.title, **r} for r in self.records]
        keys, values = self.columns[: self.index], self.columns[self.index :]
        out = []
        for row in self.rows:
            base: dict[str, Any] = {"section": self.title}
            names = []
            for c in keys:
                if c.key in ("step", "stage"):
                    base[c.key] = row.get(c.key)
                else:
                    names.append(str(row.get(c.key)))
            base["name"] = " / ".join(names) if names else None
            out += [{**base, "column": c.key, "value": row.get(c.key)} for c in values]
        return out


def tables_text(tables: list[Table]) -> str:
    """Tables for a terminal, each after a blank line: title (note), the table, its footer."""
    parts = []
    for t in tables:
        head = f"{t.title} ({t.note})" if t.note else t.title
        cells, left_out = _folded(t)
        body = text_table([c.label for c in t.columns], cells, t.index, last_left=t.last_left)
        if left_out:
            body += f"\n  ({left_out:,} rows left out here: --format markdown, csv or json lists them all)"
        parts.append(f"\n{head}\n{body}\n" + (f"  {t.footer}\n" if t.footer else ""))
    return "".join(parts)


#: rows a per-step table shows in a terminal (:attr:`Table.text_rows`): a capture of hundreds of steps would bury
#: the sections after it; markdown, csv and json list every step
STEP_ROWS = 20
#: rows a folded table shows after the left-out ones
FOLDED_TAIL = 5


def _folded(t: Table) -> tuple[list[list[str]], int]:
    """``t``'s cells, its first and last rows only where it has more than ``text_rows`` (with a row of dots
    between them), and how many it left out."""
    cells = t.cells()
    if t.text_rows is None or len(cells) <= t.text_rows:
        return cells, 0
    head, tail = t.text_rows - FOLDED_TAIL - 1, FOLDED_TAIL
    return [*cells[:head], ["..."] + [""] * (len(t.columns) - 1), *cells[-tail:]], len(cells) - head - tail


def tables_markdown(tables: list[Table]) -> list[str]:
    """Tables as markdown lines: a ``##`` heading each, the note and footer as a paragraph below the table."""
    lines: list[str] = []
    for t in tables:
        rows = [
            [md_code(v) if c.code and v else md_cell(v) for c, v in zip(t.columns, r, strict=True)] for r in t.cells()
        ]
        lines += ["", f"## {md_cell(t.title)}", "", *md_table([md_cell(c.label) for c in t.columns], rows)]
        sentences = [" ".join(w.split()) for w in (t.note, t.footer) if w]
        if sentences:
            lines += ["", " ".join(md_cell(w if w.endswith(".") else w + ".") for w in sentences)]
    return lines


def tables_csv(tables: list[Table]) -> str:
    """All tables as one long csv: a row per (section, step, stage, name, column) with its raw value.

    Rows end in ``\\n``; a field that holds ``\\r`` or ``\\n`` is quoted (the csv module quotes only the
    characters of its line terminator, so each row is written with ``\\r\\n`` and its ending replaced): a name
    with a carriage return does not split its row for csv readers."""
    line = io.StringIO()
    writer = csv.writer(line, lineterminator="\r\n")
    rows = []
    for values in [list(CSV_COLUMNS)] + [
        ["" if record.get(k) is None else record.get(k) for k in CSV_COLUMNS]
        for t in tables
        for record in t.csv_records()
    ]:
        line.seek(0)
        line.truncate()
        nul = _nul_stand_in(values)
        writer.writerow(values if nul is None else [v.replace("\0", nul) if isinstance(v, str) else v for v in values])
        text = line.getvalue()[:-2] + "\n"
        rows.append(text if nul is None else text.replace(nul, "\0"))
    return "".join(rows)


def _nul_stand_in(values: list[Any]) -> str | None:
    """Before Python 3.11 the csv module refuses a NUL in a field ("need to escape"); from 3.11 it writes it as it
    is. Where a field holds one on an older Python: a character no field holds, to write in its place and turn
    back into NUL after (the same text as 3.11 writes); else None."""
    if sys.version_info >= (3, 11) or not any(isinstance(v, str) and "\0" in v for v in values):
        return None
    held = "".join(v for v in values if isinstance(v, str))
    return next(chr(c) for c in range(0xE000, 0x110000) if chr(c) not in held)
