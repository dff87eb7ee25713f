"""Text columns as Python strings without pandas 2's fixed-width detour (``base.arrays.as_text``).

Before pandas 3, a categorical's ``astype(str)`` turns its categories into one numpy array as wide as the longest
name (4 bytes per character) before taking the rows: three kernel names of 200 KB made ``report`` take 5.7 GB.
``scripts/compat_check.py`` runs the verbs on such a trace at the dependency floors (pandas 2.0) in CI.
"""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profparse.base.arrays import as_text

SRC = Path(__file__).resolve().parents[1] / "src" / "profparse"


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(pd.Categorical(["a", None, "bb", "a"], categories=["a", "bb", "unused"])),
        pd.Series(pd.Categorical([], categories=["a"])),
        pd.Series(["x", None, "yy"], dtype=object),
        pd.Series([1, 2, 3]),
    ],
)
def test_as_text_gives_what_astype_str_gives(column):
    pd.testing.assert_series_equal(as_text(column), column.astype(str))


def test_as_text_takes_memory_by_rows_not_by_the_longest_name():
    """20,000 names and one of 1 MB over 100,000 rows: the rows' strings are shared Python objects (under 32 MB
    in all), not 20,001 copies 1 MB wide (80 GB)."""
    names = [f"aten::op_{i}" for i in range(20_000)] + ["k" * (1 << 20)]
    codes = np.arange(100_000) % len(names)
    column = pd.Series(pd.Categorical.from_codes(codes, categories=names))
    tracemalloc.start()
    try:
        text = as_text(column)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB"
    assert text.iloc[20_000] == names[-1] and text.iloc[7] == "aten::op_7"


def test_name_columns_go_through_as_text():
    """No ``astype(str)`` of a name column in the package: names are unbounded (templated kernel names run to
    kilobytes), and before pandas 3 its cost grows with the longest."""
    column = r"""\[["'](name|op_name|kernel_name|pg)["']\]"""
    pattern = re.compile(column + r"(\.take\([^)]*\)|\.fillna\([^)]*\))?\.astype\(str\)")
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in SRC.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("python", [(3, 10), (3, 13)])
def test_a_nul_in_a_name_is_written_to_csv_on_every_python(monkeypatch, python):
    """Python 3.10's csv module refused a NUL in a field ("need to escape, but no escapechar set": `summarize
    --format csv` exited 70 on a kernel name holding one); from 3.11 it writes it as it is. Every Python writes
    the same text: the NUL unquoted, a carriage return quoted."""
    import sys
    from types import SimpleNamespace

    from profparse.base import formats

    if python >= (3, 11) > sys.version_info:
        pytest.skip("this Python's csv module refuses a NUL itself")
    monkeypatch.setattr(formats, "sys", SimpleNamespace(version_info=python))
    table = formats.Table(
        title="Top kernels",
        columns=[formats.Column("name", "kernel"), formats.Column("ms", "ms")],
        rows=[{"name": "gemm\x00end\ue000", "ms": 1.5}, {"name": "a\rb", "ms": 2}],
        index=1,
    )
    text = formats.tables_csv([table])
    assert text.split("\n")[1:3] == [",,Top kernels,gemm\x00end\ue000,ms,1.5", ',,Top kernels,"a\rb",ms,2'], repr(text)
