"""Adversarial memory cases: the estimate (``PROFPARSE_MEMORY_DEBUG=1``) against the measured peak RSS.

Writes the cases of issue 33 item 5 at a chosen scale, runs ``profparse summarize --no-cache`` on each in a child
(one at a time, under ``nice``) and prints the estimate made after reading, the peak resident size of the child
(``ru_maxrss``: the largest process, the decoding workers included) and their ratio::

    python scripts/memory_cases.py --events 300000            # every case at 300 k events (scaled)
    python scripts/memory_cases.py --events 1000000 --cases unique_names unique_tids
    python scripts/memory_cases.py --shared                   # the real traces in /work/shared/traces too

Scale: ``--events`` is the count of the 1 M cases; tiny events are 3x that and the ``.json.gz`` bomb 14x (run
under ``--bomb-limit``: it must stop with exit 8 early, not be read).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SHARED = Path(os.environ.get("PROFPARSE_SHARED", "/work/shared")) / "traces"
BATCH = 20_000


def _unique_names(n: int) -> Iterator[str]:
    for i in range(n):
        yield (
            f'{{"ph":"X","cat":"cpu_op","name":"aten::op_{i:07d}","pid":1,"tid":1,"ts":{1000 + 2 * i},"dur":1,'
            f'"args":{{"External id":{i}}}}}'
        )


def _unique_tids(n: int) -> Iterator[str]:
    for i in range(n):
        yield f'{{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":{i + 2},"ts":{1000 + i},"dur":1}}'


def _tiny(n: int) -> Iterator[str]:
    for i in range(n):
        yield f'{{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":{1000 + i},"dur":1}}'


def _python(n: int) -> Iterator[str]:
    """Python functions nested 7 deep around an op, 5,000 distinct frames (a trace recorded with ``with_stack``)."""
    for i in range(n):
        depth, ts = i % 8, 1000 + 20 * (i // 8) + i % 8
        if depth == 7:
            op = f'{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{ts},"dur":1'
            yield op + f',"args":{{"External id":{i}}}}}'
            continue
        parent = i - 1 if depth else 0
        yield (
            f'{{"ph":"X","cat":"python_function","name":"model.py({i % 5000}): forward_{i % 5000}","pid":1,"tid":1,'
            f'"ts":{ts},"dur":{16 - 2 * depth},"args":{{"Python parent id":{parent},'
            f'"Python id":{i},"Python thread":0}}}}'
        )


def _gpu(n: int) -> Iterator[str]:
    """A launch and its kernel per pair of events, with flows: a GPU trace without the ops around."""
    for j in range(n // 2):
        ts = 1000 + 10 * j
        yield (
            f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{ts},"dur":4,'
            f'"args":{{"External id":{j},"correlation":{j}}}}}'
        )
        yield (
            f'{{"ph":"X","cat":"kernel","name":"void gemm_kernel<{j % 300}>(float*)","pid":0,"tid":7,"ts":{ts + 5},'
            f'"dur":3,"args":{{"queued":0,"device":0,"context":1,"stream":7,"correlation":{j},"registers per thread":'
            f'32,"shared memory":0,"blocks per SM":1.5,"warps per SM":6.0,"grid":[128,1,1],"block":[128,1,1],'
            f'"est. achieved occupancy %":12}}}}'
        )


CASES: dict[str, tuple[Callable[[int], Iterator[str]], float]] = {
    # name: (events generator, events per --events)
    "unique_names": (_unique_names, 1),
    "unique_tids": (_unique_tids, 1),
    "tiny": (_tiny, 3),
    "python_functions": (_python, 1),
    "gpu_events": (_gpu, 1),
    "gz_bomb": (_tiny, 14),
}


def write_case(name: str, events: int, folder: Path) -> Path:
    make, factor = CASES[name]
    count = int(events * factor)
    path = folder / (f"{name}_{count}.json" + (".gz" if name == "gz_bomb" else ""))
    if path.exists():
        return path
    opener = gzip.open(path, "wt", compresslevel=9) if name == "gz_bomb" else open(path, "w")  # noqa: SIM115
    with opener as f:
        f.write('{"schemaVersion":1,"traceEvents":[\n')
        lines = make(count)
        first = True
        while True:
            batch = [line for _, line in zip(range(BATCH), lines, strict=False)]
            if not batch:
                break
            f.write(("" if first else ",\n") + ",\n".join(batch))
            first = False
        f.write("\n]}\n")
    return path


def measure(path: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run summarize on ``path`` in a child: exit code, seconds, peak RSS (MiB), the estimate's debug lines."""
    child_env = dict(os.environ, PROFPARSE_MEMORY_DEBUG="1", **(env or {}))
    code = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    argv = ["nice", "-n", "10", sys.executable, "-c", code, sys.executable, "-m", "profparse"]
    argv += ["summarize", str(path), "--no-cache", "-q"]
    start = time.perf_counter()
    run = subprocess.run(argv, env=child_env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    rc, rss_kib = (int(x) for x in run.stdout.split()[-2:])
    estimates = re.findall(r"memory estimate \[(\w+)\]: ([\d.]+) MiB(.*)", run.stderr)
    error = next((x for x in run.stderr.splitlines() if x.startswith("profparse:") and "estimate [" not in x), "")
    return {
        "rc": rc,
        "seconds": seconds,
        "peak": rss_kib / 1024,
        "estimates": estimates,
        "error": error,
        "stderr": run.stderr,
    }


def json_bytes(path: Path) -> int:
    if path.suffix != ".gz":
        return path.stat().st_size
    with gzip.open(path, "rb") as f:
        return sum(len(block) for block in iter(lambda: f.read(1 << 24), b""))


def report(label: str, path: Path, result: dict, verbose: bool, events: int = 0) -> None:
    estimates = result["estimates"]
    if not estimates:  # a profparse without the debug lines: its documented estimate
        old = 128 + max(1.5 * json_bytes(path), 250 * events) / 2**20
        estimates = [("documented", f"{old:.0f}", " (1.5x JSON or 250 B per event, + 128 MiB)")]
    final = float(estimates[-1][1])
    size = path.stat().st_size / 1e6
    ratio = result["peak"] / final
    print(
        f"{label:<34} {size:>8.1f} MB  rc {result['rc']:>3}  {result['seconds']:>6.1f} s  "
        f"est {final:>7.0f} MiB  peak {result['peak']:>7.0f} MiB  peak/est {ratio:.2f}",
        flush=True,
    )
    if result["error"]:
        print(f"    {result['error'][:200]}", flush=True)
    if verbose:
        for stage, mib, parts in estimates:
            print(f"    [{stage}] {mib} MiB{parts}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000, help="events of the 1 M cases (default 300000)")
    parser.add_argument("--cases", nargs="*", default=None, help=f"of {', '.join(CASES)} (default: all)")
    parser.add_argument("--shared", action="store_true", help="also the real traces under /work/shared/traces")
    parser.add_argument("--only-shared", action="store_true", help="only the real traces")
    parser.add_argument("--bomb-limit", default="1G", help="PROFPARSE_MEMORY_LIMIT for the bomb (default 1G)")
    parser.add_argument("--folder", type=Path, default=None, help="where to write the cases (kept: reused)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the estimate's parts")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="memory_cases_"))
    folder.mkdir(parents=True, exist_ok=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not args.only_shared:
        for name in args.cases or list(CASES):
            path = write_case(name, args.events, folder)
            env = {"PROFPARSE_MEMORY_LIMIT": args.bomb_limit} if name == "gz_bomb" else None
            count = int(args.events * CASES[name][1])
            report(f"{name} ({count:,})", path, measure(path, env), args.verbose, count)
    if args.shared or args.only_shared:
        for path in sorted(SHARED.rglob("*.json.gz")):
            report(str(path.relative_to(SHARED)), path, measure(path), args.verbose)


if __name__ == "__main__":
    main()
