"""Parquet writing: tables written row group by row group give the same files as whole-table writes."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import assert_same_frame
from tracebuilder import TraceBuilder, training_step

import profparse
from profparse.outputs import parquet
from profparse.outputs.parquet import internal_tables, read_parquet, to_arrow, write_parquet


def test_sliced_writes_match_whole_writes(tmp_path, monkeypatch):
    b = TraceBuilder()
    for step in range(20):
        training_step(b, step, step * 100)
    b.memory(3, 4096, 4096)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    events = internal_tables(p)["events"]
    assert len(events) > 200
    monkeypatch.setattr(parquet, "ROW_GROUP", 48)
    out = write_parquet(p, tmp_path / "sliced")
    whole = tmp_path / "whole.parquet"
    table = to_arrow(events).replace_schema_metadata({"profparse.source": str(p.path)})
    pq.write_table(table, whole, row_group_size=48, compression="zstd")
    sliced = pq.ParquetFile(out / "events.parquet")
    reference = pq.ParquetFile(whole)
    assert sliced.schema_arrow == reference.schema_arrow
    assert sliced.schema_arrow.metadata == reference.schema_arrow.metadata
    rows = [sliced.metadata.row_group(i).num_rows for i in range(sliced.metadata.num_row_groups)]
    assert rows == [reference.metadata.row_group(i).num_rows for i in range(reference.metadata.num_row_groups)]
    assert sliced.read().equals(reference.read())
    monkeypatch.setattr(parquet, "ROW_GROUP", 1 << 20)
    again = read_parquet(write_parquet(p, tmp_path / "whole_out"))
    for name, frame in read_parquet(out).items():
        assert frame.equals(again[name]), name


def test_row_groups_can_be_skipped_by_time_and_step(tmp_path, monkeypatch):
    """Numeric columns keep min/max statistics per row group (what DuckDB/pyarrow filters skip row groups by);
    a filter on ts_ns reads only the row groups that hold those times and returns exactly the matching rows."""
    import pyarrow.dataset as ds

    b = TraceBuilder()
    for step in range(20):
        training_step(b, step, step * 100)
    p = profparse.parse(b.write(tmp_path / "t.json"))
    monkeypatch.setattr(parquet, "ROW_GROUP", 48)
    out = write_parquet(p, tmp_path / "out")
    meta = pq.ParquetFile(out / "events.parquet").metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    for column in ("ts_ns", "dur_ns", "step"):
        stats = meta.row_group(1).column(names.index(column)).statistics
        assert stats is not None and stats.has_min_max, column
    events = read_parquet(out)["events"]
    cut = int(events["ts_ns"].quantile(0.9))
    fragment = next(ds.dataset(out / "events.parquet").get_fragments())
    kept = fragment.split_by_row_group(ds.field("ts_ns") >= cut)
    assert 0 < len(kept) < meta.num_row_groups
    got = ds.dataset(out / "events.parquet").to_table(filter=ds.field("ts_ns") >= cut)
    assert got.num_rows == int((events["ts_ns"] >= cut).sum())


def test_duckdb_reads_the_tables_as_pandas_does(tmp_path):
    """What a user's DuckDB reads from ``parse -o`` (integers DELTA_BINARY_PACKED, text dictionary-encoded, NULLs)
    is what pandas reads: the kernel time per stage and the stage of every event (a real A100 trace)."""
    duckdb = pytest.importorskip("duckdb")
    from conftest import REPO_GPU_TRACES

    out = write_parquet(profparse.parse(REPO_GPU_TRACES / "a100_ddp_rank0_nccl.json.gz"), tmp_path / "out")
    kernels = pq.read_table(out / "kernels.parquet").to_pandas()
    by_stage = kernels.groupby("stage", observed=True)["dur_ns"].sum()
    rows = duckdb.sql(f"SELECT stage, sum(dur_ns) FROM '{out}/kernels.parquet' GROUP BY stage").fetchall()
    assert {stage: int(total) for stage, total in rows} == {str(s): int(t) for s, t in by_stage.items()}
    assert len(by_stage) >= 3 and int(by_stage.sum()) == int(kernels["dur_ns"].sum())
    events = pq.read_table(out / "events.parquet", columns=["trace_index", "ts_ns", "stage", "correlation"])
    events = events.to_pandas()
    got = duckdb.sql(f"SELECT trace_index, ts_ns, stage, correlation FROM '{out}/events.parquet' ORDER BY trace_index")
    frame = got.df()
    assert frame["ts_ns"].tolist() == events["ts_ns"].tolist()
    assert frame["stage"].astype(str).tolist() == events["stage"].astype(str).tolist()
    missing = events["correlation"].isna()
    assert 0 < missing.sum() < len(events) and frame["correlation"].isna().tolist() == missing.tolist()
    values = events["correlation"].dropna().astype("int64").tolist()
    assert frame["correlation"].dropna().astype("int64").tolist() == values


def test_release_computes_each_table_once_and_writes_the_same(tmp_path, monkeypatch):
    """``write_parquet(release=True)`` (``profparse parse``): a table that a later one reads through ``parsed`` (the
    critical path, for the findings) is held until then, not computed twice; afterwards only what was held before
    is held; the files are those of a writer that keeps everything."""
    from profparse.analysis import critical_path

    builder = TraceBuilder()
    for step in range(6):
        training_step(builder, step, step * 100)
    trace = builder.write(tmp_path / "t.json")
    calls = []
    path_table = critical_path.path_table
    monkeypatch.setattr(critical_path, "path_table", lambda **kw: calls.append(1) or path_table(**kw))
    parsed = profparse.load(trace, cache=False)
    before = parsed.computed()
    write_parquet(parsed, tmp_path / "released", release=True)
    assert len(calls) == 1
    assert parsed.computed() <= before | {"substeps"}
    kept = read_parquet(write_parquet(profparse.load(trace, cache=False), tmp_path / "kept"))
    released = read_parquet(tmp_path / "released")
    assert sorted(kept) == sorted(released)
    for name, frame in kept.items():
        assert_same_frame(released[name], frame, obj=name)


@pytest.mark.parametrize(
    "name", ["qwen2_tiny_cpu_marks.json.gz", "gpu/a100_ddp_rank0_nccl.json.gz", "gpu/mi250_minitoy.json.gz"]
)
def test_event_slices_from_columns_equal_the_event_table(name):
    """The writer converts each slice of the events table to Arrow from its columns (no DataFrame): on real traces
    (loading sub-steps, sparse args, GPU links) every slice equals the event table's rows converted as a frame."""
    from conftest import SAMPLE_TRACES

    from profparse.tables.parsed import event_columns, event_rows

    p = profparse.load(SAMPLE_TRACES / name, cache=False)
    n = len(p.raw.events)
    for start, stop in ((0, n), (0, 1), (n // 3, 2 * n // 3 + 1), (n - 5, n)):
        expected = to_arrow(event_rows(p, start, stop))
        made = parquet.RowSlices(n, lambda a, b: event_rows(p, a, b), lambda a, b: event_columns(p, a, b))
        got = made.arrow(start, stop)
        assert got.schema == expected.schema and got.equals(expected), (start, stop)
    assert event_rows(p, 0, n)["substage"].notna().any() or "cpu" not in name  # the CPU capture loads a model
