#!/usr/bin/env python
"""Capture a profiled Hugging Face load + training session: a thin wrapper over ``profparse.capture``.

    python scripts/capture.py                        # default tiny Qwen2 model, cpu or cuda
    python scripts/capture.py --preset qwen2.5-7b --layers 2 --device cuda
    python scripts/capture.py --model ~/models/my-causal-lm --steps 5 --out runs/mine

See docs/capture.md for the options, the trace layout and the stage-mark names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import profparse  # noqa: F401
except ImportError:  # a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from profparse.base.errors import ProfparseError, from_oserror  # noqa: E402
from profparse.capture import (  # noqa: E402
    EXTRA_HINT,
    PRESETS,
    CaptureDependencyError,
    CaptureOptions,
    run_capture,
    summary_text,
)
from profparse.cli.main import EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY, OneLineParser, report_error  # noqa: E402
from profparse.cli.options import int_option  # noqa: E402

NEEDS_EXTRA = f"capture: needs the 'capture' extra: {EXTRA_HINT}"


class CaptureParser(OneLineParser):
    tool = "capture"


def build_parser() -> argparse.ArgumentParser:
    p = CaptureParser(
        prog="capture.py",
        description="Profile loading + a few training steps of a Hugging Face causal LM with torch.profiler.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="PATH", help="local Hugging Face causal-LM folder (default: tiny Qwen2)")
    src.add_argument("--preset", choices=sorted(PRESETS), help="real layer shapes of a released model, random weights")
    p.add_argument("--layers", type=int_option(1), help="decoder layers of the --preset model (default: all)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--dtype", choices=("bf16", "fp32"), help="default: fp32 on cpu, bf16 on cuda")
    p.add_argument("--steps", type=int_option(1), default=3, help="training steps (default 3)")
    p.add_argument("--batch", type=int_option(1), default=2, help="batch size (default 2)")
    p.add_argument("--seq-len", type=int_option(1), default=64, help="sequence length (default 64)")
    p.add_argument("--out", metavar="DIR", help="run folder (default runs/<timestamp>); must not exist unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing run folder (only one a capture wrote)")
    p.add_argument("--no-stack", dest="with_stack", action="store_false", help="profiler: with_stack off")
    p.add_argument("--no-shapes", dest="record_shapes", action="store_false", help="profiler: record_shapes off")
    p.add_argument("--no-memory", dest="profile_memory", action="store_false", help="profiler: profile_memory off")
    p.add_argument(
        "--no-stage-marks",
        dest="stage_marks",
        action="store_false",
        help="emit no profparse.stage:/profparse.load: ranges (ProfilerStep#N stays)",
    )
    p.add_argument(
        "--cold",
        dest="warm",
        action="store_false",
        help="skip the unprofiled warm-up load: profile a first-in-process from_pretrained "
        "(lazy imports, conversion-mapping build; a ~10x bigger trace)",
    )
    p.add_argument(
        "--sync-load",
        action="store_true",
        help="load weights on the main thread (HF_DEACTIVATE_ASYNC_LOAD=1), so the trace shows them",
    )
    p.add_argument(
        "--seed", type=int_option(0, 2**63 - 1), default=0, help="seed of the input token ids and of torch (default 0)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = CaptureOptions(
            model=args.model,
            preset=args.preset,
            layers=args.layers,
            device=args.device,
            dtype=args.dtype,
            steps=args.steps,
            batch=args.batch,
            seq_len=args.seq_len,
            out=args.out,
            force=args.force,
            with_stack=args.with_stack,
            record_shapes=args.record_shapes,
            profile_memory=args.profile_memory,
            stage_marks=args.stage_marks,
            warm=args.warm,
            sync_load=args.sync_load,
            seed=args.seed,
            quiet=args.quiet,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result = run_capture(options)
    except CaptureDependencyError:
        print(NEEDS_EXTRA, file=sys.stderr)
        return 2
    except ProfparseError as exc:
        return report_error(exc, "capture")
    except KeyboardInterrupt:
        print("capture: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        print("capture: error: out of memory", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except OSError as exc:  # disk full, an output that cannot be written: the same codes as profparse's verbs
        mapped = from_oserror(exc, inputs=[args.model] if args.model else [])
        if not isinstance(mapped, ProfparseError):
            raise
        return report_error(mapped, "capture")
    try:
        summary = summary_text(result.trace_path)
    except Exception as exc:  # noqa: BLE001 - the capture itself succeeded; say why there is no summary
        print(
            f"capture: wrote {result.trace_path}, but the summary failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 0
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
