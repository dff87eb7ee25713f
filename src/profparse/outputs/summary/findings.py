"""The "Findings" section: what to change next and what it saves per step (the ``findings`` table,
:mod:`profparse.analysis.advice`), as JSON-ready data and as the numbered list ``advise`` and ``summarize`` print.

``summarize`` shows the first :data:`SUMMARY_FINDINGS` on top of its summary and points to ``profparse advise`` for
the rest; ``advise`` shows them all with their evidence. A rank folder's findings carry their ``rank``.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pandas as pd

from profparse.analysis.advice.finding import parse_steps, steps_text
from profparse.base.formats import Column, Table, count_text, display, md_cell, md_code, ms_text, render_as, share_text
from profparse.base.names import shorten_name

SUMMARY_FINDINGS = 5  # findings on top of the summary; ``advise`` lists them all
EVIDENCE_LINES = 3  # top events and Python frames shown per finding
NONE_LINE = "No finding saves 1% of a step or more."
WIDTH = 100
NAME_WIDTH = 70
#: the time of a top event, by the first of these keys it has (else its first ``*_ns``)
TIME_KEYS = ("ns", "total_ns", "path_ns", "saving_ns", "extra_ns", "delta_ns", "delay_ns", "dur_ns")
#: the keys of a finding in JSON, in order (``rank`` first for a rank folder's)
KEYS = ("kind", "stage", "steps", "saving_ns_per_step", "saving_share", "confidence", "message", "fix", "evidence")


def findings_data(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    """The findings table (biggest saving first) as JSON-ready dicts: ``steps`` as a list of step numbers,
    ``evidence`` as an object; a ``rank`` column, when there is one, first."""
    if frame is None or frame.empty:
        return []
    keys = (("rank",) if "rank" in frame.columns else ()) + KEYS
    out = []
    for row in frame.to_dict("records"):
        item = {k: row[k] for k in keys}
        item["steps"] = parse_steps(str(row["steps"]))
        item["evidence"] = _evidence(row["evidence"])
        item["saving_ns_per_step"] = int(row["saving_ns_per_step"])
        item["saving_share"] = float(row["saving_share"])
        if "rank" in item:
            item["rank"] = int(item["rank"])
        for k in ("kind", "stage", "confidence", "message", "fix"):
            item[k] = str(item[k])
        out.append(item)
    return out


def _evidence(text: Any) -> dict[str, Any]:
    """The evidence column (JSON object text) as an object; anything else as ``{"text": ...}``."""
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {"text": str(text)}
    return value if isinstance(value, dict) else {"value": value}


# -- the numbered list -----------------------------------------------------------------------------------------------


#: characters of a step list a finding's heading shows whole; a longer one shows its first two and last runs
STEPS_SHOWN = 40


def steps_label(steps: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``steps 1-3,5``; no steps: ``all steps``; a long list as its first two and last runs
    and how many steps (``steps 5-6,1004-1006,...,33004-33006 (102 steps)``: one unbroken "word" of hundreds of
    characters was wrapped in the middle of its numbers). The tables and JSON keep the whole list."""
    if not steps:
        return "all steps"
    text = steps_text(steps)
    word = "step " if len(steps) == 1 else "steps "
    runs = text.split(",")
    if len(text) <= STEPS_SHOWN or len(runs) <= 3:
        return word + text
    return f"{word}{runs[0]},{runs[1]},...,{runs[-1]} ({len(set(steps))} steps)"


def heading(n: int, f: dict[str, Any]) -> str:
    """A finding's first line: number, (rank,) kind, stage, steps, saving per step and share, confidence."""
    where = f"rank {f['rank']} · " if f.get("rank") is not None else ""
    return (
        f"{n}. {where}{f['kind']} · {f['stage']} · {steps_label(f['steps'])}: saves "
        f"{ms_text(f['saving_ns_per_step'])} ms per step ({share_text(f['saving_share'])}), "
        f"confidence {f['confidence']}"
    )


def _wrapped(label: str, text: str, indent: str, hang: str = "  ") -> list[str]:
    """``label`` + ``text`` wrapped to :data:`WIDTH` columns, ``indent`` first, continuation lines ``hang`` more."""
    first = f"{indent}{label}" if label else indent
    return textwrap.wrap(
        display(text), WIDTH, initial_indent=first, subsequent_indent=indent + hang, break_on_hyphens=False
    ) or [first.rstrip()]


def _event_parts(item: Any) -> tuple[str, str, Any]:
    """(name, its time as text, count) of a top event however a detector wrote it: a dict (its time under one of
    :data:`TIME_KEYS`, any ``*_ns``, or ``ms_per_step``), a [name, ns] pair, or a name."""
    if isinstance(item, dict):
        name = next((item[k] for k in ("name", "label", "event", "op", "kernel") if k in item), "")
        numbers = [k for k, v in item.items() if isinstance(v, int | float) and not isinstance(v, bool)]
        ns_key = next((k for k in (*TIME_KEYS, *numbers) if k in numbers and (k == "ns" or k.endswith("_ns"))), None)
        if ns_key:
            return str(name), f"{ms_text(item[ns_key]):>9} ms", item.get("count")
        if "ms_per_step" in numbers:
            return str(name), f"{item['ms_per_step']:>9,.2f} ms/step", item.get("count")
        return str(name), "", item.get("count")
    if isinstance(item, list | tuple) and item:
        numbers = [v for v in item[1:] if isinstance(v, int | float) and not isinstance(v, bool)]
        count = numbers[1] if len(numbers) > 1 else None
        return str(item[0]), f"{ms_text(numbers[0]):>9} ms" if numbers else "", count
    return str(item), "", None


def _frame_text(item: Any) -> str:
    """A Python frame: ``file(line): function`` from a dict, as it is from text."""
    if isinstance(item, dict):
        where = item.get("file") or item.get("filename") or ""
        line = item.get("line") or item.get("lineno")
        name = item.get("name") or item.get("function") or ""
        return f"{where}({line}): {name}" if line is not None else f"{where} {name}".strip()
    return str(item)


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def evidence_lines(evidence: dict[str, Any], indent: str, limit: int = EVIDENCE_LINES) -> list[str]:
    """The evidence worth reading first: the top events (time, name, count) and the Python frames."""
    lines: list[str] = []
    events = evidence.get("top_events")
    if isinstance(events, list) and events:
        lines.append(f"{indent}top events:")
        for item in events[:limit]:
            name, time, count = _event_parts(item)
            times = f"{time}  " if time else ""
            more = f"  (x{count:,})" if isinstance(count, int) and count > 1 else ""
            lines.append(f"{indent}  {times}{display(shorten_name(name, NAME_WIDTH, kernel=False))}{more}")
    scalars = [f"{k}={v:,}" if isinstance(v, int | float) else f"{k}={v}" for k, v in evidence.items() if _scalar(v)]
    if scalars:
        lines += _wrapped("numbers: ", ", ".join(scalars), indent)
    frames = evidence.get("frames")
    if isinstance(frames, list) and frames:
        lines.append(f"{indent}Python frames:")
        lines += [
            f"{indent}  {display(shorten_name(_frame_text(x), NAME_WIDTH, kernel=False))}" for x in frames[:limit]
        ]
    return lines


def finding_lines(n: int, f: dict[str, Any], *, evidence: bool, margin: str = "") -> list[str]:
    """One finding as text: its heading, what was found, the fix, and (``evidence``) the top evidence lines; every
    line starts with ``margin`` and fits :data:`WIDTH` columns (a name cut to fit)."""
    indent = margin + " " * (len(str(n)) + 2)
    lines = _wrapped("", heading(n, f), margin, " " * (len(str(n)) + 4))
    lines += _wrapped("", f["message"], indent)
    lines += _wrapped("fix: ", f["fix"], indent)
    if evidence:
        lines += evidence_lines(f["evidence"], indent)
    return lines


def findings_text(
    findings: list[dict[str, Any]], limit: int | None = None, *, evidence: bool = True, margin: str = ""
) -> str:
    """The numbered list (the first ``limit``, else all), biggest saving first; :data:`NONE_LINE` when empty."""
    if not findings:
        return margin + NONE_LINE + "\n"
    shown = findings if limit is None else findings[:limit]
    blocks = ["\n".join(finding_lines(i, f, evidence=evidence, margin=margin)) for i, f in enumerate(shown, 1)]
    return "\n\n".join(blocks) + "\n"


def advise_pointer(more: int, source: Any, placeholder: str = "TRACE", margin: str = "  ") -> str:
    """The line after the first findings: how many more, and the command that lists them all with evidence
    (``placeholder`` for the input when its path is unknown or too long for the line)."""
    lead = f"{margin}({more} more, and the evidence: " if more > 0 else f"{margin}(their evidence: "
    line = f"{lead}profparse advise {display(source)})"
    return line if source and len(line) <= WIDTH else f"{lead}profparse advise {placeholder})"


#: under the findings' heading where they were measured in steps that may be warm-up (check ``warm_up_only``)
WARM_UP_NOTE = "measured in steps that may be warm-up, so all at low confidence: see the check warm_up_only"
WARM_UP_LINE = f"  ({WARM_UP_NOTE})\n"


def warm_up_only(findings: list[dict[str, Any]]) -> bool:
    """The findings were measured in steps that may be warm-up (their evidence says ``measured_in``)."""
    return any("measured_in" in (f.get("evidence") or {}) for f in findings)


def summary_findings_text(data: dict[str, Any]) -> str:
    """The summary's "Findings" section on top: the first :data:`SUMMARY_FINDINGS`, a pointer to ``advise``."""
    findings = data.get("findings") or []
    if not findings:  # one line of the header, not a section
        return f"  {NONE_LINE}\n"
    head = f"\nFindings ({len(findings)}, biggest saving first; saving = time on the critical path the fix removes)\n"
    head += WARM_UP_LINE if warm_up_only(findings) else ""
    body = findings_text(findings, SUMMARY_FINDINGS, evidence=False, margin="  ")
    return f"{head}{body}{advise_pointer(len(findings) - SUMMARY_FINDINGS, data.get('trace'))}\n"


# -- markdown and csv ------------------------------------------------------------------------------------------------


def findings_markdown(data: dict[str, Any]) -> list[str]:
    """The section as markdown lines: a numbered list, the fix under each finding."""
    findings = data.get("findings") or []
    if not findings:
        return ["", NONE_LINE]
    lines = ["", "## Findings", ""]
    if warm_up_only(findings):
        lines += [WARM_UP_NOTE[0].upper() + WARM_UP_NOTE[1:] + ".", ""]
    for i, f in enumerate(findings[:SUMMARY_FINDINGS], 1):
        lines.append(f"{md_cell(heading(i, f))}  ")
        lines.append(f"   {md_cell(f['message'])}  ")
        lines.append(f"   fix: {md_code(f['fix'])}")
    lines += ["", f"All findings and their evidence: {md_code('profparse advise')}."]
    return lines


def findings_tables(data: dict[str, Any]) -> list[Table]:
    """The findings as one table (csv: one row per finding and value)."""
    findings = data.get("findings") or []
    if not findings:
        return []
    rows = [{**f, "name": f"{i}. {f['kind']}", "steps": steps_text(f["steps"])} for i, f in enumerate(findings, 1)]
    columns = [
        Column("name", "finding"),
        Column("stage", "stage"),
        Column("steps", "steps"),
        Column("saving_ns_per_step", "saves per step", ms_text),
        Column("saving_share", "share", share_text),
        Column("confidence", "confidence"),
        Column("fix", "fix"),
    ]
    return [Table("Findings", columns, rows, index=2, last_left=True)]


# -- profparse advise ------------------------------------------------------------------------------------------------


def advice_text(data: dict[str, Any]) -> str:
    """``advise``'s text: where the findings come from, then every finding with its evidence."""
    findings = data["findings"]
    head = f"profparse advise: {display(data['source'])}\n"
    if findings:
        head += (
            f"  {count_text(len(findings), 'finding')}, biggest saving first; saving: the time on "
            "the step's critical path the fix removes, per step\n"
        )
        head += WARM_UP_LINE if warm_up_only(findings) else ""
    return f"{head}\n{findings_text(findings)}"


def render_advice(findings: list[dict[str, Any]], source: str, fmt: str = "text") -> str:
    """``advise``'s output: text, or JSON ``{"findings": [...]}`` (the ``findings`` key of ``summarize``'s)."""
    if fmt == "json":
        return json.dumps({"findings": findings}, indent=2) + "\n"
    return render_as({"findings": findings, "source": source}, fmt, {"text": advice_text})
