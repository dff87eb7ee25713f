"""The summary's per-stage "top" tables (kernels, ops, runtime calls): one shape, one builder."""

from __future__ import annotations

from typing import Any

from profparse.base.formats import Column, Table, ms_text, share_text


def stage_top_table(title: str, rows: list[dict[str, Any]], label: str, csv_keys: tuple[str, ...], note: str) -> Table:
    """Per stage its top names: time (ms), share, calls and ``label`` (a code span), the stage shown once.

    ``rows`` hold ``stage``, ``name``, ``label``, ``total_ns``, ``share``, ``count``; csv gets ``csv_keys`` of each."""
    columns = [
        Column("stage", "stage"),
        Column("total_ns", "ms", ms_text),
        Column("share", "share", share_text),
        Column("count", "calls", lambda n: f"{n:,}"),
        Column("label", label, code=True),
    ]
    records = [{"stage": r["stage"], "name": r["name"], "column": c, "value": r[c]} for r in rows for c in csv_keys]
    return Table(title, columns, rows, note=note, index=1, last_left=True, group=True, records=records)
