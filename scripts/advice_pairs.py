"""Capture the before/after pairs of ``profparse advise`` and compare the findings' estimates with the measured
savings.

    python scripts/advice_pairs.py --out /tmp/advice_pairs [--kind recompute ...] [--stack] [--no-capture]
    python scripts/advice_pairs.py --device cuda --out /tmp/gpu_pairs [--kind sync_in_step ...] [--blocks 6] [--tiny]

Writes ``KIND_bad.json.gz``, ``KIND_good.json.gz`` per kind and ``clean.json.gz`` into ``--out``, then prints per
kind the mean step time of each side (steps after the first) and the difference: the saving the fix measured.
Where ``profparse.parse(trace).findings`` has rows, it also prints each finding of that kind on both sides with its
``saving_ns_per_step`` and the ratio estimate / measured. ``--no-capture`` only measures traces already in --out.
See docs/advice.md, "Checking the estimates".

``--device cuda`` captures the GPU pairs instead (:mod:`profparse.capture.gpu_pairs`, docs/advice.md, "GPU pairs"):
the traces and ``measured.json`` in the layout of ``../shared/traces/h200_pairs``, then the table of
``scripts/h200_check.py`` on them. ``--tiny`` uses a tiny Llama, and runs on the CPU where no GPU is (to check the
script itself).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from profparse.capture.advice_pairs import (
    CLEAN,
    KINDS,
    PAIRS,
    capture_clean,
    capture_pair,
    measure,
    step_times_ns,
    trace_name,
)
from profparse.capture.gpu_pairs import PATTERNS as GPU_PATTERNS


def _findings(trace: Path, kind: str | None) -> list[tuple[str, float]]:
    """(kind, saving_ns_per_step) of the trace's findings (of ``kind`` when given); none when there is no
    findings table or it is empty."""
    import profparse

    try:
        table = profparse.parse(trace).findings
    except (AttributeError, KeyError, NotImplementedError):
        return []
    if table is None or len(table) == 0:
        return []
    rows = table if kind is None else table[table["kind"] == kind]
    return [(str(k), float(s)) for k, s in zip(rows["kind"], rows["saving_ns_per_step"], strict=True)]


def _spread(values_ns: object) -> str:
    import numpy as np

    ms = np.asarray(values_ns, dtype=float) / 1e6
    return f"{ms.mean():7.1f} ms (sd {ms.std():4.1f}, {', '.join(f'{v:.0f}' for v in ms)})"


def _per_step_ops(trace: Path) -> pd.DataFrame:
    """Per op or range name (``ProfilerStep#N`` as ``ProfilerStep#*``: its self time is the step's time outside
    every op), over the measured steps (after the first): count, self and inclusive ms per step."""
    import profparse

    parsed = profparse.parse(trace)
    events = parsed.events
    events = events[events["category"].isin(["cpu_op", "user_annotation"]) & (events["step"] >= 1)]
    steps = max(int(events["step"].nunique()), 1)
    names = events["name"].astype(str).str.replace(r"^ProfilerStep#\d+$", "ProfilerStep#*", regex=True)
    grouped = events.assign(name=names).groupby("name")
    table = pd.DataFrame(
        {
            "count": grouped.size() / steps,
            "self_ms": grouped["self_ns"].sum() / steps / 1e6,
            "incl_ms": grouped["dur_ns"].sum() / steps / 1e6,
        }
    )
    return table


def _report_op_differences(bad: Path, good: Path, top: int) -> None:
    """The ``top`` names whose self time per step differs most between the two sides."""
    sides = (_per_step_ops(bad), _per_step_ops(good))
    diff = pd.merge(*sides, how="outer", left_index=True, right_index=True, suffixes=("_bad", "_good")).fillna(0.0)
    diff["delta_self_ms"] = diff["self_ms_bad"] - diff["self_ms_good"]
    order = diff["delta_self_ms"].abs().sort_values(ascending=False).index[:top]
    columns = ["count_bad", "count_good", "self_ms_bad", "self_ms_good", "incl_ms_bad", "incl_ms_good"]
    shown = diff.loc[order, [*columns, "delta_self_ms"]]
    print(f"  per step, top {top} by |self time bad - good| (ms; ProfilerStep#* self = time outside ops):")
    print("\n".join("    " + line for line in shown.round(2).to_string().splitlines()))
    print(f"  sum of self-time differences over all names: {diff['delta_self_ms'].sum():.1f} ms/step")


def _report_pair(out: Path, kind: str, top: int) -> None:
    bad, good = out / trace_name(kind, True), out / trace_name(kind, False)
    m = measure(bad, good)
    diff_ms = m.difference_ns / 1e6
    share = m.difference_ns / m.good_mean_ns
    print(f"{kind}: {PAIRS[kind].bad}  ->  {PAIRS[kind].good}")
    print(f"  bad  {_spread(m.bad_step_ns)}")
    print(f"  good {_spread(m.good_step_ns)}")
    median_ms, fast_ms = m.median_difference_ns / 1e6, m.fast_half_difference_ns / 1e6
    print(
        f"  measured saving {diff_ms:.1f} ms/step ({share:.0%} of the good step; medians: {median_ms:.1f} ms; "
        f"fastest halves: {fast_ms:.1f} ms)"
    )
    for side, trace in (("bad", bad), ("good", good)):
        for found, saving in _findings(trace, kind):
            ratios = [saving / d if d > 0 else float("nan") for d in (m.difference_ns, m.fast_half_difference_ns)]
            print(
                f"  finding {found} on {side}: {saving / 1e6:.1f} ms/step, estimate/measured {ratios[0]:.2f} "
                f"(fastest halves: {ratios[1]:.2f})"
            )
    if top:
        _report_op_differences(bad, good, top)


def _report_clean(out: Path) -> None:
    path = out / trace_name(CLEAN, False)
    steps = step_times_ns(path)
    print(f"{CLEAN}: {_spread(steps)}")
    for found, saving in _findings(path, None):
        print(f"  finding {found}: {saving / 1e6:.1f} ms/step ({saving / steps.mean():.0%} of the step)")


def _gpu_pairs(args: argparse.Namespace) -> int:
    """``--device cuda``: the GPU pairs captured into ``--out``, then h200_check's table on them."""
    import torch

    from profparse.capture.gpu_pairs import capture_all

    device = "cuda"
    if not torch.cuda.is_available():
        if not args.tiny:
            print("advice_pairs.py: --device cuda: no CUDA device here (--tiny runs on the CPU)", file=sys.stderr)
            return 2
        device = "cpu"
    unknown = sorted(set(args.kind or []) - set(GPU_PATTERNS))
    if unknown:
        print(f"advice_pairs.py: not a GPU pattern: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.no_capture:
        patterns = args.kind or list(GPU_PATTERNS)
        capture_all(args.out, device, args.tiny, args.blocks, patterns, lambda m: print(m, file=sys.stderr))
    from h200_check import main as check  # scripts/ is this script's folder

    check(args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the traces")
    parser.add_argument(
        "--kind", action="append", choices=sorted({*KINDS, CLEAN, *GPU_PATTERNS}), help="only these (repeatable)"
    )
    parser.add_argument("--stack", action="store_true", help="record Python stacks (with_stack=True)")
    parser.add_argument("--ops", type=int, default=0, metavar="N", help="print the N names that differ most")
    parser.add_argument("--no-capture", action="store_true", help="measure the traces already in --out")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the GPU pairs")
    parser.add_argument("--tiny", action="store_true", help="GPU pairs: a tiny model (on the CPU without a GPU)")
    parser.add_argument("--blocks", type=int, default=6, help="GPU pairs: timed blocks per side (at least 6)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        return _gpu_pairs(args)
    kinds = args.kind or [*KINDS, CLEAN]
    for kind in kinds:
        if not args.no_capture:
            started = time.perf_counter()
            if kind == CLEAN:
                capture_clean(args.out, args.stack)
            else:
                capture_pair(kind, args.out, args.stack)
            print(f"[captured {kind} in {time.perf_counter() - started:.1f} s]", file=sys.stderr)
        if kind == CLEAN:
            _report_clean(args.out)
        else:
            _report_pair(args.out, kind, args.ops)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
