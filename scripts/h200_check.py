"""Check the step without the profiler and the simulated savings against h200_pairs' unprofiled timings.

Usage: ``python scripts/h200_check.py [FOLDER]`` (default ``../shared/traces/h200_pairs``; ``--help``). Prints,
per capture, the unprofiled median step (ABBA blocks of ``measured.json``), the profiled step and the estimate
without the profiler; per pair, the measured saving (median bad - median good) and the finding of that kind on the
bad and the good capture; per clean or fixed capture, what all findings claim against the headroom (unprofiled
step - GPU busy). docs/without_profiler.md shows its output. Exit codes: 0 done, 2 no such folder or no
``measured.json`` in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import profparse
from profparse.analysis.profiler_cost import without_profiler

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "h200_pairs"


def measured_step(measured: dict[str, Any], pattern: str, side: str) -> float:
    """The unprofiled step: the median of the ABBA blocks, the mean where no blocks were kept."""
    m = measured[pattern]
    blocks = m.get(f"{side}_blocks")
    return float(statistics.median(blocks)) if blocks else float(m[f"{side}_step_ns"])


def capture(folder: Path, name: str) -> dict[str, Any]:
    """What profparse says about one capture: step without the profiler, GPU busy per step, findings."""
    p = profparse.load(folder / f"{name}.json.gz")
    steady = p.attribution.steps
    steady = steady[steady["steady"]]["step"]
    summary = p.stage_summary
    busy = summary[(summary["scope"] == "step") & summary["step"].isin(steady)].groupby("step")["gpu_busy_ns"].sum()
    findings = p.findings
    return {
        "without": without_profiler(p),
        "busy": float(busy.mean()),
        "findings": {str(k): float(v) for k, v in findings.groupby("kind")["saving_ns_per_step"].sum().items()},
    }


def main(folder: Path) -> None:
    measured = json.loads((folder / "measured.json").read_text())
    seen: dict[str, dict[str, Any]] = {}
    print("capture                       unprofiled  profiled  estimated  error")
    for path in sorted(folder.glob("*_*.json.gz")):
        name = path.name[: -len(".json.gz")]
        pattern, side = name.rsplit("_", 1)
        if pattern not in measured:
            continue
        seen[name] = got = capture(folder, name)
        truth, w = measured_step(measured, pattern, side), got["without"]
        print(f"{name:28s} {truth / 1e6:10.1f} {w['profiled_step_ns'] / 1e6:9.1f} {w['step_ns'] / 1e6:10.1f}"
              f" {w['step_ns'] / truth - 1:+6.1%}")  # fmt: skip
    print("\npair                   measured saving  bad: finding (share of good)  good: finding")
    for pattern in measured:
        if f"{pattern}_bad" not in seen or f"{pattern}_good" not in seen:
            continue
        saving = measured_step(measured, pattern, "bad") - measured_step(measured, pattern, "good")
        bad = seen[f"{pattern}_bad"]["findings"].get(pattern, 0.0)
        good = seen[f"{pattern}_good"]["findings"].get(pattern, 0.0)
        step = measured_step(measured, pattern, "good")
        print(f"{pattern:24s} {saving / 1e6:8.1f} ms {bad / 1e6:10.1f} ms ({saving / step:5.1%})  {good / 1e6:8.1f} ms")
    print("\nclean/fixed capture     unprofiled  headroom  all findings  within headroom + 5%")
    for name, got in seen.items():
        if not name.endswith("_good"):
            continue
        pattern = name.rsplit("_", 1)[0]
        truth = measured_step(measured, pattern, "good")
        headroom = max(truth - got["busy"], 0.0)
        claimed = sum(got["findings"].values())
        ok = claimed <= headroom + 0.05 * truth
        print(f"{name:24s} {truth / 1e6:9.1f} {headroom / 1e6:9.1f} {claimed / 1e6:12.1f}  {ok}")


def cli(argv: list[str] | None = None) -> int:
    """The command line: the folder (h200_pairs' layout) or the shared one; a one-line error without it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", nargs="?", type=Path, default=DEFAULT, help=f"captures and measured.json (default {DEFAULT})"
    )
    folder = parser.parse_args(argv).folder
    if not (folder / "measured.json").is_file():
        print(f"h200_check.py: no measured.json in {folder}", file=sys.stderr)
        return 2
    main(folder)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
