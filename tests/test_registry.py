"""The table registry (``profparse.tables.registry``) is the one place a table is declared: every entry resolves,
its needs are known, its columns are documented, and the API, the Parquet writer and the cache follow it (a new
entry is enough for a new table to be computed, written and stored)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pandas as pd
import pytest

import profparse
from profparse.outputs.parquet import read_parquet, write_parquet
from profparse.tables import registry
from profparse.tables.parsed import ParsedTrace
from profparse.tables.registry import INPUTS, TABLES, VALUES, TableSpec

REPO = Path(__file__).resolve().parents[1]
SAMPLES = [
    REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz",
    REPO / "sample_traces" / "gpu" / "a100_ddp_rank0_nccl.json.gz",
]


@pytest.mark.parametrize("spec", [*TABLES.values(), *VALUES.values()], ids=lambda s: s.name)
def test_every_entry_resolves_and_takes_what_it_needs(spec) -> None:
    function = spec.function()
    assert callable(function)
    known = set(INPUTS) | set(TABLES) | set(VALUES)
    assert set(spec.needs) <= known, f"{spec.name} needs something undeclared: {set(spec.needs) - known}"
    parameters = inspect.signature(function).parameters
    required = {name for name, p in parameters.items() if p.default is inspect.Parameter.empty}
    sliced = {"start", "stop"} if getattr(spec, "sliced", False) else set()
    # called with its needs as keyword arguments: every need is a parameter, every parameter without a default a need
    unknown = set(spec.needs) - set(parameters)
    assert not unknown, f"{spec.name}: needs that are no parameter: {unknown}"
    assert required <= set(spec.needs) | sliced, f"{spec.name}: parameters given nothing: {required - set(spec.needs)}"


def test_needs_form_no_cycle() -> None:
    declared = {**TABLES, **VALUES}
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name not in declared or state.get(name) == "done":
            return
        assert state.get(name) != "open", f"cycle: {' -> '.join((*path, name))}"
        state[name] = "open"
        for need in declared[name].needs:
            visit(need, (*path, name))
        state[name] = "done"

    for name in declared:
        visit(name, ())


def test_reads_name_declared_tables_of_entries_given_the_whole_trace() -> None:
    """``reads`` (what a table reads through ``parsed``) names tables and values, and only a table given ``parsed``
    can read anything that way; the writer holds and forgets tables by it."""
    for spec in TABLES.values():
        assert set(spec.reads) <= set(TABLES) | set(VALUES), f"{spec.name} reads something undeclared"
        assert not spec.reads or "parsed" in spec.needs, f"{spec.name} has reads but is not given parsed"
    assert {"critical_path", "flops", "peak"} <= registry.inputs_of("findings")
    assert "flop_counts" in registry.inputs_of("findings")  # through flops and peak


@pytest.fixture(scope="module")
def parsed_samples() -> list[ParsedTrace]:
    return [profparse.load(path, cache=False) for path in SAMPLES]


def test_every_public_table_is_an_attribute_and_its_columns_are_documented(parsed_samples) -> None:
    for spec in registry.public_tables():
        doc = (REPO / spec.doc).read_text()
        headings = [line for line in doc.splitlines() if line.startswith("#")]
        assert any(re.search(rf"\b{spec.name}\b", h) for h in headings), f"no heading names {spec.name} in {spec.doc}"
        documented = set(re.findall(r"`([a-z0-9_]+)`", doc))
        for parsed in parsed_samples:
            frame = getattr(parsed, spec.name)
            assert isinstance(frame, pd.DataFrame)
            missing = [c for c in frame.columns if c not in documented]
            assert not missing, f"{spec.name}: columns not documented in {spec.doc}: {missing}"


def test_parse_writes_exactly_the_written_tables(parsed_samples, tmp_path: Path) -> None:
    out = write_parquet(parsed_samples[1], tmp_path / "out")
    assert sorted(p.stem for p in out.glob("*.parquet")) == sorted(s.name for s in registry.written())


def extra_rows(stage_summary: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """A table made from the raw events and another table: one row per kind, and the stage summary's row count."""
    counts = events["kind"].astype(str).value_counts().sort_index()
    return pd.DataFrame({"kind": counts.index, "events": counts.to_numpy(), "summary_rows": len(stage_summary)})


def test_one_new_entry_is_computed_written_and_stored(monkeypatch, tmp_path: Path) -> None:
    spec = TableSpec("extra", f"{__name__}:extra_rows", ("events", "stage_summary"), "docs/tables.md", "test table")
    monkeypatch.setitem(TABLES, "extra", spec)
    monkeypatch.setenv("PROFPARSE_CACHE_DIR", str(tmp_path / "cache"))
    parsed = profparse.load(SAMPLES[0])
    expected = extra_rows(
        events=parsed.raw.events, stage_summary=parsed.table("stage_summary")
    )  # parameters not in needs order: passed by name
    pd.testing.assert_frame_equal(parsed.extra, expected)
    assert parsed.extra["events"].sum() == len(parsed.raw.events)
    folder = write_parquet(parsed, tmp_path / "out")
    written = read_parquet(folder)["extra"]
    assert written["events"].tolist() == expected["events"].tolist()
    again = profparse.load(SAMPLES[0])  # from the cache entry the first load stored
    assert again.cache is not None and again.cache.table("extra") is not None
    pd.testing.assert_frame_equal(again.table("extra"), expected)


def test_public_tables_have_nulls_not_sentinels(parsed_samples) -> None:
    """The internal NULL sentinel (and the sparse columns the event table keeps rarely set args in) never reach
    users: every public table's integer columns are plain or nullable, with no NULL value left in them."""
    from profparse.trace.kinds import NULL

    for parsed in parsed_samples:
        for spec in registry.public_tables():
            frame = getattr(parsed, spec.name)
            for column in frame.columns:
                dtype = frame[column].dtype
                assert not isinstance(dtype, pd.SparseDtype), f"{spec.name}.{column} is sparse"
                if pd.api.types.is_integer_dtype(dtype):
                    assert not (frame[column] == NULL).any(), f"{spec.name}.{column} holds the NULL sentinel"


def test_public_tables_are_typed_attributes_in_registry_order() -> None:
    """IDEs and type checkers see ``parsed.kernels``: ParsedTrace's TYPE_CHECKING block declares one property per
    public table, in registry order (add the line this test names with a new public table)."""
    source = (REPO / "src" / "profparse" / "tables" / "parsed.py").read_text(encoding="utf-8")
    declared = re.findall(r"^        def (\w+)\(self\) -> pd\.DataFrame: \.\.\.$", source, re.M)
    wanted = [spec.name for spec in registry.public_tables()]
    missing = [f"        @property\n        def {n}(self) -> pd.DataFrame: ..." for n in wanted if n not in declared]
    assert declared == wanted, "tables/parsed.py's TYPE_CHECKING block needs:\n" + "\n".join(missing)
    assert all(isinstance(getattr(ParsedTrace, name), property) for name in wanted)  # attached at run time
