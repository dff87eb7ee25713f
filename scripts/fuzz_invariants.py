"""Check that profparse's answers keep what must not change when a trace changes in ways that change no time: how
the faults in CHANGELOG's "Results that do not move with the trace's clock, its event order or the cache" were found.

    python scripts/fuzz_invariants.py clock --first 0 --count 100     # every ts moved to epoch microseconds
    python scripts/fuzz_invariants.py shuffle --first 0 --count 100   # the events in another order in the file
    python scripts/fuzz_invariants.py threads --first 0 --count 100   # every thread id renumbered
    python scripts/fuzz_invariants.py format --first 0 --count 100    # keys reordered, 5.0 as 5, indented, gzipped
    python scripts/fuzz_invariants.py prefix --first 0 --count 100    # host work added before the first step
    python scripts/fuzz_invariants.py chunks --first 0 --count 100    # read in small chunks, by 1 and 2 processes
    python scripts/fuzz_invariants.py tables --first 0 --count 40     # tables in shuffled orders, from the cache
    python scripts/fuzz_invariants.py diff --first 0 --count 40       # diff(A, B) = -diff(B, A), diff(A, A) = 0

Sources: the seeded random traces of ``tests/random_gpu_traces.py`` and the repo's sample traces. ``clock``,
``shuffle``, ``threads`` and ``format`` compare ``summarize`` and ``advise --format json`` of the two traces (``clock``:
times that moved by exactly the shift are equal; ``shuffle``: ``trace_index``, the place in the file, is left out).
Known and left: where two host events of one kind have the same start and end on one thread, which one nests in
the other follows the file (of two kinds, the kind decides: ``profparse.trace.link.span_rank``). Prints one line per
case that differs and ``N cases, M failures``; exit 1 if any. Slow by design.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from random_gpu_traces import random_gpu_trace, shifted  # noqa: E402

import profparse  # noqa: E402
from profparse.cli.main import main  # noqa: E402
from profparse.tables.registry import public_tables  # noqa: E402
from profparse.trace.events import read_trace  # noqa: E402

SAMPLES = sorted((REPO / "sample_traces").rglob("*.json.gz"))
SHIFT_US = 1_700_000_000_000_000  # to epoch microseconds (2023), where float64 rounds to a quarter of a microsecond


def run(argv: list[str]) -> tuple[Any, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, out.getvalue()


def differences(x: Any, y: Any, same: Any, path: str = "") -> list[tuple]:
    """Where two JSON answers differ, unless ``same(key, x, y)`` says the values are equivalent."""
    if isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            return [(path, "keys", sorted(set(x) ^ set(y)))]
        return [d for k in x for d in differences(x[k], y[k], same, f"{path}.{k}")]
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return [(path, "length", len(x), len(y))]
        return [d for i, (p, q) in enumerate(zip(x, y, strict=True)) for d in differences(p, q, same, f"{path}[{i}]")]
    return [] if x == y or same(path.rsplit(".", 1)[-1], x, y) else [(path, x, y)]


def variant(mode: str, doc: dict, rng: random.Random) -> str:
    events = list(doc["traceEvents"])
    if mode == "clock":
        return shifted(doc, SHIFT_US)
    if mode == "shuffle":
        rng.shuffle(events)
    elif mode == "format":  # keys in another order, whole floats as ints, indented (and gzipped: answers_agree)
        events = [_keys_shuffled(e, rng) for e in events]
        return json.dumps({**doc, "traceEvents": events}, indent=rng.choice([1, 2, 4]))
    else:  # threads
        events = [{**e, "tid": e["tid"] + 7919} if type(e.get("tid")) is int else e for e in events]
    return json.dumps({**doc, "traceEvents": events})


def _keys_shuffled(value: Any, rng: random.Random) -> Any:
    """``value`` with its keys (and those of the dicts in it) in another order, and some whole floats as ints."""
    if isinstance(value, float) and value.is_integer() and rng.random() < 0.5:
        return int(value)
    if not isinstance(value, dict):
        return value
    keys = list(value)
    rng.shuffle(keys)
    return {k: _keys_shuffled(value[k], rng) for k in keys}


def same_for(mode: str, a: Path, b: Path) -> Any:
    def same(key: str, x: Any, y: Any) -> bool:
        if isinstance(x, str) and isinstance(y, str):
            return x.replace(str(a), "<trace>") == y.replace(str(b), "<trace>")
        if mode == "clock" and type(x) is int and type(y) is int:
            return y - x == SHIFT_US * 1000  # an absolute time
        return mode == "shuffle" and key == "trace_index"

    return same


def answers_agree(mode: str, name: str, doc: dict, folder: Path) -> list[str]:
    a, b = folder / "a.json", folder / ("b.json.gz" if mode == "format" else "b.json")
    a.write_text(json.dumps(doc))
    text = variant(mode, doc, random.Random(name)).encode()
    b.write_bytes(gzip.compress(text, mtime=0) if b.suffix == ".gz" else text)
    failures = []
    for verb in ("summarize", "advise"):
        (code_a, out_a), (code_b, out_b) = (run([verb, str(p), "--format", "json", "--no-cache"]) for p in (a, b))
        if (code_a, code_b) != (0, 0):
            failures.append(f"{name}: {verb}: exit {code_a} and {code_b}")
            continue
        found = differences(json.loads(out_a), json.loads(out_b), same_for(mode, a, b))
        if found:
            failures.append(f"{name}: {verb}: {found[:3]}"[:600])
    return failures


def tables_agree(name: str, doc: dict, folder: Path) -> list[str]:
    """Every public table the same in the registry's order, in a shuffled one, and read back from the cache."""
    path = folder / "t.json"
    path.write_text(json.dumps(doc))
    names = [spec.name for spec in public_tables()]
    expected = {n: getattr(profparse.load(path, cache=False), n) for n in names}
    random.Random(name).shuffle(names)
    os.environ["PROFPARSE_CACHE_DIR"] = str(folder / "tables-cache")
    failures = []
    for source in ("shuffled", "cache"):
        parsed = profparse.load(path, cache=True)
        for n in names:
            try:
                pd.testing.assert_frame_equal(getattr(parsed, n), expected[n], obj=n)
            except AssertionError as exc:
                failures.append(f"{name}: {n} ({source}): {' '.join(str(exc).split())[:300]}")
    return failures


#: the summary's parts that speak of the steps alone: events long before the first step leave them as they are
STEP_PARTS = ("per_step", "step_totals", "steady_totals", "critical_path", "without_profiler", "findings")


def with_prefix(doc: dict) -> dict | None:
    """``doc`` with a loading-like block of host events (a Python frame holding two ops) ending 1 ms before the
    first ``ProfilerStep`` starts, on that step's thread; None without such a step."""
    events = doc["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and "ts" in e]
    if not steps:
        return None
    first = min(steps, key=lambda e: e["ts"])
    start = first["ts"] - 5000
    where = {"pid": first.get("pid", 0), "tid": first.get("tid", 0)}
    block = [
        {"ph": "X", "cat": "python_function", "name": "modeling_utils.py(4000): from_pretrained", "ts": start,
         "dur": 4000, **where, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": start + 100, "dur": 300, **where, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": start + 1000, "dur": 2000, **where, "args": {}},
    ]  # fmt: skip
    return {**doc, "traceEvents": block + list(events)}


def prefix_agrees(name: str, doc: dict, folder: Path) -> list[str]:
    """The summary's step parts (:data:`STEP_PARTS`) the same with host work added long before the first step."""
    longer = with_prefix(doc)
    if longer is None:
        return []
    answers = []
    for label, listed in (("a", doc), ("b", longer)):
        path = folder / f"{label}.json"
        path.write_text(json.dumps(listed))
        code, out = run(["summarize", str(path), "--format", "json", "--no-cache"])
        if code != 0:
            return [f"{name}: exit {code}"]
        answers.append(json.loads(out))
    a, b = ({k: answer.get(k) for k in STEP_PARTS} for answer in answers)
    found = differences(a, b, lambda key, x, y: key == "trace_index")
    return [f"{name}: {found[:3]}"[:600]] if found else []


def chunks_agree(name: str, doc: dict, folder: Path) -> list[str]:
    """The event table read in small chunks of random sizes, by one process and by two, equals the default read,
    from the plain file and from a gzipped one."""
    rng = random.Random(name)
    text = json.dumps(doc, indent=rng.choice([None, 1])).encode()
    failures = []
    for path, data in ((folder / "c.json", text), (folder / "c.json.gz", gzip.compress(text, mtime=0))):
        path.write_bytes(data)
        expected = read_trace(path)
        for workers in (1, 2):
            size = rng.randrange(64, 6000)
            raw = read_trace(path, workers=workers, chunk_bytes=size)
            try:
                pd.testing.assert_frame_equal(raw.events, expected.events, obj="events")
                for part in ("header", "report", "process_names", "thread_names", "pid_labels", "tid_labels"):
                    assert getattr(raw, part) == getattr(expected, part), part
            except AssertionError as exc:
                message = " ".join(str(exc).split())[:300]
                failures.append(f"{name}: {path.name} workers={workers} chunk_bytes={size}: {message}")
    return failures


def diff_agrees(name: str, doc: dict, other: dict, folder: Path) -> list[str]:
    a, b = folder / "a.json", folder / "b.json"
    a.write_text(json.dumps(doc))
    b.write_text(json.dumps(other))
    failures = []
    for extra in ([], ["--per-step"]):
        ab, ba, aa = (
            json.loads(run(["diff", str(x), str(y), "--format", "json", "--top", "1000", *extra])[1])
            for x, y in ((a, b), (b, a), (a, a))
        )
        for section in ("step", "stages", "critical_path"):
            key = lambda r: (r.get("key"), r.get("stage"), r.get("level"), r.get("bound"))  # noqa: E731
            back = {key(r): r.get("delta", r.get("delta_ns")) for r in ba[section]}
            for r in ab[section]:
                if back.get(key(r)) != -r.get("delta", r.get("delta_ns")):
                    failures.append(f"{name} {extra}: {section} {key(r)}: not the opposite of B against A")
            if any(r.get("delta", r.get("delta_ns")) for r in aa[section]):
                failures.append(f"{name} {extra}: {section}: a trace against itself changed")
    return failures


def traces(first: int, count: int, more: list[Path]) -> Iterator[tuple[str, dict]]:
    for seed in range(first, first + count):
        yield f"seed {seed}", random_gpu_trace(seed)
    for path in [*SAMPLES, *more]:
        data = path.read_bytes()
        yield path.name, json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def main_() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["clock", "shuffle", "threads", "format", "prefix", "chunks", "tables", "diff"])
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=40, help="how many seeds (then the sample traces)")
    ap.add_argument("traces", nargs="*", type=Path, help="more traces (.json or .json.gz) after the samples")
    args = ap.parse_intermixed_args()
    os.environ.pop("PROFPARSE_DEBUG", None)
    failures, cases, previous = [], 0, None
    with tempfile.TemporaryDirectory(prefix="profparse-invariants-") as tmp:
        folder = Path(tmp)
        os.environ["PROFPARSE_CACHE_DIR"] = str(folder / "cache")
        for name, doc in traces(args.first, args.count, args.traces):
            cases += 1
            if args.mode == "tables":
                lines = tables_agree(name, doc, folder)
            elif args.mode == "prefix":
                lines = prefix_agrees(name, doc, folder)
            elif args.mode == "chunks":
                lines = chunks_agree(name, doc, folder)
            elif args.mode == "diff":
                lines = diff_agrees(name, doc, previous, folder) if previous is not None else []
            else:
                lines = answers_agree(args.mode, name, doc, folder)
            previous = doc
            for line in lines:
                print(line, flush=True)
            failures += lines
    print(f"{cases} cases, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_())
