"""Arrow IPC files of DataFrames (LZ4-compressed, sealed with their checksum): written a batch at a time, read
back memory-mapped without a second copy, and checked to read back identical before a table is kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from profparse.cache.sealed import seal, sealed_payload

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: schema metadata of a stored frame: {column: fill value} of the sparse columns (the event table's rarely set args,
#: see trace/table.args_column), which Arrow holds as plain integers and reading turns back into sparse ones
SPARSE_KEY = b"profparse.sparse"

#: rows per record batch of a stored frame: a whole event table converted at once raised the peak of a first
#: ``parse`` by over half the JSON's size (its all-NULL args columns, which take no memory in pandas, materialised
#: too); converting a batch at a time keeps one batch of it
BATCH_ROWS = 1 << 18


def write_frame(path: Path, frame: pd.DataFrame) -> None:
    """One DataFrame as an Arrow IPC file (a zero-row frame still as one batch, so categories survive), a long one
    without object columns one :data:`BATCH_ROWS` slice at a time (every slice has the same Arrow types); sealed
    with its checksum (:func:`~profparse.cache.sealed.seal`)."""
    import pyarrow as pa

    if len(frame) <= BATCH_ROWS or any(str(t) == "object" for t in frame.dtypes):
        slices = [frame]
    else:
        slices = [frame.iloc[start : start + BATCH_ROWS] for start in range(0, len(frame), BATCH_ROWS)]
    sparse = {c: int(frame[c].dtype.fill_value) for c in frame.columns if str(frame[c].dtype).startswith("Sparse")}
    first = pa.Table.from_pandas(_dense(slices[0], sparse), preserve_index=None)
    schema = first.schema
    if sparse:
        schema = schema.with_metadata({**(schema.metadata or {}), SPARSE_KEY: json.dumps(sparse).encode()})
        first = first.replace_schema_metadata(schema.metadata)
    batches = first.combine_chunks().to_batches() or [pa.RecordBatch.from_pandas(frame, preserve_index=None)]
    del first
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
        del batches
        for part in slices[1:]:
            writer.write_table(pa.Table.from_pandas(_dense(part, sparse), preserve_index=None, schema=schema))
    seal(path)


def _dense(frame: pd.DataFrame, sparse: dict[str, int]) -> pd.DataFrame:
    """``frame`` with its ``sparse`` columns dense (Arrow has no sparse type); a slice at a time."""
    if not sparse:
        return frame
    out = frame.copy(deep=False)
    for column in sparse:
        out[column] = frame[column].to_numpy()
    return out


def _sparse_again(frame: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """The columns :func:`write_frame` stored dense because they were sparse, sparse again."""
    from profparse.trace.table import sparse_column

    for column, fill in json.loads((schema.metadata or {}).get(SPARSE_KEY, b"{}")).items():
        if column in frame.columns:  # (a frame read a column at a time has one)
            frame[column] = sparse_column(frame[column].to_numpy(), fill)
    return frame


def read_frame(path: Path) -> pd.DataFrame:
    """A frame :func:`write_frame` stored, checked against its checksum.

    The file is memory-mapped and the decoded Arrow buffers become the frame's columns without a second copy
    (``split_blocks``: no consolidation into 2-D blocks; ``self_destruct``: each column's Arrow buffers are
    released as it is converted), and a frame of several batches is decoded one column at a time (joining a
    column's batches copies it: one column at a time, never the whole table): a warm load must not need more
    memory than parsing the JSON. Numeric columns are then read-only views, which pandas copies on write.

    The buffers come from the C library's allocator, which hands a freed large block back to the system at once:
    Arrow's default (mimalloc) kept tens of MB more resident after reading a large event table."""
    import pandas as pd
    import pyarrow as pa

    pool = pa.system_memory_pool()
    payload = sealed_payload(path)
    reader = pa.ipc.open_file(payload, memory_pool=pool)
    fields = len(reader.schema)
    schema = reader.schema
    if reader.num_record_batches <= 1 or fields <= 1:
        table = reader.read_all()
        del reader
        frame = table.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True)
        del table  # self_destruct leaves the table unusable: drop it
        return _sparse_again(frame, schema)
    del reader
    columns = []
    for i in range(fields):
        options = pa.ipc.IpcReadOptions(included_fields=[i])
        part = pa.ipc.open_file(payload, options=options, memory_pool=pool).read_all()
        columns.append(_sparse_again(part.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True), schema))
        del part
    return pd.concat(columns, axis=1)


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Identical values, dtypes, columns and index (what a cached table must give back)."""
    return (
        a.shape == b.shape
        and list(a.columns) == list(b.columns)
        and [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes]
        and a.index.equals(b.index)
        and a.equals(b)
    )


FULL_CHECK_CELLS = 1 << 20


def write_checked(path: Path, frame: pd.DataFrame) -> bool:
    """Write ``frame``; whether it reads back the same. A big frame without object columns is checked by its
    schema only (dtypes, columns): Arrow holds such columns losslessly, and reading back the event table to
    compare values was ~40% of the time that storing it took."""
    import pyarrow as pa

    write_frame(path, frame)
    if frame.size <= FULL_CHECK_CELLS or any(str(t) == "object" for t in frame.dtypes):
        return same_frame(frame, read_frame(path))
    schema = pa.ipc.open_file(sealed_payload(path, verify=False)).schema
    empty = _sparse_again(schema.empty_table().to_pandas(), schema)
    return list(empty.columns) == list(frame.columns) and [str(t) for t in empty.dtypes] == [
        str(t) for t in frame.dtypes
    ]
