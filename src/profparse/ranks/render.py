"""The multi-rank summary: the data (plain, JSON-ready), then its text, markdown and csv renderers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.base.errors import UsageError
from profparse.base.formats import display, md_cell, md_code, ms_text, plain, render_as
from profparse.base.formats import text_table as _table
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.outputs.summary.findings import (
    NONE_LINE,
    SUMMARY_FINDINGS,
    advise_pointer,
    findings_data,
    findings_text,
)
from profparse.ranks import critical_path as rank_paths
from profparse.ranks import late
from profparse.ranks.advice import ranks_findings
from profparse.ranks.discovery import RankFile, describe_sources
from profparse.ranks.results import RankResult
from profparse.ranks.stragglers import DEFAULT_METRIC, METRICS, per_rank_totals, stragglers


def ranks_summary_data(
    results: Sequence[RankResult],
    metric: str = DEFAULT_METRIC,
    folder: str | Path | None = None,
    *,
    matches: pd.DataFrame | None = None,
    match_warnings: Sequence[str] = (),
    top: int = late.TOP_N,
) -> dict[str, Any]:
    """Everything the multi-rank summary shows, as plain JSON-ready data.

    ``matches``: the ``collective_matches`` rows (:func:`profparse.ranks.late.match`); by default matched here
    from the results' collective rows (a dataset written before that table existed has none: no late ranks).
    """
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    per_rank = per_rank_totals(results)
    table = stragglers(per_rank, metric)
    files = [RankFile(r.path, r.rank, r.source) for r in results]
    if matches is None and any(r.ok and r.collectives is not None for r in results):
        matches, match_warnings = late.match((r.rank, r.collectives) for r in results if r.ok)
    totals = [(r.rank, r.stage_names) for r in results if r.ok]
    late_ranks = late.late_data(matches, match_warnings, totals, top)
    _stage_times(late_ranks, per_rank, METRICS[metric][0])
    late_ranks["path_waits"] = rank_paths.summary_waits(results, matches, folder)  # the late rank on the path
    findings = findings_data(ranks_findings(results, matches, folder, late_ranks))
    return {
        "folder": str(folder) if folder is not None else None,
        "metric": metric,
        "metric_column": METRICS[metric][0],
        "ranks": [
            {
                "rank": r.rank,
                "rank_source": r.source,
                "file": r.path,
                "status": "ok" if r.ok else "failed",
                "events": r.events,
                "devices": r.devices,
            }
            for r in sorted(results, key=lambda r: r.rank)
        ],  # fmt: skip
        "rank_sources": describe_sources(files),
        "per_rank": [
            {k: (str(v) if k == "stage" else plain(v)) for k, v in row.items()} for row in per_rank.to_dict("records")
        ],
        "stragglers": [{k: plain(v) for k, v in row.items()} for row in table.to_dict("records")],
        "failed_ranks": [
            {"rank": r.rank, "file": r.path, "error": r.error, "exit_code": r.exit_code}
            for r in sorted(results, key=lambda r: r.rank)
            if not r.ok
        ],
        "late_ranks": late_ranks,
        "findings": findings,  # each rank's and the late ranks', biggest saving first (profparse advise DIR)
    }


def _stage_times(late_ranks: dict[str, Any], per_rank: pd.DataFrame, column: str) -> None:
    """Add to each stage with a late rank that rank's stage time and the median over ranks (the summary metric)."""
    for item in late_ranks["stages"]:
        if item.get("late_rank") is None or column not in per_rank.columns:
            continue
        part = per_rank[per_rank["stage"] == item["stage"]]
        mine = part[part["rank"] == item["late_rank"]][column]
        item["stage_ns"] = {
            "metric": column,
            "rank_ns": plain(mine.iloc[0]) if len(mine) else None,
            "median_ns": float(np.median(part[column].astype("int64"))) if len(part) else None,
        }


def _pct(share: Any) -> str:
    return "-" if share is None else f"{share:+.1%}"


def _matrix(data: dict[str, Any]) -> tuple[list[int], dict[tuple[int, str], Any]]:
    column = data["metric_column"]
    cells = {(row["rank"], row["stage"]): row[column] for row in data["per_rank"]}
    ranks = sorted({row["rank"] for row in data["per_rank"]})
    return ranks, cells


def _straggler_rows(data: dict[str, Any]) -> list[list[str]]:
    return [
        [
            s["stage"],
            ms_text(s["median_ns"]),
            ms_text(s["min_ns"]),
            ms_text(s["max_ns"]),
            "-" if s["slowest_rank"] is None else str(s["slowest_rank"]),
            ms_text(s["lead_ns"]),
            _pct(s["lead_share"]),
        ]
        for s in data["stragglers"]
    ]


def _devices_line(ranks: list[dict[str, Any]]) -> str:
    """The devices the ranks ran on: ``NVIDIA A100 x 8 ranks``, or ``no GPU`` when no rank ran GPU work."""
    read = [r for r in ranks if r["status"] == "ok"]
    counts: dict[str, int] = {}
    for r in read:
        for name in sorted(set(r["devices"])):
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "no GPU"
    return ", ".join(f"{display(name)} ({n} of {len(read)} ranks)" for name, n in sorted(counts.items()))


STRAGGLER_HEADERS = ["stage", "median", "fastest", "slowest", "slowest rank", "lead", "lead %"]


LATE_HEADERS = ["stage", "collectives", "late", "late rank", "times last", "mean delay", "max delay", "waiting",
                "transfer", "waiting %"]  # fmt: skip


def _late_rows(late_ranks: dict[str, Any]) -> list[list[str]]:
    def opt(v: Any) -> str:
        return "-" if v is None else str(v)

    return [
        [s["stage"], str(s["collectives"]), str(s["late"]), opt(s["late_rank"]), opt(s["times_last"]),
         ms_text(s["mean_delay_ns"]), ms_text(s["max_delay_ns"]), ms_text(s["waiting_ns"]), ms_text(s["transfer_ns"]),
         "-" if s["waiting_share"] is None else f"{s['waiting_share']:.1%}"]
        for s in late_ranks["stages"]
    ]  # fmt: skip


def _late_intro(late_ranks: dict[str, Any]) -> str:
    if not late_ranks["available"]:
        return "not in this dataset (written before profparse matched collectives; parse the traces again)"
    if not late_ranks["collectives"]:
        return "no collective was matched across ranks (no NCCL/RCCL collective kernels on two or more ranks)"
    return (
        f"{late_ranks['collectives']} collectives matched across {late_ranks['ranks']} ranks, ms; "
        "waiting = until the last rank starts its kernel"
    )


def _stage_line(s: dict[str, Any]) -> str:
    line = f"{s['stage']}: rank {s['late_rank']} arrived last in {s['times_last']} of {s['collectives']} collectives"
    times = s.get("stage_ns")
    if times and times["rank_ns"] is not None:
        rank, median = ms_text(times["rank_ns"]), ms_text(times["median_ns"])
        line += f"; its {s['stage']} took {rank} ms, the median rank {median} ms"
    return line


def _difference_rows(s: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    diffs = s.get("differences") or {}
    return [(kind[:-1], d) for kind in ("kernels", "ops") for d in diffs.get(kind, [])]


def _late_text(late_ranks: dict[str, Any]) -> list[str]:
    lines = ["", f"Late ranks ({_late_intro(late_ranks)})"]
    lines += [f"  warning: {display(w)}" for w in late_ranks["warnings"]]
    if late_ranks["stages"]:
        lines.append(_table(LATE_HEADERS, _late_rows(late_ranks)))
    for s in late_ranks["stages"]:
        if s.get("late_rank") is None:
            continue
        lines += ["", f"  {_stage_line(s)}; what it did differently (against the median rank):"]
        rows = [[kind, _signed_ms(d["delta_ns"]), ms_text(d["rank_ns"]), ms_text(d["median_ns"]),
                 shorten_name(d["name"])] for kind, d in _difference_rows(s)]  # fmt: skip
        if rows:
            lines.append(_table(["", "more", f"rank {s['late_rank']}", "median", "name"], rows, last_left=True))
        else:
            lines.append("  (no kernel or op time differs)")
    if late_ranks.get("path_waits"):
        lines += ["", f"  {PATH_WAITS_TITLE}:", _table(PATH_WAIT_HEADERS, _path_wait_rows(late_ranks))]
    return lines


PATH_WAITS_TITLE = "On each rank's critical path: waiting for a later rank (ms; per step: over the steps it waited)"
PATH_WAIT_HEADERS = ["rank", "stage", "waited for rank", "on path", "steps", "per step"]


def _path_wait_rows(late_ranks: dict[str, Any]) -> list[list[str]]:
    return [
        [str(w["rank"]), w["stage"], str(w["waited_rank"]), ms_text(w["wait_ns"]), str(w["steps"]),
         ms_text(w["per_step_ns"])]
        for w in late_ranks["path_waits"]
    ]  # fmt: skip


def _late_markdown(late_ranks: dict[str, Any]) -> list[str]:
    lines = ["", "## Late ranks", "", f"{md_cell(_late_intro(late_ranks))}.", ""]
    lines += [f"- warning: {md_code(w)}" for w in late_ranks["warnings"]]
    if late_ranks["stages"]:
        lines += ["| " + " | ".join(LATE_HEADERS) + " |", "|" + "---|" * len(LATE_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in _late_rows(late_ranks)]
    for s in late_ranks["stages"]:
        if s.get("late_rank") is None:
            continue
        lines += ["", f"### {md_cell(_stage_line(s))}", ""]
        lines += ["| | more (ms) | late rank (ms) | median (ms) | name |", "|---|---|---|---|---|"]
        for kind, d in _difference_rows(s):
            name = md_code(shorten_name(d["name"]))
            rank, median = ms_text(d["rank_ns"]), ms_text(d["median_ns"])
            lines.append(f"| {kind} | {_signed_ms(d['delta_ns'])} | {rank} | {median} | {name} |")
    if late_ranks.get("path_waits"):
        lines += ["", f"### {PATH_WAITS_TITLE}", "", "| " + " | ".join(PATH_WAIT_HEADERS) + " |"]
        lines += ["|" + "---|" * len(PATH_WAIT_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in _path_wait_rows(late_ranks)]
    return lines


def _signed_ms(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e6:+,.2f}"


def render_ranks_text(data: dict[str, Any]) -> str:
    label = METRICS[data["metric"]][1]
    n_ok = sum(r["status"] == "ok" for r in data["ranks"])
    failed = len(data["failed_ranks"])
    lines = [
        f"profparse ranks summary: {display(data['folder'])}",
        f"  {len(data['ranks'])} rank traces ({display(data['rank_sources'])}), {n_ok} read, {failed} failed",
        f"  devices: {_devices_line(data['ranks'])}",
        "",
        f"{label[0].upper()}{label[1:]} per rank and stage (ms)",
    ]
    lines[3:3] = _findings_text(data.get("findings") or [], data["folder"])  # on top, after the header
    ranks, cells = _matrix(data)
    rows = [[str(r)] + [ms_text(cells.get((r, s))) for s in STAGES] for r in ranks]
    lines.append(_table(["rank", *STAGES], rows))
    lines += ["", f"Stragglers per stage ({label}, ms; lead = slowest rank minus the median)"]
    lines.append(_table(STRAGGLER_HEADERS, _straggler_rows(data)))
    lines += _late_text(data["late_ranks"])
    if data["failed_ranks"]:
        lines += ["", "Failed ranks (not in the tables above)"]
        lines += [f"  rank {f['rank']}: {display(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


def _findings_text(findings: list[dict[str, Any]], folder: Any) -> list[str]:
    """The first findings of all ranks (``profparse advise DIR`` lists them all, with their evidence)."""
    if not findings:
        return ["", NONE_LINE]
    body = findings_text(findings, SUMMARY_FINDINGS, evidence=False, margin="  ").rstrip("\n")
    lines = ["", f"Findings ({len(findings)} over all ranks, biggest saving first)", *body.split("\n")]
    return [line.rstrip() for line in lines] + [advise_pointer(len(findings) - SUMMARY_FINDINGS, folder, "DIR")]


def render_ranks_markdown(data: dict[str, Any]) -> str:
    label = METRICS[data["metric"]][1]
    folder = Path(data["folder"]).name if data["folder"] else "ranks"
    sources = md_cell(data["rank_sources"])
    lines = [f"# profparse ranks summary: {md_code(folder)}", "", f"{len(data['ranks'])} ranks ({sources}).", ""]
    lines += [f"## {label[0].upper()}{label[1:]} per rank and stage (ms)", ""]
    lines.append("| rank | " + " | ".join(STAGES) + " |")
    lines.append("|" + "---|" * (len(STAGES) + 1))
    ranks, cells = _matrix(data)
    for r in ranks:
        lines.append(f"| {r} | " + " | ".join(ms_text(cells.get((r, s))) for s in STAGES) + " |")
    lines += ["", f"## Stragglers per stage ({label}, ms)", ""]
    lines.append("| " + " | ".join(STRAGGLER_HEADERS) + " |")
    lines.append("|" + "---|" * len(STRAGGLER_HEADERS))
    for row in _straggler_rows(data):
        lines.append("| " + " | ".join(row) + " |")
    lines += _late_markdown(data["late_ranks"])
    if data["failed_ranks"]:
        lines += ["", "## Failed ranks", ""]
        lines += [f"- rank {f['rank']}: {md_code(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


CSV_LATE = ("times_last", "waiting_ns", "transfer_ns")


def render_ranks_csv(data: dict[str, Any]) -> str:
    """One row per (stage, rank): the metric, the stage median, this rank's lead over it, the slowest flag, and in
    the stage's collectives: how often this rank arrived last, its waiting and transfer time (empty when the
    dataset has no ``collective_matches``), and ``path_wait_ns``: the time on its critical path in that stage spent
    waiting for a later rank (summed over the ranks it waited for)."""
    column = data["metric_column"]
    by_stage = {s["stage"]: s for s in data["stragglers"]}
    late_ranks = data["late_ranks"]
    collectives = {(r["stage"], r["rank"]): r for r in late_ranks["per_rank"]}
    empty = {"times_last": 0, "waiting_ns": 0, "transfer_ns": 0} if late_ranks["available"] else {}
    waited: dict[tuple[str, int], int] = {}
    for w in late_ranks.get("path_waits") or []:
        waited[(w["stage"], w["rank"])] = waited.get((w["stage"], w["rank"]), 0) + int(w["wait_ns"])
    rows = []
    for row in data["per_rank"]:
        s = by_stage.get(row["stage"], {})
        median = s.get("median_ns")
        rows.append(
            {
                "stage": row["stage"],
                "rank": row["rank"],
                column: row[column],
                "stage_median_ns": median,
                "lead_over_median_ns": None if median is None else row[column] - median,
                "slowest": s.get("slowest_rank") == row["rank"],
                **{k: collectives.get((row["stage"], row["rank"]), empty).get(k) for k in CSV_LATE},
                "path_wait_ns": waited.get((row["stage"], row["rank"]), 0 if late_ranks["available"] else None),
            }
        )
    columns = ["stage", "rank", column, "stage_median_ns", "lead_over_median_ns", "slowest", *CSV_LATE, "path_wait_ns"]
    frame = pd.DataFrame(rows, columns=columns)
    for k in (*CSV_LATE, "path_wait_ns"):
        frame[k] = frame[k].astype("Int64")
    if len(frame):
        frame["stage"] = pd.Categorical(frame["stage"], categories=list(STAGES))
        frame = frame.sort_values(["stage", "rank"], kind="stable")
    return frame.to_csv(index=False)


def render_ranks(data: dict[str, Any], fmt: str = "text") -> str:
    renderers = {"text": render_ranks_text, "markdown": render_ranks_markdown, "csv": render_ranks_csv}
    return render_as(data, fmt, renderers)
