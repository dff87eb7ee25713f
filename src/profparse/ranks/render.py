"""The multi-rank summary: the data (plain, JSON-ready), then its text, markdown and csv renderers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profparse.errors import UsageError
from profparse.marks import STAGES
from profparse.outputs.formats import display, md_cell, md_code, render_as
from profparse.outputs.formats import text_table as _table
from profparse.ranks.discovery import RankFile, describe_sources
from profparse.ranks.results import RankResult
from profparse.ranks.stragglers import DEFAULT_METRIC, METRICS, per_rank_totals, stragglers


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def ranks_summary_data(
    results: Sequence[RankResult], metric: str = DEFAULT_METRIC, folder: str | Path | None = None
) -> dict[str, Any]:
    """Everything the multi-rank summary shows, as plain JSON-ready data."""
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    per_rank = per_rank_totals(results)
    table = stragglers(per_rank, metric)
    files = [RankFile(r.path, r.rank, r.source) for r in results]
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
            {k: (str(v) if k == "stage" else _plain(v)) for k, v in row.items()} for row in per_rank.to_dict("records")
        ],
        "stragglers": [{k: _plain(v) for k, v in row.items()} for row in table.to_dict("records")],
        "failed_ranks": [
            {"rank": r.rank, "file": r.path, "error": r.error, "exit_code": r.exit_code}
            for r in sorted(results, key=lambda r: r.rank)
            if not r.ok
        ],
    }


def _ms(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


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
            _ms(s["median_ns"]),
            _ms(s["min_ns"]),
            _ms(s["max_ns"]),
            "-" if s["slowest_rank"] is None else str(s["slowest_rank"]),
            _ms(s["lead_ns"]),
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
    ranks, cells = _matrix(data)
    rows = [[str(r)] + [_ms(cells.get((r, s))) for s in STAGES] for r in ranks]
    lines.append(_table(["rank", *STAGES], rows))
    lines += ["", f"Stragglers per stage ({label}, ms; lead = slowest rank minus the median)"]
    lines.append(_table(STRAGGLER_HEADERS, _straggler_rows(data)))
    if data["failed_ranks"]:
        lines += ["", "Failed ranks (not in the tables above)"]
        lines += [f"  rank {f['rank']}: {display(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


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
        lines.append(f"| {r} | " + " | ".join(_ms(cells.get((r, s))) for s in STAGES) + " |")
    lines += ["", f"## Stragglers per stage ({label}, ms)", ""]
    lines.append("| " + " | ".join(STRAGGLER_HEADERS) + " |")
    lines.append("|" + "---|" * len(STRAGGLER_HEADERS))
    for row in _straggler_rows(data):
        lines.append("| " + " | ".join(row) + " |")
    if data["failed_ranks"]:
        lines += ["", "## Failed ranks", ""]
        lines += [f"- rank {f['rank']}: {md_code(f['error'])}" for f in data["failed_ranks"]]
    return "\n".join(lines) + "\n"


def render_ranks_csv(data: dict[str, Any]) -> str:
    """One row per (stage, rank): the metric, the stage median, this rank's lead over it, and the slowest flag."""
    column = data["metric_column"]
    by_stage = {s["stage"]: s for s in data["stragglers"]}
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
            }
        )
    frame = pd.DataFrame(rows, columns=["stage", "rank", column, "stage_median_ns", "lead_over_median_ns", "slowest"])
    if len(frame):
        frame["stage"] = pd.Categorical(frame["stage"], categories=list(STAGES))
        frame = frame.sort_values(["stage", "rank"], kind="stable")
    return frame.to_csv(index=False)


def render_ranks(data: dict[str, Any], fmt: str = "text") -> str:
    renderers = {"text": render_ranks_text, "markdown": render_ranks_markdown, "csv": render_ranks_csv}
    return render_as(data, fmt, renderers)
