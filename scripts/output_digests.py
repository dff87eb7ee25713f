"""Digests of what profparse gives users, so a refactor can show that nothing changed for them.

For each trace: every Parquet table that ``profparse parse`` writes and the JSON of ``profparse summarize
--format json``, each reduced to one SHA-256. A table's digest is taken over its values, not its bytes or dtypes:
integer columns of any width (nullable or not) hash alike, and text hashes alike whether it is stored as a
dictionary or plain strings, so narrowing a column keeps its digest while changing any value does not. The
trace's own path is replaced by ``<trace>`` in the JSON, so digests made in one folder hold in another.

    python scripts/output_digests.py write TRACE... > digests.json   # before the change
    python scripts/output_digests.py check digests.json              # after it: exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq


def frame_digest(frame: pd.DataFrame) -> str:
    """SHA-256 over the column names and values of ``frame``, independent of integer width, text storage and the
    pandas version (numbers are hashed as their int64 / float64 bytes and a null mask, not by pandas' hash of an
    extension array, which changed between pandas 2 and 3)."""
    digest = hashlib.sha256()
    for name in frame.columns:
        kind, payload = _canonical(frame[name])
        digest.update(f"{name}\0{kind}\0{len(frame)}\0".encode())
        for part in payload:
            digest.update(part)
    return digest.hexdigest()


def _canonical(series: pd.Series) -> tuple[str, list[bytes]]:
    """A column's kind and the bytes that stand for its values."""
    dtype = series.dtype
    types = pd.api.types
    null = series.isna().to_numpy(dtype=bool)
    if isinstance(dtype, pd.CategoricalDtype) or types.is_object_dtype(dtype) or types.is_string_dtype(dtype):
        values = series.astype(object).where(~null, None)
        canon = pd.Series(["\0null" if v is None else str(v) for v in values], dtype=object)
        return "text", [pd.util.hash_pandas_object(canon, index=False).to_numpy().tobytes()]
    if types.is_bool_dtype(dtype) or types.is_integer_dtype(dtype):
        kind = "bool" if types.is_bool_dtype(dtype) else "int"
        return kind, [series.to_numpy(dtype=np.int64, na_value=0).tobytes(), null.tobytes()]
    if types.is_float_dtype(dtype):
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        return "float", [np.where(null, 0.0, values).tobytes(), null.tobytes()]
    canon = series.astype(str).astype(object)
    return str(dtype), [pd.util.hash_pandas_object(canon, index=False).to_numpy().tobytes()]


def _profparse(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from profparse.cli.main import main; sys.exit(main())", *args]
    with tempfile.TemporaryDirectory(prefix="pp-digest-cache-") as cache:
        env = {**os.environ, "PROFPARSE_CACHE_DIR": cache}
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def trace_digests(trace: Path) -> dict[str, str]:
    """``{"table:NAME": digest, ..., "summarize.json": digest}`` for one trace."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pp-digest-") as tmp:
        folder = Path(tmp) / "tables"
        done = _profparse("parse", str(trace), "-o", str(folder), "--no-cache", "-q")
        if done.returncode != 0:
            raise SystemExit(f"parse {trace} exited {done.returncode}: {done.stderr.strip()}")
        for path in sorted(folder.glob("*.parquet")):
            out[f"table:{path.stem}"] = frame_digest(pq.read_table(path).to_pandas())
    done = _profparse("summarize", str(trace), "--format", "json", "--no-cache", "-q")
    if done.returncode != 0:
        raise SystemExit(f"summarize {trace} exited {done.returncode}: {done.stderr.strip()}")
    text = done.stdout.replace(json.dumps(str(trace))[1:-1], "<trace>")
    out["summarize.json"] = hashlib.sha256(json.dumps(json.loads(text), sort_keys=True).encode()).hexdigest()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="print the digests of TRACE... as JSON")
    write.add_argument("traces", nargs="+", type=Path)
    check = sub.add_parser("check", help="recompute the digests in FILE and list the differences")
    check.add_argument("file", type=Path)
    args = ap.parse_args(argv)
    if args.command == "write":
        print(json.dumps({str(t): trace_digests(t) for t in args.traces}, indent=1, sort_keys=True))
        return 0
    stored = json.loads(args.file.read_text())
    changed = 0
    for trace, digests in stored.items():
        if not Path(trace).exists():  # ../shared is not laid beside every clone
            print(f"{trace}: not here, skipped")
            continue
        now = trace_digests(Path(trace))
        for key in sorted(set(digests) | set(now)):
            if digests.get(key) != now.get(key):
                changed += 1
                print(f"{trace}: {key} differs")
    print(f"{len(stored)} traces, {changed} differences")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
