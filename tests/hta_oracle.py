"""HolisticTraceAnalysis (HTA) as a test oracle for GPU time per kernel name.

Not a test module (pytest does not collect it); tests import it::

    from hta_oracle import HTA_MISSING, hta_gpu_time_by_kernel_name, file_gpu_time_by_kernel_name
    hta = pytest.importorskip("hta", reason=HTA_MISSING)          # HTA is optional (``hta`` extra)

HTA is imported inside the functions only, so importing this module never needs HTA.

What HTA 0.5.0 does to GPU durations (see docs/hta_notes.md for the source references):

* ``hta.common.trace_parser.round_down_time_stamps`` replaces, for every event of a trace whose ``ts``
  column is float64 (any trace with a fractional ``ts``: all 2024+ Kineto traces), ``ts`` by
  ``ceil(ts)`` and ``dur`` by ``floor(ts + dur) - ceil(ts)``, in microseconds. So HTA's durations are
  whole microseconds and each event loses between 0 and 2 us. Integer-``ts`` traces (legacy 2021)
  are left as they are. ``HTA_DISABLE_NS_ROUNDING=1`` in the environment turns the rounding off.
* ``hta.common.trace.Trace._filter_irrelevant_gpu_kernels`` keeps only GPU events whose
  ``correlation`` matches a CPU-side event that starts no later than the end of the last
  ``ProfilerStep`` (with ``include_last_profiler_step=True``; before the *start* of the last step
  otherwise). It is skipped when the trace has fewer than two ``ProfilerStep`` names.

So, compared with the raw file, ``hta_gpu_time_by_kernel_name`` is lower on fractional-timestamp
traces; ``file_gpu_time_by_kernel_name(path, hta_rounding=True)`` applies the same rounding to the raw
events and matches HTA exactly on all five traces in ``../shared/traces/``.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

#: ``cat`` values of GPU activity (kernels, memcpy, memset): current schema and legacy 2021 schema.
GPU_ACTIVITY_CATS: frozenset[str] = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})


#: The skip reason of the HTA tests where HTA is not installed (README command 2 installs it).
HTA_MISSING = "HTA is not installed: pip install -e '.[hta]' (traceinsight; HolisticTraceAnalysis 0.5 works too)"


# --------------------------------------------------------------------------------------------- HTA side
@functools.lru_cache(maxsize=8)
def _load(path: str, include_last_profiler_step: bool, no_rounding: bool) -> Any:
    from hta.trace_analysis import TraceAnalysis  # imported here: HTA is optional

    from profparse.hta import ns_rounding  # HTA_DISABLE_NS_ROUNDING, also where HTA 0.6 caches it

    with ns_rounding(no_rounding):
        if os.path.isdir(path):  # a directory of rank traces, as HTA usually wants
            return TraceAnalysis(trace_dir=path, include_last_profiler_step=include_last_profiler_step)
        # A single file: HTA accepts {rank: absolute path}; no temporary directory needed.
        return TraceAnalysis(trace_files={0: path}, include_last_profiler_step=include_last_profiler_step)


def hta_loaded(
    trace_path: str | Path,
    *,
    include_last_profiler_step: bool = True,
    no_rounding: bool = False,
) -> Any:
    """Return an ``hta.trace_analysis.TraceAnalysis`` for one trace file (``.json`` / ``.json.gz``).

    Cached per (resolved path, options): do not mutate the returned object's DataFrames.
    ``no_rounding=True`` loads with ``HTA_DISABLE_NS_ROUNDING=1`` (keeps fractional microseconds).
    The rank of the loaded trace is ``result.t.get_ranks()[0]``.
    """
    return _load(str(Path(trace_path).resolve()), include_last_profiler_step, no_rounding)


def hta_gpu_events(trace_path: str | Path, **load_kwargs: Any) -> pd.DataFrame:
    """GPU activity rows (``cat`` in :data:`GPU_ACTIVITY_CATS`) of HTA's trace DataFrame, decoded.

    Columns: ``index`` (HTA's event index = position in ``traceEvents``), ``cat``, ``name`` (exact
    strings from HTA's symbol table, not shortened), ``stream``, ``correlation``, ``ts_us`` (HTA's ``ts``:
    microseconds relative to the earliest event), ``dur_us`` (HTA's ``dur``, microseconds) and ``dur_ns``
    (``round(dur_us * 1000)``, int64). Rows are HTA's, as is: no de-duplication.
    """
    ta = hta_loaded(trace_path, **load_kwargs)
    rank = ta.t.get_ranks()[0]
    df = ta.t.get_trace(rank)
    sym = pd.Series(ta.t.symbol_table.get_sym_table(), dtype=object)  # id -> string
    cat = df["cat"].map(sym)
    g = df.loc[cat.isin(GPU_ACTIVITY_CATS)]
    out = pd.DataFrame(
        {
            "index": g["index"].astype("int64").to_numpy(),
            "cat": cat.loc[g.index].to_numpy(dtype=object),
            "name": g["name"].map(sym).to_numpy(dtype=object),
            "stream": g["stream"].astype("int64").to_numpy(),
            "correlation": g["correlation"].astype("int64").to_numpy(),
            "ts_us": g["ts"].to_numpy(dtype="float64"),
            "dur_us": g["dur"].to_numpy(dtype="float64"),
        }
    )
    out["dur_ns"] = (out["dur_us"] * 1000).round().astype("int64")
    return out.sort_values("index", kind="stable").reset_index(drop=True)


def hta_gpu_time_by_kernel_name(trace_path: str | Path, **load_kwargs: Any) -> pd.Series:
    """Total GPU time in nanoseconds per event name, as HTA 0.5.0 computes it.

    Covers the GPU activity HTA keeps (kernels, memcpy, memset). Index: event name (exact string from
    the trace), sorted; values: int64 ns (sum of HTA's per-event ``dur`` in us, times 1000). Loads with
    ``include_last_profiler_step=True`` unless told otherwise (``load_kwargs`` go to :func:`hta_loaded`).
    """
    ev = hta_gpu_events(trace_path, **load_kwargs)
    s = ev.groupby("name", sort=True)["dur_ns"].sum().astype("int64")
    s.index = s.index.astype(object)
    s.index.name = "name"
    s.name = "dur_ns"
    return s


# -------------------------------------------------------------------------------------- raw file side
def _gpu_events_from_file(trace_path: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """(GPU activity events, whether HTA's ``ts`` column will be float64 for this file)."""
    p = Path(trace_path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    # pandas makes the ts column float64 when any event has a float ts or has no ts at all (NaN).
    ts_is_float = any(not isinstance(e.get("ts"), int) for e in events)
    gpu = [e for e in events if e.get("cat") in GPU_ACTIVITY_CATS and e.get("ph") == "X"]
    return gpu, ts_is_float


def hta_rounded_dur_us(ts_us: float, dur_us: float, ts_is_float: bool = True) -> int | float:
    """HTA's per-event duration: ``floor(ts + dur) - ceil(ts)`` (``round_down_time_stamps``).

    Applies only when the trace's ``ts`` column is float64 in HTA (some ``ts`` in the file is a float);
    otherwise HTA keeps ``dur`` as is.
    """
    if not ts_is_float:
        return dur_us
    return math.floor(float(ts_us) + float(dur_us)) - math.ceil(float(ts_us))


def file_gpu_time_by_kernel_name(trace_path: str | Path, *, hta_rounding: bool = False) -> pd.Series:
    """Ground truth straight from the JSON (stdlib): sum of ``round(dur * 1000)`` ns per name.

    Events: ``ph == "X"`` and ``cat`` in :data:`GPU_ACTIVITY_CATS`. With ``hta_rounding=True`` each
    duration is first rounded the way HTA rounds it (:func:`hta_rounded_dur_us`); HTA decides on the
    whole trace (a float or missing ``ts`` on any event), and so does this function.
    """
    evs, ts_is_float = _gpu_events_from_file(trace_path)
    tot: Counter[str] = Counter()
    for e in evs:
        dur = hta_rounded_dur_us(e["ts"], e["dur"], ts_is_float) if hta_rounding else e["dur"]
        tot[e["name"]] += round(dur * 1000)
    s = pd.Series(dict(sorted(tot.items())), dtype="int64", name="dur_ns")
    s.index = s.index.astype(object)
    s.index.name = "name"
    return s


def file_gpu_event_count(trace_path: str | Path) -> int:
    return len(_gpu_events_from_file(trace_path)[0])


# ------------------------------------------------------------------------------------------ comparison
def compare_with_file(trace_path: str | Path, **load_kwargs: Any) -> dict[str, Any]:
    """Numbers for docs/hta_notes.md: event counts, totals and worst per-name relative difference."""
    file_s = file_gpu_time_by_kernel_name(trace_path)
    hta_s = hta_gpu_time_by_kernel_name(trace_path, **load_kwargs)
    both = pd.concat({"file": file_s, "hta": hta_s}, axis=1).fillna(0).astype("int64")
    pos = both[both["hta"] > 0]
    rel = ((pos["file"] - pos["hta"]).abs() / pos["file"]).max() if len(pos) else 0.0
    emulated = file_gpu_time_by_kernel_name(trace_path, hta_rounding=True)
    return {
        "trace": Path(trace_path).name,
        "events_file": file_gpu_event_count(trace_path),
        "events_hta": len(hta_gpu_events(trace_path, **load_kwargs)),
        "names_file": len(file_s),
        "names_hta": len(hta_s),
        "names_hta_zero": int((both["hta"] == 0).sum()),
        "ns_file": int(file_s.sum()),
        "ns_hta": int(hta_s.sum()),
        "hta_over_file": float(hta_s.sum() / file_s.sum()) if file_s.sum() else float("nan"),
        "max_rel_diff": float(rel),
        "hta_equals_file_with_hta_rounding": emulated.to_dict() == hta_s.to_dict(),
    }


if __name__ == "__main__":  # python tests/hta_oracle.py ../shared/traces/*.json.gz
    import logging
    import sys

    logging.disable(logging.WARNING)
    rows = [compare_with_file(p) for p in sys.argv[1:]]
    print(pd.DataFrame(rows).to_string(index=False))
