"""HolisticTraceAnalysis (HTA) analyses split by profparse stage (needs the ``hta`` extra).

HTA's GPU rows are joined to profparse's kernel table on ``correlation`` + ``stream`` (each GPU activity has a
correlation id shared with the runtime call that launched it; the stream tells apart the rare repeats), so every
HTA row gets the stage profparse attributed to it. Then:

* :func:`kernel_type_by_stage`: HTA's kernel type (COMPUTATION / COMMUNICATION / MEMORY, from
  ``hta.utils.utils.get_kernel_type``) per stage: count and summed duration. Summed over stages this equals the
  per-type ``sum (us)`` of HTA's ``get_gpu_kernel_breakdown``; HTA's overlap-aware type time (``COMPUTATION
  overlapping COMMUNICATION``...) is computed per stage with HTA's own code as ``hta_time_us``.
* :func:`idle_time_by_stage`: HTA's idle-time breakdown (host wait / kernel wait / other, per stream), the gap
  before each kernel going to that kernel's stage. Summed over stages this equals ``get_idle_time_breakdown``.

Times are HTA's: microseconds, rounded to whole microseconds unless loaded with ``exact=True``
(``HTA_DISABLE_NS_ROUNDING=1``; see docs/hta_notes.md).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profparse.base.errors import ProfparseError, TraceFormatError, install_hint
from profparse.base.formats import count_text, display, md_cell, md_code, md_table, render_as, text_table
from profparse.base.marks import STAGES

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

FORMATS = ("text", "json", "markdown")
UNMATCHED = "unmatched"  # HTA rows with no profparse kernel (none on the shared traces)
KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
INSTALL_HINT = f"HTA is not installed: install the hta extra: {install_hint('hta')}"


#: The distributions that install the ``hta`` module, preferred first: HTA 0.6+ is published as ``traceinsight``;
#: ``HolisticTraceAnalysis`` stopped at 0.5.0. profparse works with either (docs/hta_notes.md).
HTA_DISTRIBUTIONS = ("traceinsight", "HolisticTraceAnalysis")
ROUNDING_ENV = "HTA_DISABLE_NS_ROUNDING"


class HtaNotInstalledError(ProfparseError):
    """HolisticTraceAnalysis is not importable."""

    exit_code = 2


def hta_available() -> bool:
    try:
        import hta  # noqa: F401
    except ImportError:
        return False
    return True


def hta_distribution() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed HTA (by ``importlib.metadata``; ``traceinsight`` first when
    both are installed), None when neither is."""
    for name in HTA_DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@contextlib.contextmanager
def ns_rounding(exact: bool) -> Iterator[None]:
    """HTA's rounding of timestamps to whole microseconds off (``exact``) or on, for what runs inside.

    HTA 0.5 reads ``HTA_DISABLE_NS_ROUNDING`` at every parse; 0.6 reads it once into a singleton
    (``hta.configs.env_options.HTAEnvOptions``), so the variable alone would keep the first load's choice for
    the whole process: set both, and put both back after."""
    old = os.environ.get(ROUNDING_ENV)
    os.environ[ROUNDING_ENV] = "1" if exact else "0"
    options = None
    with contextlib.suppress(ImportError, AttributeError):
        from hta.configs.env_options import HTAEnvOptions  # 0.6+

        options = HTAEnvOptions.instance()
    before = options.disable_ns_rounding() if options is not None else None
    if options is not None:
        options.set_disable_ns_rounding(exact)
    try:
        yield
    finally:
        if options is not None:
            options.set_disable_ns_rounding(before)
        if old is None:
            os.environ.pop(ROUNDING_ENV, None)
        else:
            os.environ[ROUNDING_ENV] = old


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """HTA logs every step at INFO/WARNING and pandas 3 warns about its inplace calls: keep the terminal clean."""
    loggers = [logging.getLogger(n) for n in ("hta", "root")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(io.StringIO()):
                yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def load_hta(path: str | Path, *, exact: bool = False, include_last_profiler_step: bool = True) -> Any:
    """An ``hta.trace_analysis.TraceAnalysis`` for one trace file (rank from the file, else 0)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        raise HtaNotInstalledError(INSTALL_HINT) from None
    try:
        with ns_rounding(exact), _quiet():
            return TraceAnalysis(
                trace_files={0: str(Path(path).resolve())}, include_last_profiler_step=include_last_profiler_step
            )
    except ProfparseError:
        raise
    except Exception as exc:  # noqa: BLE001 - HTA raises anything on traces it cannot read
        reason = (str(exc).splitlines() or [""])[0]
        raise TraceFormatError(f"{path}: HTA could not load the trace ({type(exc).__name__}: {reason})") from None


def _rank(ta: Any) -> int:
    return int(ta.t.get_ranks()[0])


def _hta_trace(ta: Any) -> pd.DataFrame:
    """HTA's event frame, each row once: on a trace whose correlation ids repeat, HTA's own parse repeats some
    rows whole (the same index label), which no lookup by label can take."""
    trace = ta.t.get_trace(_rank(ta))
    return trace[~trace.index.duplicated()]


def hta_gpu_rows(ta: Any, parsed: ParsedTrace) -> pd.DataFrame:
    """HTA's GPU rows (``stream != -1``, as its kernel breakdown takes them) with names, kernel type and stage.

    Columns: ``index`` (HTA's event index), ``name``, ``cat``, ``stream``, ``correlation``, ``ts``, ``dur`` (us),
    ``kernel_type``, ``is_kernel_cat`` (the rows HTA's idle-time analysis uses), ``stage`` (profparse's, or
    ``unmatched``), ``trace_index`` (profparse's row, -1 when unmatched).
    """
    from hta.utils.utils import get_kernel_type

    df = _hta_trace(ta)
    sym = ta.t.symbol_table.get_sym_table()
    gpu = df[df["stream"].ne(-1)]
    names = pd.Series(sym, dtype=object)
    name = gpu["name"].map(names)
    cat = gpu["cat"].map(names)
    kernel_type = {n: get_kernel_type(n) for n in pd.unique(name)}
    rows = pd.DataFrame(
        {
            "index": gpu["index"].to_numpy(np.int64),
            "name": name.to_numpy(object),
            "cat": cat.to_numpy(object),
            "stream": gpu["stream"].to_numpy(np.int64),
            "correlation": gpu["correlation"].to_numpy(np.int64),
            "ts": gpu["ts"].to_numpy(),
            "dur": gpu["dur"].to_numpy(),
            "kernel_type": name.map(kernel_type).to_numpy(object),
            "is_kernel_cat": cat.isin(KERNEL_CATS).to_numpy(),
        },
        index=gpu.index,
    )
    return _join_stages(rows, parsed.kernels)


def _join_stages(rows: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Add profparse's ``stage`` and ``trace_index`` to HTA rows by (correlation, stream, n-th repeat)."""
    ours = pd.DataFrame(
        {
            "correlation": kernels["correlation"].fillna(-1).to_numpy(np.int64),
            "stream": kernels["stream"].fillna(-1).to_numpy(np.int64),
            "trace_index": kernels["trace_index"].to_numpy(np.int64),
            "stage": kernels["stage"].astype(str).to_numpy(object),
        }
    )
    ours = ours.sort_values("trace_index", kind="stable")
    ours["nth"] = ours.groupby(["correlation", "stream"]).cumcount()
    left = rows.assign(_hta_row=rows.index).sort_values("index", kind="stable")
    left["nth"] = left.groupby(["correlation", "stream"]).cumcount()
    merged = left.merge(ours, on=["correlation", "stream", "nth"], how="left")
    merged["stage"] = merged["stage"].fillna(UNMATCHED)
    merged["trace_index"] = merged["trace_index"].fillna(-1).astype(np.int64)
    merged = merged.set_index("_hta_row").drop(columns=["nth"])
    merged.index.name = None
    return merged


def _stage_order(values: pd.Series) -> pd.Categorical:
    return pd.Categorical(values, categories=[*STAGES, UNMATCHED])


def kernel_type_by_stage(ta: Any, parsed: ParsedTrace, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (stage, kernel_type): ``kernels`` (count), ``time_us`` (sum of HTA durations), ``share_of_stage``, and
    ``hta_time_us``: HTA's overlap-aware time for the stage (``X overlapping Y`` types included)."""
    rows = hta_gpu_rows(ta, parsed) if rows is None else rows
    if rows.empty:
        return pd.DataFrame(columns=["stage", "kernel_type", "kernels", "time_us", "share_of_stage", "hta_time_us"])
    grouped = rows.groupby(["stage", "kernel_type"]).agg(kernels=("dur", "size"), time_us=("dur", "sum")).reset_index()
    merged_time = _hta_overlap_time(rows)
    out = grouped.merge(merged_time, on=["stage", "kernel_type"], how="outer")
    out = out.fillna({"kernels": 0, "time_us": 0.0, "hta_time_us": 0.0})
    out["kernels"] = out["kernels"].astype(np.int64)
    stage_total = out.groupby("stage")["time_us"].transform("sum")
    out["share_of_stage"] = np.where(stage_total > 0, out["time_us"] / stage_total.where(stage_total > 0, 1), 0.0)
    out["stage"] = _stage_order(out["stage"])
    out = out.sort_values(["stage", "time_us"], ascending=[True, False], kind="stable").reset_index(drop=True)
    out["stage"] = out["stage"].astype(str)
    return out[["stage", "kernel_type", "kernels", "time_us", "share_of_stage", "hta_time_us"]]


def _hta_overlap_time(rows: pd.DataFrame) -> pd.DataFrame:
    """HTA's ``_get_gpu_kernel_type_time`` (merged intervals, overlaps named) applied to each stage's rows."""
    try:
        from hta.analyzers.breakdown_analysis import BreakdownAnalysis
        from hta.utils.utils import KernelType
    except ImportError:  # a future HTA without these internals: report the summed times only
        return pd.DataFrame(columns=["stage", "kernel_type", "hta_time_us"])
    types = [KernelType.COMPUTATION.name, KernelType.COMMUNICATION.name, KernelType.MEMORY.name]
    frames = []
    with _quiet():
        for stage, group in rows.groupby("stage"):
            g = group[["ts", "dur", "kernel_type"]].copy()
            g["end"] = g["ts"] + g["dur"]
            present = [t for t in types if (g["kernel_type"] == t).any()]
            try:
                got = BreakdownAnalysis._get_gpu_kernel_type_time(g, present)
            except Exception:  # noqa: BLE001 - internal API: leave this stage's column empty rather than fail
                continue
            got = got.rename(columns={"sum": "hta_time_us"})
            got["stage"] = stage
            frames.append(got[["stage", "kernel_type", "hta_time_us"]])
    if not frames:
        return pd.DataFrame(columns=["stage", "kernel_type", "hta_time_us"])
    return pd.concat(frames, ignore_index=True)


def idle_time_by_stage(
    ta: Any, parsed: ParsedTrace, rows: pd.DataFrame | None = None, *, consecutive_kernel_delay: int = 30
) -> pd.DataFrame:
    """HTA's idle-time breakdown per (stage, stream, idle_category): ``idle_time_us`` and ``gaps``.

    The same classification as HTA's ``get_idle_time_breakdown`` (a gap is host wait when the runtime call of the
    next kernel started after the previous kernel ended, kernel wait when shorter than
    ``consecutive_kernel_delay``, else other); each gap belongs to the stage of the kernel that follows it.
    """
    rows = hta_gpu_rows(ta, parsed) if rows is None else rows
    columns = ["stage", "stream", "idle_category", "idle_time_us", "gaps"]
    kernels = rows[rows["is_kernel_cat"]]
    if kernels.empty:
        return pd.DataFrame(columns=columns)
    trace = _hta_trace(ta)
    runtime_ts = trace["ts"].reindex(trace.loc[kernels.index, "index_correlation"].to_numpy()).to_numpy()
    k = kernels.assign(ts_runtime=runtime_ts)
    frames = []
    for stream, s in k.groupby("stream", sort=True):
        s = s.sort_values("ts", kind="stable")
        prev_end = (s["ts"] + s["dur"]).shift(1)
        gap = s["ts"] - prev_end
        host_wait = s["ts_runtime"] > prev_end
        kernel_wait = ~host_wait & (gap < consecutive_kernel_delay)
        category = np.where(host_wait, "host_wait", np.where(kernel_wait, "kernel_wait", "other"))
        frames.append(pd.DataFrame({"stage": s["stage"], "stream": stream, "idle_category": category, "gap": gap}))
    gaps = pd.concat(frames, ignore_index=True)
    gaps = gaps[gaps["gap"].notna()]
    out = (
        gaps.groupby(["stage", "stream", "idle_category"])
        .agg(idle_time_us=("gap", "sum"), gaps=("gap", "size"))
        .reset_index()
    )
    out["stage"] = _stage_order(out["stage"])
    out = out.sort_values(["stage", "stream", "idle_category"], kind="stable").reset_index(drop=True)
    out["stage"] = out["stage"].astype(str)
    return out[columns]


@dataclass
class HtaByStage:
    """The per-stage HTA analyses of one trace."""

    trace: str
    rank: int
    exact: bool
    rows: int
    unmatched: int
    negative: int  # rows whose duration HTA's rounding to whole microseconds made negative (HTA's sums include them)
    kernel_types: pd.DataFrame
    idle: pd.DataFrame
    hta_kernel_types: pd.DataFrame  # HTA's own get_gpu_kernel_breakdown kernel_type_df, whole trace
    hta_idle: pd.DataFrame  # HTA's own get_idle_time_breakdown, whole trace


def _check_loadable(parsed: ParsedTrace) -> None:
    report = parsed.raw.report
    if report.truncated:
        raise TraceFormatError(
            f"{parsed.path}: cut short (truncated at byte {report.truncated_at_byte}); HTA reads the whole file "
            "and cannot load it (profparse summarize and parse use its complete events)"
        )
    if len(parsed.raw.events) == 0:
        raise TraceFormatError(f"{parsed.path}: the trace has no events; HTA has nothing to analyse")


def hta_by_stage(
    parsed: ParsedTrace, *, exact: bool = False, consecutive_kernel_delay: int = 30, ta: Any = None
) -> HtaByStage:
    """Load the trace with HTA (unless ``ta`` is given) and split its kernel and idle breakdowns by stage.

    HTA reads the file itself, whole: a trace cut short, or one without events, is refused first with a
    :class:`~profparse.base.errors.TraceFormatError` (exit 4) that says so, rather than HTA's own error."""
    if ta is None:
        _check_loadable(parsed)
    ta = ta if ta is not None else load_hta(parsed.path, exact=exact)
    with _quiet():
        rows = hta_gpu_rows(ta, parsed)
        types = kernel_type_by_stage(ta, parsed, rows)
        idle = idle_time_by_stage(ta, parsed, rows, consecutive_kernel_delay=consecutive_kernel_delay)
        kernel_type_df, _ = ta.get_gpu_kernel_breakdown(visualize=False)
        if rows["is_kernel_cat"].any():
            hta_idle, _ = ta.get_idle_time_breakdown(visualize=False, consecutive_kernel_delay=consecutive_kernel_delay)
        else:
            hta_idle = pd.DataFrame(columns=["rank", "stream", "idle_category", "idle_time", "idle_time_ratio"])
    return HtaByStage(
        trace=str(parsed.path),
        rank=_rank(ta),
        exact=exact,
        rows=int(len(rows)),
        unmatched=int((rows["stage"] == UNMATCHED).sum()),
        negative=int((rows["dur"] < 0).sum()),
        kernel_types=types,
        idle=idle,
        hta_kernel_types=kernel_type_df,
        hta_idle=hta_idle,
    )


# -- rendering ----------------------------------------------------------------------------------------------------


def hta_data(result: HtaByStage) -> dict[str, Any]:
    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        out = []
        for r in frame.to_dict("records"):
            out.append({k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()})
        return out

    idle_stage = result.idle.groupby(["stage", "idle_category"])["idle_time_us"].sum().reset_index()
    idle_stage["stage"] = _stage_order(idle_stage["stage"])
    idle_stage = idle_stage.sort_values(["stage", "idle_category"], kind="stable")
    idle_stage["stage"] = idle_stage["stage"].astype(str)
    return {
        "trace": result.trace,
        "rank": result.rank,
        "hta": dict(zip(("distribution", "version"), hta_distribution() or (None, None), strict=True)),
        "units": "us (HTA's, " + ("exact" if result.exact else "rounded to whole microseconds per event") + ")",
        "gpu_rows": result.rows,
        "unmatched_rows": result.unmatched,
        "negative_duration_rows": result.negative,
        "kernel_types_by_stage": records(result.kernel_types),
        "idle_by_stage": records(idle_stage),
        "idle_by_stage_and_stream": records(result.idle),
        "hta_kernel_types": records(result.hta_kernel_types),
        "hta_idle": records(result.hta_idle),
    }


def _us(v: float) -> str:
    return f"{v / 1000:,.2f}"


def _table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    return text_table(headers, rows, align_left=left)


def _sections(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    types = [r for r in data["kernel_types_by_stage"] if r["kernels"]]
    kt_rows = [
        [r["stage"], r["kernel_type"], f"{r['kernels']:,}", _us(r["time_us"]), f"{r['share_of_stage']:.1%}"]
        for r in types
    ]
    by_type: dict[str, float] = {}
    for r in types:
        by_type[r["kernel_type"]] = by_type.get(r["kernel_type"], 0.0) + r["time_us"]
    kt_rows += [["all", t, "", _us(v), ""] for t, v in sorted(by_type.items(), key=lambda kv: -kv[1])]
    overlap = [r for r in data["kernel_types_by_stage"] if r.get("hta_time_us")]
    idle_rows = []
    idle = data["idle_by_stage"]
    for stage in dict.fromkeys(r["stage"] for r in idle):
        cats = {r["idle_category"]: r["idle_time_us"] for r in idle if r["stage"] == stage}
        total = sum(cats.values())
        idle_rows.append([stage, *(_us(cats.get(c, 0.0)) for c in ("host_wait", "kernel_wait", "other")), _us(total)])
    sections = [
        (
            "GPU kernel time by HTA kernel type, per stage (ms)",
            ["stage", "kernel type", "kernels", "ms", "of stage"],
            kt_rows,
        ),
    ]
    if overlap:
        sections.append(
            (
                "HTA's overlap-aware kernel type time, per stage (ms)",
                ["stage", "kernel type", "ms"],
                [[r["stage"], r["kernel_type"], _us(r["hta_time_us"])] for r in overlap],
            )
        )
    sections.append(
        (
            "GPU idle time by HTA category, per stage (ms; a gap counts for the kernel after it)",
            ["stage", "host wait", "kernel wait", "other", "total"],
            idle_rows,
        )
    )
    return sections


def _negative_note(count: int) -> str:
    """Why some of HTA's times are below zero: its rounding of each event's start and end to whole microseconds
    gives an event shorter than one a duration of -1 us (HTA's sums include them; ``--exact`` has none)."""
    events = count_text(count, "GPU event")
    return f"{events} under 1 us got -1 us from HTA's rounding (its sums include them; --exact has none)"


def render_text(data: dict[str, Any]) -> str:
    out = io.StringIO()
    out.write(f"profparse hta: {display(data['trace'])} (rank {data['rank']})\n")
    out.write(f"  {data['gpu_rows']:,} HTA GPU rows joined to profparse stages")
    out.write(f", {data['unmatched_rows']:,} unmatched\n" if data["unmatched_rows"] else ", all matched\n")
    out.write(f"  times: {data['units']}\n")
    if data.get("negative_duration_rows"):
        out.write(f"  {_negative_note(data['negative_duration_rows'])}\n")
    if data["hta"]["distribution"]:
        out.write(f"  HTA: {display(data['hta']['distribution'])} {display(data['hta']['version'])}\n")
    for title, headers, rows in _sections(data):
        out.write(f"\n{title}\n")
        left = 2 if headers[1] == "kernel type" else 1
        out.write((_table(headers, rows, left=left) if rows else "  (none)") + "\n")
    return out.getvalue()


def render_markdown(data: dict[str, Any]) -> str:
    lines = [f"# profparse hta: {md_code(data['trace'])} (rank {data['rank']})", "", f"Times: {data['units']}."]
    if data.get("negative_duration_rows"):
        lines[-1] += f" {_negative_note(data['negative_duration_rows'])}."  # it starts with the count
    if data["hta"]["distribution"]:
        lines[-1] += f" HTA: {md_cell(data['hta']['distribution'])} {md_cell(data['hta']['version'])}."
    for title, headers, rows in _sections(data):
        lines += ["", f"## {title}", "", *md_table(headers, [[md_cell(c) for c in r] for r in rows])]
    return "\n".join(lines) + "\n"


def render(data: dict[str, Any], fmt: str = "text") -> str:
    return render_as(data, fmt, {"text": render_text, "markdown": render_markdown})
