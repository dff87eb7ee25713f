"""Run every verb and the API over the sample (and shared) traces in the environment this Python has, and check
the output digests: the check CI runs on the declared dependency floors (``.ci/run``, ``ci/floors.txt``).

    python scripts/compat_check.py             # each verb on the sample traces, then the output digests of the
                                               # sample and shared traces; exit 1 if any verb fails or warns
    python scripts/compat_check.py --shared --no-digests

A verb passes when it exits 0 and writes nothing to stderr that looks like a Python warning or traceback (a
FutureWarning or RuntimeWarning that pandas or numpy prints on one version is a failure here too).

Then ``report``, ``plot`` and ``diff`` on a copy of the sample A100 trace with three kernel and three op names of
200,000 characters: each may take at most :data:`LONG_NAMES_EXTRA_MB` more memory than on the trace itself (before
pandas 3, a categorical's ``astype(str)`` made every name as wide as the longest: ``report`` took 5.7 GB).
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
#: the trace each one is also compared with: a GPU trace (against a CPU capture: one side has no kernels)
OTHER = REPO / "sample_traces" / "gpu" / "mi250_minitoy.json.gz"
PACKAGES = ("numpy", "pandas", "pyarrow", "matplotlib", "msgspec", "tqdm", "xxhash")
#: what a verb may take on the long-names trace over its peak on the plain one (MB)
LONG_NAMES_EXTRA_MB = 100
#: the length of each long name
LONG_NAME_CHARS = 200_000
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


def invocation(args: tuple, cache: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one ``profparse`` run with its cache in ``cache``."""
    return [sys.executable, "-m", "profparse", *map(str, args)], {**os.environ, "PROFPARSE_CACHE_DIR": cache}


def profparse(*args: str, cache: str) -> subprocess.CompletedProcess[str]:
    command, env = invocation(args, cache)
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
        "diff other": ("diff", trace, OTHER),
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


def long_names_copy(trace: Path, out: Path) -> Path:
    """``trace`` with its first three kernels' and three ops' names made :data:`LONG_NAME_CHARS` long."""
    import gzip
    import json

    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    left = {"kernel": 3, "cpu_op": 3}
    for event in doc["traceEvents"]:
        cat = event.get("cat")
        if left.get(cat, 0) > 0:
            left[cat] -= 1
            event["name"] = f"{cat}<" + "x" * LONG_NAME_CHARS + ">"
    out.write_text(json.dumps(doc))
    return out


def peak_mb(args: tuple, cache: str) -> tuple[int, float]:
    """Exit code and peak resident memory (MB) of one ``profparse`` run."""
    command, env = invocation(args, cache)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return proc.returncode, usage.ru_maxrss / 1024


def check_long_names(cache: str) -> int:
    """Failures of ``report``, ``plot`` and ``diff`` on long names: an exit other than 0, or a peak more than
    :data:`LONG_NAMES_EXTRA_MB` over the same verb's on the plain trace."""
    sample = REPO / "sample_traces" / "gpu" / "a100_ddp_rank0_nccl.json.gz"
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pp-compat-long-") as tmp:
        long = long_names_copy(sample, Path(tmp) / "long_names.json")
        for verb in ("report", "plot", "diff"):
            peaks = []
            for trace in (sample, long):
                out = (sample,) if verb == "diff" else ("-o", Path(tmp) / f"{verb}_{trace.stem}", "--force")
                code, mb = peak_mb((verb, trace, *out, "--no-cache", "-q"), cache)
                peaks.append(mb)
                failed += code != 0
            ok = peaks[1] <= peaks[0] + LONG_NAMES_EXTRA_MB
            failed += not ok
            verdict = "" if ok else " TOO MUCH"
            print(f"long names: {verb:7} peak {peaks[1]:.0f} MB (plain trace: {peaks[0]:.0f} MB){verdict}")
    return failed


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
        failed += check_long_names(cache)
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
