"""What users get does not change under a refactor: every Parquet table and the ``summarize --format json`` of
each sample and shared trace hash to the digests stored in ``tests/data/output_digests.json``.

The digests were made with ``scripts/output_digests.py write`` before the code was reorganised; a change that
means to alter an output regenerates them (and says why in its commit). Traces that are not in this clone
(``../shared``) are skipped."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STORED = json.loads((REPO / "tests" / "data" / "output_digests.json").read_text())


def _digests_module():
    spec = importlib.util.spec_from_file_location("output_digests", REPO / "scripts" / "output_digests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("trace", sorted(STORED), ids=lambda t: Path(t).name)
def test_outputs_match_stored_digests(trace: str) -> None:
    path = REPO / trace
    if not path.exists():
        pytest.skip(f"{trace} is not in this clone")
    stored = STORED[trace]
    now = _digests_module().trace_digests(path)
    assert sorted(now) == sorted(stored), "the set of tables changed"
    assert {k: v for k, v in now.items() if stored[k] != v} == {}


def test_digest_sees_values_not_widths() -> None:
    """Narrowing a column keeps its digest; changing one value or a column name does not."""
    import pandas as pd

    frame_digest = _digests_module().frame_digest
    wide = pd.DataFrame({"a": pd.Series([1, 2, -1], dtype="int64"), "s": pd.Series(["x", "y", "x"])})
    narrow = pd.DataFrame(
        {"a": pd.Series([1, 2, -1], dtype="int32"), "s": pd.Series(["x", "y", "x"], dtype="category")}
    )
    assert frame_digest(wide) == frame_digest(narrow)
    assert frame_digest(wide) != frame_digest(wide.assign(a=[1, 2, 3]))
    assert frame_digest(wide) != frame_digest(wide.rename(columns={"s": "t"}))
