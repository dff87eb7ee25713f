"""Run every verb and the API over the sample (and shared) traces in the environment this Python has, and check
the output digests: the check CI runs on the declared dependency floors (``.ci/run``, ``ci/floors.txt``).

    python scripts/compat_check.py             # each verb on the sample traces, then the output digests of the
                                               # sample and shared traces; exit 1 if any verb fails or warns
    python scripts/compat_check.py --shared --no-digests

A verb passes when it exits 0 and writes nothing to stderr that looks like a Python warning or traceback (a
FutureWarning or RuntimeWarning that pandas or numpy prints on one version is a failure here too).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DIGESTS = REPO / "tests" / "data" / "output_digests.json"
PACKAGES = ("numpy", "pandas", "pyarrow", "matplotlib", "msgspec", "tqdm", "xxhash")
#: stderr lines that mean something went wrong though the exit code may be 0
TROUBLE = re.compile(r"Warning:|Traceback \(most recent call last\)|internal error")


def traces(shared: bool) -> list[Path]:
    """The repository's sample traces (CPU captures and two real GPU traces); ``shared``: also those of
    ``../shared`` where it is laid beside the clone (the digest check reads them either way)."""
    found = sorted((REPO / "sample_traces").glob("*.json.gz")) + sorted((REPO / "sample_traces" / "gpu").glob("*.gz"))
    if shared and SHARED.is_dir():
        names = {p.name for p in found}
        found += [p for p in sorted(SHARED.glob("*.json.gz")) if p.name not in names]
    return found


def profparse(*args: str, cache: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "profparse", *map(str, args)]
    env = {**os.environ, "PROFPARSE_CACHE_DIR": cache}
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=tempfile.gettempdir())


def verb_runs(trace: Path, out: Path) -> dict[str, tuple[str, ...]]:
    """Each verb's arguments on ``trace``, writing under ``out``."""
    return {
        "summarize": ("summarize", trace),
        "summarize json": ("summarize", trace, "--format", "json"),
        "summarize csv": ("summarize", trace, "--format", "csv"),
        "summarize md": ("summarize", trace, "--format", "markdown", "--no-marks"),
        "advise": ("advise", trace),
        "parse": ("parse", trace, "-o", out / "tables", "-q"),
        "plot": ("plot", trace, "-o", out / "plots", "-q"),
        "report": ("report", trace, "-o", out / "report.html", "-q"),
        "annotate": ("annotate", trace, "-o", out / "staged.json.gz", "-q"),
        "diff": ("diff", trace, trace),
    }


API_CHECK = """
import sys, warnings
warnings.simplefilter("error")
import profparse
from profparse.tables.registry import public_tables
parsed = profparse.load(sys.argv[1])
for spec in public_tables():
    getattr(parsed, spec.name)
"""


def check_trace(trace: Path, cache: str) -> dict[str, str]:
    """``{verb: "ok" | "exit N" | "warns"}`` for one trace."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="pp-compat-") as tmp:
        for verb, args in verb_runs(trace, Path(tmp)).items():
            done = profparse(*args, cache=cache)
            trouble = [line for line in done.stderr.splitlines() if TROUBLE.search(line)]
            results[verb] = f"exit {done.returncode}" if done.returncode else ("warns" if trouble else "ok")
            if results[verb] != "ok":
                print(f"  {trace.name} {verb}: {results[verb]}: {(trouble or done.stderr.splitlines() or [''])[0]}")
    api = subprocess.run([sys.executable, "-c", API_CHECK, str(trace)], capture_output=True, text=True, check=False)
    results["load()"] = "ok" if api.returncode == 0 else f"raises: {api.stderr.strip().splitlines()[-1:]}"
    return results


def environment() -> str:
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} -")
    return f"Python {platform.python_version()}: " + ", ".join(versions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-digests", action="store_true", help="skip the output digest check")
    parser.add_argument("--shared", action="store_true", help="run every verb on ../shared's traces too")
    args = parser.parse_args()
    print(environment())
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pp-compat-cache-") as cache:
        for trace in traces(args.shared):
            results = check_trace(trace, cache)
            bad = {verb: r for verb, r in results.items() if r != "ok"}
            failed += len(bad)
            print(f"{trace.name:40} {len(results) - len(bad)}/{len(results)} ok")
    if not args.no_digests:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "output_digests.py"), "check", str(DIGESTS)],
                              capture_output=True, text=True, check=False, cwd=REPO)  # fmt: skip
        print("output digests:", "equal" if done.returncode == 0 else "DIFFER")
        if done.returncode:
            print(done.stdout[-3000:], done.stderr[-3000:])
            failed += 1
    print("compat check:", "passed" if not failed else f"{failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
