#!/usr/bin/env python
"""Capture the ground-truth training patterns and measure stage agreement on each.

    python scripts/patterns.py --out DIR                       # all patterns, with and without with_stack
    python scripts/patterns.py --out DIR --pattern ddp --pattern compiled
    python scripts/patterns.py --out DIR --no-capture          # measure the traces already in DIR

For each pattern P it writes DIR/P_stack.json.gz and DIR/P_nostack.json.gz (marked, see
``profparse.capture.patterns``; DDP also P_*.rank1.json.gz) and DIR/stripped/<same name> (the marks removed),
then prints, per trace, the share of CPU op self time whose inferred stage (stripped trace) equals the marked one,
and the top disagreements with the rule that decided them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import profparse  # noqa: F401
except ImportError:  # a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import profparse  # noqa: E402
from profparse.analysis.agreement import agreement  # noqa: E402
from profparse.capture.patterns import PATTERNS, capture_pattern, rank_path, strip_marks, trace_name  # noqa: E402


def measure(marked: Path, stripped_dir: Path, top: int = 3) -> str:
    """Strip ``marked`` into ``stripped_dir`` and return its agreement line(s)."""
    stripped = stripped_dir / marked.name
    strip_marks(marked, stripped)
    result = agreement(profparse.parse(marked, include_marks=True), profparse.parse(stripped))
    summary = result.summary
    cpu = summary.loc["cpu_op"]
    gpu = summary.loc["gpu"]
    gpu_text = f"  gpu {100 * gpu['share']:.2f}%" if gpu["total_ns"] else ""
    lines = [f"{marked.name:<40} cpu_op {100 * cpu['share']:7.3f}% of {cpu['total_ns'] / 1e6:9.1f} ms{gpu_text}"]
    for row in result.disagreements(top=top).itertuples():
        lines.append(
            f"    {100 * row.share:6.3f}%  {row.name[:48]:<48} {row.truth:>9} -> {row.stage:<9} {row.stage_rule}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="patterns.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the traces")
    p.add_argument("--pattern", action="append", choices=PATTERNS, help="only these patterns (repeatable)")
    p.add_argument("--no-capture", dest="capture", action="store_false", help="measure the traces already in --out")
    p.add_argument("--top", type=int, default=3, help="disagreements shown per trace (default 3)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stripped_dir = args.out / "stripped"
    stripped_dir.mkdir(exist_ok=True)
    failed = 0
    for name in args.pattern or PATTERNS:
        for with_stack in (True, False):
            path = args.out / trace_name(name, with_stack)
            if args.capture:
                t0 = time.perf_counter()
                try:
                    capture_pattern(name, path, with_stack)
                except Exception as exc:  # noqa: BLE001 - say which pattern failed and go on with the others
                    failed += 1
                    print(f"{path.name:<40} capture failed: {type(exc).__name__}: {exc}", flush=True)
                    continue
                print(f"[patterns] captured {path.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            paths = [path, rank_path(path, 1)] if name == "ddp" else [path]
            for trace in paths:
                if not trace.is_file():
                    print(f"{trace.name:<40} missing", flush=True)
                    continue
                print(measure(trace, stripped_dir, args.top), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
