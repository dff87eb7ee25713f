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

WITHIN = 0.15  # the step and the MFU without the profiler: relative error
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
    seen = _captures(folder, measured)
    _pairs(measured, seen)
    _headroom(measured, seen)
    _mfu(folder, seen)


def _captures(folder: Path, measured: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per capture: unprofiled, profiled, estimated, error; how many within 15%."""
    seen: dict[str, dict[str, Any]] = {}
    errors = []
    print("capture                       unprofiled  profiled  estimated  error")
    for path in sorted(folder.glob("*_*.json.gz")):
        name = path.name[: -len(".json.gz")]
        pattern, side = name.rsplit("_", 1)
        if pattern not in measured:
            continue
        seen[name] = got = capture(folder, name)
        truth, w = measured_step(measured, pattern, side), got["without"]
        errors.append(w["step_ns"] / truth - 1)
        print(f"{name:28s} {truth / 1e6:10.1f} {w['profiled_step_ns'] / 1e6:9.1f} {w['step_ns'] / 1e6:10.1f}"
              f" {errors[-1]:+6.1%}")  # fmt: skip
    if errors:
        within = sum(abs(e) <= WITHIN for e in errors)
        worst, median = max(abs(e) for e in errors), statistics.median(abs(e) for e in errors)
        print(f"within {WITHIN:.0%}: {within} of {len(errors)}; median error {median:.1%}, worst {worst:.1%}")
    return seen


def _pairs(measured: dict[str, Any], seen: dict[str, dict[str, Any]]) -> None:
    """Per pair: the measured saving against the finding of its kind on the bad and on the good capture; ok: within
    25% where the saving is >= 10% of the good step, else no more than the saving + 5% of the step, none on the
    fix."""
    print("\npair                   measured saving  bad: finding (share of good)  good: finding  ok")
    for pattern in measured:
        if f"{pattern}_bad" not in seen or f"{pattern}_good" not in seen:
            continue
        saving = measured_step(measured, pattern, "bad") - measured_step(measured, pattern, "good")
        bad = seen[f"{pattern}_bad"]["findings"].get(pattern, 0.0)
        good = seen[f"{pattern}_good"]["findings"].get(pattern, 0.0)
        step = measured_step(measured, pattern, "good")
        big = saving >= 0.1 * step
        ok = (abs(bad - saving) <= 0.25 * saving if big else bad <= saving + 0.05 * step) and good == 0
        print(f"{pattern:24s} {saving / 1e6:8.1f} ms {bad / 1e6:10.1f} ms ({saving / step:5.1%})  {good / 1e6:8.1f} ms"
              f"  {ok}")  # fmt: skip


def _headroom(measured: dict[str, Any], seen: dict[str, dict[str, Any]]) -> None:
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


def _mfu(folder: Path, seen: dict[str, dict[str, Any]]) -> None:
    """The clean run's MFU without the profiler against mfu_truth.json (where both are)."""
    truth_file = folder / "mfu_truth.json"
    mfu = seen.get("clean_good", {}).get("without", {}).get("mfu")
    if not truth_file.is_file() or mfu is None:
        return
    truth = json.loads(truth_file.read_text())["clean_mfu"]
    ok = abs(mfu / truth - 1) <= WITHIN
    print(f"\nclean MFU without the profiler {mfu:.2%}, FlopCounterMode {truth:.2%} ({mfu / truth - 1:+.1%}): {ok}")


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
