"""Run every verb over many odd traces and list each internal error (exit 70): how the faults in CHANGELOG's "Random
GPU traces and partial captures" were found. Three sources, each seeded (the same traces on every machine):

    python scripts/fuzz_verbs.py random --first 0 --count 200    # tests/random_gpu_traces.py, then diffed
    python scripts/fuzz_verbs.py cut --first 0 --count 200       # the same traces cut at a random byte, some gzipped
    python scripts/fuzz_verbs.py parts                           # sample (and ../shared) GPU traces with parts taken
                                                                 # out: a category, a thread, a time window, ...
    python scripts/fuzz_verbs.py options --first 0 --count 200   # random traces and the sample traces, every verb
                                                                 # with random options (formats, metrics, --top, ...)

Every verb runs in this process (``profparse.cli.main.main``) with a fresh cache folder; ``random`` also checks that
``summarize --format json`` from the cache equals the answer from the JSON. Prints one line per failure and
``N cases, M failures``; exit 1 if any. Slow by design (seconds per case): not part of the test command.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from random_gpu_traces import random_gpu_trace  # noqa: E402

from profparse.cli.main import main  # noqa: E402

GPU_TRACES = [*sorted((REPO / "sample_traces").rglob("*.json.gz"))]
SHARED = REPO.parent / "shared" / "traces"
OK = {0, 3, 4, 5, 7}  # answered, or refused with a clear message (docs/exit-codes.md)
USAGE = 2  # a refused option value (out of range): allowed where ``random_options`` chose one
PEAKS = ["312", "0.001", "1e6", "0", "-5", "nan", "inf", "1e400", "x"]
TOPS = ["0", "1", "3", "50", "1000000", "-1", "x"]


def run(argv: list[str]) -> tuple[object, str]:
    """A verb's exit code (or the exception it let out) and its standard output."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(argv)
    except Exception as exc:  # noqa: BLE001 - a verb that raises is what this looks for
        code = f"raised {type(exc).__name__}: {exc}"
    return code, out.getvalue()


def verbs(path: Path, folder: Path, other: Path | None) -> Iterator[list[str]]:
    yield ["summarize", str(path)]
    yield ["summarize", str(path), "--format", "csv"]
    yield ["summarize", str(path), "--no-marks", "--no-cache"]
    yield ["advise", str(path)]
    yield ["report", str(path), "--force", "-o", str(folder / "report.html")]
    yield ["annotate", str(path), "--force", "-o", str(folder / "annotated.json")]
    yield ["parse", str(path), "--force", "-o", str(folder / "tables")]
    yield ["plot", str(path), "--force", "--format", "png", "--dpi", "40", "-o", str(folder / "plots")]
    if other is not None:
        yield ["diff", str(other), str(path), "--per-step"]


def random_options(path: Path, folder: Path, other: Path | None, rng: random.Random) -> Iterator[list[str]]:
    """Every verb on ``path`` with options drawn by ``rng``: formats, metrics, ``--top``, ``--peak-tflops`` (odd
    values too), plot kinds and resolutions, the input flags."""

    def pick(*choices: str) -> str:
        return rng.choice(choices)

    def flags() -> list[str]:
        return [f for f in ("--no-marks", "--strict", "--no-cache", "-q") if rng.random() < 0.3]

    def peak() -> list[str]:
        return ["--peak-tflops", rng.choice(PEAKS)] if rng.random() < 0.5 else []

    metric = ["host_wall", "host_ops", "gpu_time", "gpu_busy", "gpu_idle"]
    kinds = ["stages", "timeline", "critical_path", "top_kernels", "top_ops", "top_runtime", "communication"]
    kinds += ["roofline", "memory", "layers", "load"]
    yield [
        "summarize", str(path), *flags(), *peak(), "--format", pick("text", "json", "csv", "markdown"),
        *(["--top", rng.choice(TOPS)] if rng.random() < 0.5 else []), "--metric", rng.choice(metric),
    ]  # fmt: skip
    yield ["advise", str(path), *flags(), *peak(), "--format", pick("text", "json")]
    yield ["report", str(path), *flags(), *peak(), "--metric", rng.choice(metric), "--force", "-o",
           str(folder / "report.html")]  # fmt: skip
    yield ["annotate", str(path), *flags(), "--force", "-o", str(folder / pick("a.json", "a.json.gz"))]
    yield ["parse", str(path), *flags(), *peak(), "--force", "-o", str(folder / "tables")]
    chosen = [arg for kind in rng.sample(kinds, rng.randint(1, 3)) for arg in ("--kind", kind)]
    yield ["plot", str(path), *flags(), *peak(), *chosen, "--format", pick("png", "svg"), "--dpi",
           pick("20", "40", "19", "1001"), "--force", "-o", str(folder / "plots")]  # fmt: skip
    if other is not None:
        yield [
            "diff", str(other), str(path), *flags(), "--format", pick("text", "json", "markdown"),
            *(["--top", rng.choice(TOPS)] if rng.random() < 0.5 else []),
            *(["--per-step"] if rng.random() < 0.5 else []),
        ]  # fmt: skip


def check_options(name: str, path: Path, folder: Path, other: Path | None, rng: random.Random) -> list[str]:
    """Every verb on ``path`` with random options: one line per verb that failed. An out-of-range value may be
    refused (exit 2); a JSON answer must parse."""
    failures = []
    for argv in random_options(path, folder, other, rng):
        code, out = run(argv)
        odd = any(value in argv for value in ("-5", "nan", "inf", "1e400", "x", "-1", "19", "1001", "0"))
        if code not in OK and not (code == USAGE and odd):
            failures.append(f"{name}: {' '.join([argv[0], *argv[2:]])}: {code}")
        elif code == 0 and "--format" in argv and argv[argv.index("--format") + 1] == "json":
            try:
                json.loads(out)
            except ValueError as exc:
                failures.append(f"{name}: {' '.join([argv[0], *argv[2:]])}: not JSON ({exc})")
    return failures


def check(name: str, path: Path, folder: Path, other: Path | None = None, cache_check: bool = False) -> list[str]:
    """Every verb on ``path``: one line per verb that failed."""
    failures = []
    if cache_check:
        fresh = run(["summarize", str(path), "--no-cache", "--format", "json"])
        stored = run(["summarize", str(path), "--format", "json"])
        again = run(["summarize", str(path), "--format", "json"])
        if not fresh == stored == again:
            failures.append(f"{name}: summarize --format json from the cache differs from the JSON's")
    for argv in verbs(path, folder, other):
        code, _ = run(argv)
        if code not in OK:
            failures.append(f"{name}: {' '.join([argv[0], *argv[2:]])}: {code}")
    return failures


def random_cases(first: int, count: int, folder: Path, cut: bool) -> Iterator[tuple[str, Path, Path | None]]:
    previous = None
    for seed in range(first, first + count):
        rng = random.Random(seed)
        text = json.dumps(random_gpu_trace(seed)).encode()
        if cut:
            text = text[: rng.randrange(len(text) // 3, len(text))]
        zipped = cut and rng.random() < 0.3
        path = folder / f"seed{seed}.json{'.gz' if zipped else ''}"
        path.write_bytes(gzip.compress(text) if zipped else text)
        yield f"seed {seed}", path, previous
        if previous is not None:
            previous.unlink()
        previous = path


def parts(doc: dict, rng: random.Random) -> Iterator[tuple[str, list[dict]]]:
    """The trace's events with a part taken out (or only that part kept)."""
    events = doc["traceEvents"]
    for cat in sorted({str(e.get("cat")) for e in events}):
        yield f"without cat {cat}", [e for e in events if str(e.get("cat")) != cat]
        yield f"only cat {cat}", [e for e in events if str(e.get("cat")) == cat or e.get("ph") == "M"]
    yield "without metadata", [e for e in events if e.get("ph") != "M"]
    yield "without steps", [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep")]
    yield "without args", [{k: v for k, v in e.items() if k != "args" or e.get("ph") == "M"} for e in events]
    threads = sorted({(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "X"}, key=str)
    for thread in rng.sample(threads, min(3, len(threads))):
        yield f"without thread {thread}", [e for e in events if (e.get("pid"), e.get("tid")) != thread]
        yield (
            f"only thread {thread}",
            [e for e in events if (e.get("pid"), e.get("tid")) == thread or e.get("ph") == "M"],
        )
    times = sorted(e["ts"] for e in events if isinstance(e.get("ts"), int | float))
    for _ in range(3):
        lo, hi = sorted(rng.sample(times, 2))
        yield f"window {lo}-{hi}", [e for e in events if e.get("ph") == "M" or lo <= (e.get("ts") or 0) <= hi]


def parts_cases(folder: Path, seed: int) -> Iterator[tuple[str, Path, Path | None]]:
    rng = random.Random(seed)
    sources = GPU_TRACES + (sorted(SHARED.glob("*.json.gz")) if SHARED.is_dir() else [])
    for source in sources:
        doc = json.loads(gzip.decompress(source.read_bytes()))
        for what, events in parts(doc, rng):
            path = folder / "part.json"
            path.write_text(json.dumps({**doc, "traceEvents": events}))
            yield f"{source.name} {what}", path, source


def options_cases(first: int, count: int, folder: Path) -> Iterator[tuple[str, Path, Path | None]]:
    """The random traces of ``random``, then each sample trace (against the one before)."""
    yield from random_cases(first, count, folder, cut=False)
    previous = None
    for source in GPU_TRACES:
        yield source.name, source, previous
        previous = source


def main_() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", choices=["random", "cut", "parts", "options"])
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=100, help="how many seeds (random, cut)")
    args = ap.parse_args()
    os.environ.pop("PROFPARSE_DEBUG", None)  # failures as exit codes, not tracebacks
    failures, cases = [], 0
    with tempfile.TemporaryDirectory(prefix="profparse-fuzz-") as tmp:
        folder = Path(tmp)
        os.environ["PROFPARSE_CACHE_DIR"] = str(folder / "cache")
        if args.source == "parts":
            found = parts_cases(folder, args.first)
        elif args.source == "options":
            found = options_cases(args.first, args.count, folder)
        else:
            found = random_cases(args.first, args.count, folder, cut=args.source == "cut")
        for name, path, other in found:
            cases += 1
            if args.source == "options":
                lines = check_options(name, path, folder, other, random.Random(f"{name} {args.first}"))
            else:
                lines = check(name, path, folder, other, cache_check=args.source == "random")
            for line in lines:
                print(line, flush=True)
                failures.append(line)
    print(f"{cases} cases, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_())
