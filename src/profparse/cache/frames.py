"""Arrow IPC files of DataFrames (LZ4-compressed, sealed with their checksum): written a batch at a time, read
back memory-mapped without a second copy, and checked to read back identical before a table is kept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from profparse.cache.sealed import seal, sealed_payload

if TYPE_CHECKING:
    import pandas as pd

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
    first = pa.Table.from_pandas(slices[0], preserve_index=None)
    schema = first.schema
    batches = first.combine_chunks().to_batches() or [pa.RecordBatch.from_pandas(frame, preserve_index=None)]
    del first
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
        del batches
        for part in slices[1:]:
            writer.write_table(pa.Table.from_pandas(part, preserve_index=None, schema=schema))
    seal(path)


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
    if reader.num_record_batches <= 1 or fields <= 1:
        table = reader.read_all()
        del reader
        frame = table.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True)
        del table  # self_destruct leaves the table unusable: drop it
        return frame
    del reader
    columns = []
    for i in range(fields):
        options = pa.ipc.IpcReadOptions(included_fields=[i])
        part = pa.ipc.open_file(payload, options=options, memory_pool=pool).read_all()
        columns.append(part.to_pandas(memory_pool=pool, split_blocks=True, self_destruct=True))
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
    empty = pa.ipc.open_file(sealed_payload(path, verify=False)).schema.empty_table().to_pandas()
    return list(empty.columns) == list(frame.columns) and [str(t) for t in empty.dtypes] == [
        str(t) for t in frame.dtypes
    ]
