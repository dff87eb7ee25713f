"""One rank task: parse one rank file and write its partitions (runs in a worker process or on Dask)."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from profparse.base.errors import ProfparseError, from_oserror
from profparse.base.formats import path_text
from profparse.ranks import critical_path as rank_paths
from profparse.ranks import late
from profparse.ranks.dataset import write_rank_tables
from profparse.ranks.results import RankResult, RankTask


def run_rank(task: RankTask) -> RankResult:
    """Parse one rank file (and write its partitions when ``task.out_root`` is set). Never raises for bad input."""
    from profparse.analysis.quality import gpu_devices
    from profparse.api import load

    start = time.perf_counter()
    result = RankResult(path=task.path, rank=task.rank, source=task.source, ok=False)
    cache_notes: list[str] = []  # the cache's notes (a damaged entry, cache off), said first with the rank's own
    try:
        parsed = load(
            task.path,
            cache=task.cache,
            include_marks=task.include_marks,
            strict=task.strict,
            notify=cache_notes.append,
            outputs=(task.output,) if task.output else (),
            peak_tflops=task.peak_tflops,
        )
        result.header_rank = parsed.rank
        result.events = int(len(parsed.raw.events))
        result.devices = gpu_devices(parsed)
        report = parsed.raw.report
        if report.truncated:
            result.notes.append(
                f"warning: truncated at byte {report.truncated_at_byte}; recovered {report.events_read} complete events"
            )
        for w in parsed.warnings.itertuples(index=False):
            if w.severity != "info" and w.check != "truncated":
                result.notes.append(f"{w.severity}: {w.message}")
        if task.source != "distributedInfo" and parsed.rank is not None and parsed.rank != task.rank:
            result.notes.append(
                f"warning: distributedInfo says rank {parsed.rank} (after the events); kept rank {task.rank} "
                f"from the {task.source}"
            )
        stated = _stated_rank(parsed.header)
        if stated is not None and parsed.rank is None:
            result.notes.append(
                f"warning: distributedInfo.rank {stated} is not a rank number (an integer from 0); kept rank "
                f"{task.rank} from the {task.source}"
            )
        result.stage_summary = parsed.stage_summary
        result.collectives = late.collective_rows(parsed)
        result.path_segments = rank_paths.waiting_segments(parsed.critical_path, result.collectives)
        result.findings = parsed.table("findings")  # small: a few rows
        result.steps = parsed.steps[["step", "start_ns", "end_ns", "steady"]]
        if task.out_root is None:  # summarize: sent back; a written dataset has them in its kernels and ops tables
            result.stage_names = late.stage_name_totals(parsed.kernels, parsed.ops)
        if task.out_root is not None:
            metadata = {
                "profparse.source": path_text(task.path),  # a name that is not UTF-8 as \xNN
                "profparse.rank": str(task.rank),
                "profparse.rank_source": task.source,
            }
            try:
                result.rows = write_rank_tables(parsed, task.out_root, task.rank, metadata)
            except OSError as exc:  # the output's fault (disk full, permissions), not the rank's: see parse_ranks
                mapped = from_oserror(exc)
                raise mapped if isinstance(mapped, ProfparseError) else exc from None
        result.ok = True
    except ProfparseError as exc:
        result.error, result.exit_code = str(exc), exc.exit_code
    except MemoryError:
        result.error, result.exit_code = f"{task.path}: out of memory", 8
    except RecursionError:
        result.error, result.exit_code = f"{task.path}: nested too deeply (corrupt or hostile input)", 4
    except Exception as exc:  # noqa: BLE001 - one bad rank must not stop the others
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.error = (
            f"{task.path}: internal error: {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
        )
        result.exit_code = 70
    result.notes[:0] = cache_notes
    result.seconds = time.perf_counter() - start
    return result


def _stated_rank(header: dict) -> str | None:
    """``distributedInfo.rank`` as the trace wrote it (JSON, shortened), None when there is none."""
    import json

    info = header.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        return None
    text = json.dumps(info["rank"], default=str)
    return text if len(text) <= 40 else text[:37] + "..."
