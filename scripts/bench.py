#!/usr/bin/env python
"""Benchmark: profparse end to end vs HolisticTraceAnalysis (HTA) loading, on large tiled traces.

1. Generate: tile the body of a real Kineto trace (every event except metadata, the ``Trace`` span and the
   global instants) N times, shifting timestamps by the body's span, every id (``External id``,
   ``correlation``, flow ``id``, ``Ev Idx``, ``Sequence number``, ``Python id``/``Python parent id``,
   ``Record function id``) by one stride, and ``ProfilerStep#N`` numbers by the number of steps. Each event keeps
   the source's exact text (Kineto formatting, one event per object); files are written tile by tile.
2. Measure: ``profparse parse TRACE -o DIR`` (read + link + attribute + Parquet) and
   ``TraceAnalysis(trace_files={0: TRACE}, include_last_profiler_step=True)``, each in a fresh subprocess,
   alternating, ``--runs`` times. Wall seconds from spawn to exit; peak RSS from ``wait4`` (the child and its
   waited-for descendants, like ``/usr/bin/time -v``). A watchdog kills a child that runs past ``--timeout``, whose
   process tree grows past ``--mem-limit-gb``, or when the machine's available memory drops under
   ``--min-free-gb``; it is then reported as "did not finish (reason)".
3. Report: a table on stdout; ``--write-docs`` puts it into docs/performance.md with the machine it ran on.

``--traces`` measures ready-made trace files instead (e.g. tiles made by ``../shared/tools/tile.py TRACE OUT 300``),
each as one row; the side-by-side table gives, per trace, every tool's seconds, the ratios and each tool's peak
RSS over the JSON's size. HTA 0.5 (``HolisticTraceAnalysis``) and HTA 0.6 (``traceinsight``) both install the
``hta`` module, so each runs in the Python given by ``--hta-python`` / ``--hta06-python`` (default: this one),
and a tool whose package that Python lacks is skipped with a note.

Examples::

    python scripts/bench.py --traces /tmp/tiles/a100_ddp_rank0_nccl.json /tmp/tiles/mi300x_resnet18_train.json \
        --tools profparse decode hta hta06 --hta-python /tmp/hta05/bin/python --runs 3
    python scripts/bench.py --sizes 100MB --runs 3
    python scripts/bench.py --sizes 500MB 2GB --runs 3 --write-docs
    python scripts/bench.py --generate-only --sizes 2GB
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import msgspec
import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "performance.md"
DEFAULT_SOURCE = REPO.parent / "shared" / "traces" / "v100_ns_resolution_5steps.json.gz"
MB = 1_000_000
PAGE = os.sysconf("SC_PAGE_SIZE")
PSS_EVERY_S = 0.5
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
DATA = re.compile(r"<!-- bench:data (.*?) -->", re.S)

ID_KEYS = (
    "External id",
    "correlation",
    "Ev Idx",
    "Sequence number",
    "Python id",
    "Python parent id",
    "Record function id",
    "id",
)
_TS = re.compile(r'("ts"\s*:\s*)(\d+)(\.\d+)?')
_DUR = re.compile(r'("dur"\s*:\s*)(\d+)(\.\d+)?')
_ID = re.compile(r'("(?:' + "|".join(re.escape(k) for k in ID_KEYS) + r')"\s*:\s*)(\d+)(?![\d.eE])')
_STEP = re.compile(r"(ProfilerStep#)(\d+)")

HTA_CODE = """
import sys, time
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_files={0: sys.argv[1]}, include_last_profiler_step=True)
print("rows", len(t.t.get_trace(0)), flush=True)
"""

# HTA 0.6 ships on PyPI as ``traceinsight`` (0.6.x; still the ``hta`` module, same API); each HTA runs in a Python
# that has it (--hta-python, --hta06-python), since both install the ``hta`` module
HTA06_CODE = HTA_CODE
#: the package each HTA tool needs in its Python, and the version it must start with
HTA_PACKAGES = {"hta": ("HolisticTraceAnalysis", "0.5"), "hta06": ("traceinsight", "0.6")}

# The decode limit: one typed msgspec decode of only the fields profparse reads (the structs of
# profparse.trace.schema, float timestamps, text args as msgspec.Raw; integer args may also be strings, as in ROCm
# traces, where profparse falls back per event), single-threaded, cyclic GC off; no columns.
DECODE_CODE = """
import gc, sys, time
import msgspec
t0 = time.perf_counter()
class Args(msgspec.Struct, gc=False, rename={"external_id": "External id", "sequence_number": "Sequence number",
        "fwd_thread_id": "Fwd thread id", "mem_bytes": "Bytes", "total_allocated": "Total Allocated",
        "total_reserved": "Total Reserved", "device_type": "Device Type", "device_id": "Device Id", "addr": "Addr",
        "python_id": "Python id", "python_parent_id": "Python parent id", "comm_in_nelems": "In msg nelems",
        "comm_out_nelems": "Out msg nelems", "comm_group_size": "Group size", "comm_seq": "Seq",
        "input_dims": "Input Dims", "input_types": "Input type", "concrete_inputs": "Concrete Inputs",
        "collective": "Collective name", "comm_dtype": "dtype", "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks"}):
    correlation: int | str | None = None
    external_id: int | str | None = None
    sequence_number: int | str | None = None
    fwd_thread_id: int | str | None = None
    stream: int | str | None = None
    device: int | str | None = None
    bytes: int | str | None = None
    mem_bytes: int | str | None = None
    total_allocated: int | str | None = None
    total_reserved: int | str | None = None
    device_type: int | str | None = None
    device_id: int | str | None = None
    addr: int | str | None = None
    python_id: int | str | None = None
    python_parent_id: int | str | None = None
    comm_in_nelems: int | str | None = None
    comm_out_nelems: int | str | None = None
    comm_group_size: int | str | None = None
    comm_seq: int | str | None = None
    name: str | None = None
    input_dims: msgspec.Raw = None
    input_types: msgspec.Raw = None
    concrete_inputs: msgspec.Raw = None
    collective: msgspec.Raw = None
    comm_dtype: msgspec.Raw = None
    pg_name: msgspec.Raw = None
    pg_desc: msgspec.Raw = None
    pg_ranks: msgspec.Raw = None
class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Args | None = None
class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []
gc.disable()
with open(sys.argv[1], "rb") as f:
    data = f.read()
doc = msgspec.json.decode(data, type=Doc)
print("events", len(doc.traceEvents), "decode_s", round(time.perf_counter() - t0, 3), flush=True)
"""
# The floor of profparse's design: its own reader (the same chunks, processes and msgspec structs as ``parse``)
# after the imports ``parse`` makes, with the columns left out: every chunk is decoded on all cores and dropped.
# No pipeline that turns msgspec objects into columns in Python can finish sooner; a peer's time over this floor is
# the largest ratio such a design can reach on this machine.
FLOOR_CODE = """
import sys
import profparse.api  # what `profparse parse` imports before it reads: numpy, pandas, pyarrow, msgspec
from profparse.trace import events, table, workers
workers.chunk_columns = lambda chunk, raw=None: None  # decode each chunk (in the worker processes), keep nothing
table.EventTableBuilder.add = lambda self, chunk, raw=None: None  # the same for a chunk decoded here
raw = events.read_trace(sys.argv[1])
print("events", raw.report.events_read, "rows", len(raw.events), flush=True)
"""
TOOLS = ("profparse", "hta", "hta06", "decode", "floor")
LABELS = {
    "profparse": "profparse parse (end to end)",
    "hta": "HTA 0.5 TraceAnalysis (load)",
    "hta06": "HTA 0.6 traceinsight (load)",
    "decode": "decode only (msgspec, needed fields)",
    "floor": "floor: imports + profparse's reader on all cores, no columns",
}
EVENTS = re.compile(r"^events (\d+)", re.M)
PHASE = re.compile(r"^profparse-phase (\S+) ([0-9.]+)(?: ([0-9.]+))?(?: ([0-9]+))?$", re.M)


# -- generation -----------------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?B)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"size like 100MB or 2GB expected, got {text!r}")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2)])


def size_label(n: int) -> str:
    return f"{n / 10**9:g}GB" if n >= 10**9 else f"{n / 10**6:g}MB"


def _read_source(path: Path) -> bytes:
    import gzip

    with path.open("rb") as handle:
        magic = handle.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rb") as handle:
        return handle.read()


@dataclass
class Template:
    """One %-format string and the base value and per-tile increment of each of its ``%d`` slots."""

    text: str
    base: np.ndarray
    inc: np.ndarray

    def render(self, k: int) -> str:
        return self.text % tuple((self.base + k * self.inc).tolist())


@dataclass
class Tiler:
    head: str  # text up to and including the first event's indentation
    body: Template  # one tile: all body events, separated, without a trailing separator
    tail: Template  # separator + metadata/Trace/instants + end of array and document (increments x last tile)
    separator: str
    body_events: int
    tail_events: int
    tile_bytes: int
    period_us: int
    id_stride: int
    steps: int


def build_tiler(source: Path, gap_us: int = 1000) -> Tiler:
    """Cut ``source`` into head, tile-able body and tail templates."""
    data = _read_source(source)
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    array = bytes(top["traceEvents"])
    start = data.find(array)
    text_head, text_tail = data[:start].decode(), data[start + len(array) :].decode()
    raws = [bytes(r) for r in msgspec.json.decode(array, type=list[msgspec.Raw])]
    events = msgspec.json.decode(array, type=list[dict])
    # exact text positions of each event inside the array, for the separators
    pos, spans = 0, []
    for raw in raws:
        i = array.find(raw, pos)
        spans.append((i, i + len(raw)))
        pos = i + len(raw)
    lead = array[1 : spans[0][0]].decode()  # "\n  " between '[' and the first '{'
    separator = array[spans[0][1] : spans[1][0]].decode() if len(raws) > 1 else ",\n  "
    close = array[spans[-1][1] :].decode()  # "\n  ]"

    def is_tail(e: dict) -> bool:
        return e.get("ph") in ("M", "i", "I") or e.get("cat") == "Trace"

    body_idx = [i for i, e in enumerate(events) if not is_tail(e)]
    tail_idx = [i for i, e in enumerate(events) if is_tail(e)]
    ts = [float(events[i]["ts"]) for i in body_idx if "ts" in events[i]]
    ends = [float(events[i]["ts"]) + float(events[i].get("dur") or 0) for i in body_idx if "ts" in events[i]]
    period_us = int(max(ends) - min(ts)) + 1 + gap_us
    max_id = 0
    step_numbers = set()
    for i in body_idx:
        text = raws[i].decode()
        for m in _ID.finditer(text):
            max_id = max(max_id, int(m.group(2)))
        step_numbers.update(int(m.group(2)) for m in _STEP.finditer(text))
    id_stride = -(-(max_id + 1) // 1000) * 1000
    steps = (max(step_numbers) - min(step_numbers) + 1) if step_numbers else 0

    def template(indices: list[int], join: str, tail: bool) -> Template:
        parts: list[str] = []
        base: list[int] = []
        inc: list[int] = []
        for i in indices:
            text = raws[i].decode().replace("%", "%%")
            e = events[i]
            slots: list[tuple[int, int, int, int, int]] = []  # start, end, value, increment, group (keep)
            shift_time = not tail or (e.get("ph") in ("i", "I") and e.get("name") == "Record Window End")
            for m in _TS.finditer(text):
                slots.append((m.start(2), m.end(2), int(m.group(2)), period_us if shift_time else 0, 0))
            if tail and e.get("cat") == "Trace":
                for m in _DUR.finditer(text):
                    slots.append((m.start(2), m.end(2), int(m.group(2)), period_us, 0))
            if not tail:
                for m in _ID.finditer(text):
                    slots.append((m.start(2), m.end(2), int(m.group(2)), id_stride, 0))
                for m in _STEP.finditer(text):
                    slots.append((m.start(2), m.end(2), int(m.group(2)), steps, 0))
            slots.sort()
            out, last = [], 0
            for s, t, value, step, _ in slots:
                out.append(text[last:s])
                out.append("%d")
                base.append(value)
                inc.append(step)
                last = t
            out.append(text[last:])
            parts.append("".join(out))
        return Template(join.join(parts), np.array(base, dtype=np.int64), np.array(inc, dtype=np.int64))

    body = template(body_idx, separator.replace("%", "%%"), tail=False)
    tail_t = template(tail_idx, separator.replace("%", "%%"), tail=True)
    tail_t.text = (
        (separator.replace("%", "%%") + tail_t.text if tail_idx else "")
        + close.replace("%", "%%")
        + text_tail.replace("%", "%%")
    )
    head = text_head + "[" + lead
    tile_bytes = len(body.render(0).encode()) + len(separator)
    return Tiler(
        head=head,
        body=body,
        tail=tail_t,
        separator=separator,
        body_events=len(body_idx),
        tail_events=len(tail_idx),
        tile_bytes=tile_bytes,
        period_us=period_us,
        id_stride=id_stride,
        steps=steps,
    )


def generate(tiler: Tiler, target_bytes: int, path: Path) -> dict:
    """Write about ``target_bytes`` of tiled trace to ``path`` (tile by tile); return its description."""
    tiles = max(1, round((target_bytes - len(tiler.head)) / tiler.tile_bytes))
    tmp = path.with_suffix(path.suffix + ".partial")
    t0 = time.perf_counter()
    with tmp.open("w", encoding="utf-8", newline="") as out:
        out.write(tiler.head)
        for k in range(tiles):
            if k:
                out.write(tiler.separator)
            out.write(tiler.body.render(k))
        out.write(tiler.tail.render(tiles - 1))
    tmp.rename(path)
    info = {
        "bytes": path.stat().st_size,
        "events": tiles * tiler.body_events + tiler.tail_events,
        "tiles": tiles,
        "steps": tiles * tiler.steps,
        "generate_s": round(time.perf_counter() - t0, 1),
    }
    path.with_suffix(".meta.json").write_text(json.dumps(info))
    return info


def _existing(path: Path) -> dict | None:
    meta = path.with_suffix(".meta.json")
    if path.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if info.get("bytes") == path.stat().st_size:
            return info
    return None


def ensure_trace(
    source: Path, target: int, out_dir: Path, tiler_cache: dict, in_child: bool = False
) -> tuple[Path, dict]:
    """The tiled trace of ``source`` at about ``target`` bytes, generated if missing. ``in_child``: generate it in a
    child process, so that this process stays small: Linux carries a process's RSS at fork into its children's
    ``ru_maxrss``, so a bench process holding the tiler (hundreds of MB for a big source) would inflate the peak RSS
    of every tool it runs afterwards."""
    stem = source.name.split(".")[0]
    path = out_dir / f"{stem}_x_{size_label(target)}.json"
    info = _existing(path)
    if info is not None:
        return path, info
    if in_child:
        cmd = [sys.executable, __file__, "--generate-only", "--trace", str(source), "--work-dir", str(out_dir)]
        subprocess.run([*cmd, "--sizes", f"{target}B"], check=True)
        info = _existing(path)
        if info is None:
            raise SystemExit(f"bench: generating {path} failed")
        return path, info
    if "tiler" not in tiler_cache:
        tiler_cache["tiler"] = build_tiler(source)
    print(f"generating {path} (~{size_label(target)}) ...", file=sys.stderr, flush=True)
    info = generate(tiler_cache["tiler"], target, path)
    print(f"  {info['bytes'] / MB:.0f} MB, {info['events']:,} events in {info['generate_s']} s", file=sys.stderr)
    return path, info


# -- measurement ----------------------------------------------------------------------------------------------


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _tree_rss(pid: int) -> int:
    """Sum of RSS over ``pid`` and its descendants (cheap: statm)."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError):
            continue
    return total


def _tree_pss(pid: int) -> int:
    """Sum of PSS over ``pid`` and its descendants. PSS counts a page shared by k processes (forked workers,
    shared memory) as 1/k in each, so the sum is the memory really in use. Reading smaps_rollup walks the page
    tables (~10 ms per GB of the process), so it is sampled rarely to keep the measurement from disturbing the run."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
    return total


@dataclass
class Run:
    tool: str
    size: str
    run: int
    seconds: float
    peak_rss: int  # bytes: ru_maxrss from wait4, the largest single process (what /usr/bin/time -v reports)
    peak_pss: int  # bytes: largest sampled sum of PSS over the process tree (counts forked workers too)
    ok: bool
    reason: str = ""
    phases: dict = field(default_factory=dict)  # profparse: phase -> seconds (PROFPARSE_PROFILE_PHASES)
    cpu: float = 0.0  # user + system seconds of the process and its children (wait4), steadier than wall under load


@dataclass
class Limits:
    timeout_s: float
    mem_limit: int
    min_free: int


def measure(
    cmd: list[str], limits: Limits, log: Path, env: dict[str, str] | None = None
) -> tuple[float, int, int, bool, str, float]:
    """Run ``cmd`` in its own session under the watchdog: (seconds, peak RSS, peak tree PSS, finished, reason,
    CPU seconds)."""
    reason = ""
    peak_pss = 0
    next_pss = 0.5
    with log.open("wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed = time.perf_counter() - t0
            rss = _tree_rss(proc.pid)
            if elapsed >= next_pss:
                peak_pss = max(peak_pss, _tree_pss(proc.pid))
                next_pss = elapsed + PSS_EVERY_S
            if not reason:
                if elapsed > limits.timeout_s:
                    reason = f"timeout after {limits.timeout_s:.0f} s"
                elif rss > limits.mem_limit:
                    reason = f"memory guard: RSS {rss / 2**30:.1f} GiB > {limits.mem_limit / 2**30:.1f} GiB"
                elif _meminfo("MemAvailable") < limits.min_free:
                    reason = f"memory guard: machine had < {limits.min_free / 2**30:.1f} GiB available"
                if reason:
                    os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.1)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = usage.ru_maxrss * 1024
    if not reason and proc.returncode != 0:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        reason = f"exit {proc.returncode}: {lines[-1][:160] if lines else ''}"
        if proc.returncode in (-9, 137, -11) or "MemoryError" in (lines[-1] if lines else ""):
            reason = f"killed or out of memory ({reason})"
    return seconds, peak, max(peak_pss, 0), not reason, reason, usage.ru_utime + usage.ru_stime


def profparse_cmd(trace: Path, out: Path) -> list[str]:
    # --no-cache: every run reads the JSON (the cache would make repeats a second look: docs/cache.md)
    cmd = [sys.executable, "-m", "profparse.cli.main", "parse", str(trace), "-o", str(out), "--force", "--quiet"]
    return [*cmd, "--no-cache"]


def hta_cmd(trace: Path, as_limit_gb: float | None, python: str = sys.executable, code: str = HTA_CODE) -> list[str]:
    cmd = [python, "-c", code, str(trace)]
    if as_limit_gb and shutil.which("prlimit"):  # a hard cap on address space, besides the watchdog
        cmd = ["prlimit", f"--as={int(as_limit_gb * 2**30)}", "--", *cmd]
    return cmd


# -- report ---------------------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("profparse", "msgspec", "numpy", "pandas", "pyarrow", "traceinsight", "HolisticTraceAnalysis"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "-"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(_meminfo("MemTotal") / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": versions,
        "date": time.strftime("%Y-%m-%d"),
    }


def _version_in(python: str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


@dataclass
class SizeResult:
    size: str
    bytes: int
    events: int
    runs: int
    tools: dict = field(default_factory=dict)  # tool -> {seconds, all_seconds, peak_rss, peak_pss, ok, reason}
    load: list = field(default_factory=list)  # 1-minute load average before and after the runs
    source: str = ""  # the trace that was tiled


def summarize(size: str, info: dict, runs: list[Run], load: list[float], source: str = "") -> SizeResult:
    res = SizeResult(size=size, bytes=info["bytes"], events=info["events"], runs=0, load=load, source=source)
    for tool in TOOLS:
        mine = [r for r in runs if r.tool == tool]
        if not mine:
            continue
        done = [r for r in mine if r.ok]
        pick = done or mine
        res.tools[tool] = {
            "ok": bool(done),
            "seconds": statistics.median(r.seconds for r in done) if done else None,
            "cpu": statistics.median(r.cpu for r in done) if done else None,
            "all_seconds": [round(r.seconds, 2) for r in mine],
            "peak_rss": max(r.peak_rss for r in pick),
            "peak_pss": max(r.peak_pss for r in pick),
            "reason": "; ".join(sorted({r.reason for r in mine if not r.ok})),
            "finished": f"{len(done)}/{len(mine)}",
        }
        phases = sorted({k for r in done for k in r.phases}, key=lambda k: min(_phase_order(r, k) for r in done))
        if phases:
            res.tools[tool]["phases"] = {
                k: statistics.median(r.phases[k] for r in done if k in r.phases) for k in phases
            }
        res.runs = max(res.runs, len(mine))
    return res


GIB = 2**30


def _phase_order(run: Run, key: str) -> int:
    keys = list(run.phases)
    return keys.index(key) if key in keys else len(keys)


def _fmt_tool(res: SizeResult, tool: str) -> list[str]:
    t = res.tools.get(tool)
    if t is None:
        return ["not run", "", "", "", "", "", ""]
    if not t["ok"]:
        return [f"did not finish ({t['reason']})", "", "", f"{t['peak_rss'] / GIB:.2f} GiB at stop", "", "", ""]
    s = t["seconds"]
    spread = f" ({min(t['all_seconds']):.1f}-{max(t['all_seconds']):.1f})" if len(t["all_seconds"]) > 1 else ""
    cpu = f"; CPU {t['cpu']:.1f}" if t.get("cpu") else ""
    return [
        f"{s:.1f}{spread}{cpu}",
        f"{res.bytes / MB / s:.0f}",
        f"{res.events / s / 1e6:.3f} M",
        f"{t['peak_rss'] / GIB:.2f} GiB",
        f"{t['peak_rss'] / res.bytes:.2f}",
        f"{t['peak_pss'] / GIB:.2f} GiB",
        f"{t['peak_pss'] / res.bytes:.2f}",
    ]


def _json(res: SizeResult) -> str:
    return f"{res.source} {res.bytes / MB:,.0f} MB" if res.source else f"{res.bytes / MB:,.0f} MB"


def _ratio(res: SizeResult, slow: str, fast: str) -> str:
    """``slow``'s median seconds over ``fast``'s, bold, then the same for CPU seconds; '-' if either did not run
    or finish."""
    a, b = res.tools.get(slow), res.tools.get(fast)
    if not (a and b and b["ok"]):
        return "-"
    if not a["ok"]:
        return f"> {max(a['all_seconds']) / b['seconds']:.1f}x (did not finish)"
    cpu = f" (CPU {a['cpu'] / b['cpu']:.1f}x)" if a.get("cpu") and b.get("cpu") else ""
    return f"**{a['seconds'] / b['seconds']:.1f}x**{cpu}"


def _cell(res: SizeResult, tool: str) -> str:
    """A tool's median seconds and peak RSS / JSON, or why there are none."""
    t = res.tools.get(tool)
    if t is None:
        return "not run"
    if not t["ok"]:
        return f"did not finish ({t['reason']})"
    spread = f" ({min(t['all_seconds']):.1f}-{max(t['all_seconds']):.1f})" if len(t["all_seconds"]) > 1 else ""
    return f"{t['seconds']:.1f} s{spread}; {t['peak_rss'] / res.bytes:.2f}x"


def side_by_side(results: list[SizeResult]) -> str:
    """Per trace, in one row: each tool's seconds (median, min-max) and peak RSS over the JSON's size, then the
    ratios that the goals are stated in."""
    head = [
        "trace",
        "JSON MB",
        "events",
        "profparse parse: s; RSS/JSON",
        "decode only",
        "HTA 0.5 load",
        "HTA 0.6 load",
        "profparse / decode",
        "HTA 0.5 / profparse",
        "HTA 0.6 / profparse",
        "runs",
        "load avg (before, after)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in sorted(results, key=lambda r: (r.source, r.bytes)):
        cells = [
            res.source or res.size,
            f"{res.bytes / MB:,.0f}",
            f"{res.events / 1e6:.2f} M" if res.events else "-",
            *(_cell(res, tool) for tool in ("profparse", "decode", "hta", "hta06")),
            _ratio(res, "profparse", "decode"),
            _ratio(res, "hta", "profparse"),
            _ratio(res, "hta06", "profparse"),
            str(res.runs),
            ", ".join(f"{x:.1f}" for x in res.load),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(results: list[SizeResult]) -> str:
    head = [
        "JSON",
        "events",
        "tool",
        "seconds, median (min-max); CPU s",
        "MB/s",
        "events/s",
        "peak RSS",
        "RSS / JSON",
        "peak PSS, all processes",
        "PSS / JSON",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = [
        "| JSON | HTA 0.5 / profparse | HTA 0.6 / profparse | profparse / decode only | HTA 0.5 / floor "
        "| HTA 0.6 / floor | profparse / floor | runs finished | load avg (before, after) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in sorted(results, key=lambda r: (r.source, r.bytes)):
        for tool in TOOLS:
            if tool not in res.tools:
                continue
            row = [_json(res), f"{res.events / 1e6:.2f} M", LABELS[tool]] + _fmt_tool(res, tool)
            lines.append("| " + " | ".join(row) + " |")
        fin = ", ".join(f"{k} {v['finished']}" for k, v in res.tools.items())
        load = ", ".join(f"{x:.1f}" for x in res.load)
        ratios.append(
            f"| {_json(res)} | {_ratio(res, 'hta', 'profparse')} | {_ratio(res, 'hta06', 'profparse')} "
            f"| {_ratio(res, 'profparse', 'decode')} | {_ratio(res, 'hta', 'floor')} | {_ratio(res, 'hta06', 'floor')} "
            f"| {_ratio(res, 'profparse', 'floor')} | {fin} | {load} |"
        )
    return "\n".join(lines) + "\n\n" + "\n".join(ratios)


PHASES = ("startup+imports", "read", "link", "attribute", "tables+parquet")


def phase_table(results: list[SizeResult]) -> str:
    """profparse's per-phase seconds, wall (CPU), medians of the runs, next to the decode-only time."""
    rows = []
    for res in sorted(results, key=lambda r: r.bytes):
        p = res.tools.get("profparse")
        if not p or not p.get("phases"):
            continue
        ph = p["phases"]
        cells = [
            f"{ph[k]:.2f} ({ph.get(k + ' cpu', 0):.2f}); {ph.get(k + ' peak MB', 0):.0f} MB" if k in ph else "-"
            for k in PHASES
        ]
        threads = f"{ph.get('tables', 0):.2f} / {ph.get('parquet', 0):.2f}"
        d = res.tools.get("decode")
        decode = f"{d['seconds']:.2f} ({d.get('cpu') or 0:.2f})" if d and d["ok"] else "-"
        total = f"{p['seconds']:.2f} ({p.get('cpu') or 0:.2f})"
        rows.append(f"| {_json(res)} | {total} | " + " | ".join(cells) + f" | {threads} | {decode} |")
    if not rows:
        return ""
    head = "| JSON | profparse end to end | " + " | ".join(PHASES) + " | tables / parquet (thread sums) | decode only |"
    return head + "\n|" + "---|" * (len(PHASES) + 4) + "\n" + "\n".join(rows)


def scaling(results: list[SizeResult]) -> str:
    """How profparse's time and memory grow with the trace: per event and per byte of JSON."""
    rows = ["| JSON | events | µs per event | peak RSS bytes per event | peak RSS / JSON |", "|---|---|---|---|---|"]
    for res in sorted(results, key=lambda r: r.bytes):
        p = res.tools.get("profparse")
        if not p or not p["ok"] or not res.events:
            continue
        rows.append(
            f"| {_json(res)} | {res.events / 1e6:.2f} M | {p['seconds'] / res.events * 1e6:.2f} | "
            f"{p['peak_rss'] / res.events:.0f} | {p['peak_rss'] / res.bytes:.2f} |"
        )
    return "\n".join(rows)


def machine_text(m: dict) -> str:
    v = ", ".join(f"{k} {val}" for k, val in m["versions"].items())
    return (
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['os']}; Python {m['python']}; {v}. "
        f"Measured {m['date']}."
    )


def write_docs(results: list[SizeResult], m: dict, source: str) -> None:
    """Put the results between the bench markers of docs/performance.md, merged with sizes measured before."""
    text = DOCS.read_text() if DOCS.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    found = DATA.search(text)
    stored = json.loads(found.group(1)) if found else {"results": {}}
    for res in results:
        stored["results"][f"{res.source} {res.size}"] = {**asdict(res), "machine": m}
    merged = [
        SizeResult(**{k: v for k, v in r.items() if k != "machine"} | {"source": r.get("source", "").split(".")[0]})
        for r in stored["results"].values()
    ]
    machines = {machine_text(r["machine"]) for r in stored["results"].values()}
    sources = sorted({r.get("source", "") for r in stored["results"].values()})
    block = "\n".join(
        [
            BEGIN,
            "",
            f"Generated by `scripts/bench.py --write-docs`; source trace tiled: {', '.join(sources)}. Seconds: median "
            "of the finished runs, wall clock from spawn to exit. Peak RSS: largest process (`wait4`, as "
            "`/usr/bin/time -v`). Peak PSS: sampled sum over the process and its children (forked decoding workers "
            "included, shared pages counted once). MB = 10^6 bytes, GiB = 2^30 bytes.",
            "",
            side_by_side(merged),
            "",
            table(merged),
            "",
            "profparse per event, by size:",
            "",
            scaling(merged),
            "",
            "profparse per phase: seconds wall (CPU); peak RSS of the main process at the phase's end; medians "
            "(`PROFPARSE_PROFILE_PHASES=1`; startup+imports is process creation to the start of reading; CPU "
            "includes the decoding workers; tables and parquet are summed over the two writing threads):",
            "",
            phase_table(merged),
            "",
            *sorted(machines),
            "",
            f"<!-- bench:data {json.dumps(stored)} -->",
            END,
        ]
    )
    start, end = text.index(BEGIN), text.index(END) + len(END)
    DOCS.write_text(text[:start] + block + text[end:])
    print(f"wrote {DOCS}", file=sys.stderr)


# -- main -----------------------------------------------------------------------------------------------------


def warm_page_cache(trace: Path) -> None:
    """Read the trace once before the runs, so that no tool pays for reading it from disk: the first tool to
    touch a file that had left the page cache read it at disk speed (profparse's read phase took twice as
    long)."""
    with trace.open("rb") as f:
        while f.read(16 << 20):
            pass


def ensure_bytecode() -> None:
    """Compile profparse's modules to bytecode before timing it, as ``pip install`` does for any installed package
    (HTA's included): an editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` otherwise compiles every module from
    source in each run (a few tenths of a second of start-up), which no installed user pays."""
    import importlib.util

    spec = importlib.util.find_spec("profparse")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        subprocess.run([sys.executable, "-m", "compileall", "-q", folder], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--trace", "--source", dest="source", type=Path, default=DEFAULT_SOURCE, help="real Kineto trace to tile"
    )
    ap.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size("100MB")], help="e.g. 100MB 500MB 2GB")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool and size, alternating (default 3)")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/bench"), help="where traces and outputs go")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a profparse run is killed")
    ap.add_argument("--hta-timeout", type=float, default=1800, help="seconds before an HTA run is killed")
    ap.add_argument("--mem-limit-gb", type=float, default=20, help="kill a run whose process tree passes this RSS")
    ap.add_argument("--hta-as-gb", type=float, default=20, help="address-space cap for HTA via prlimit (0: none)")
    ap.add_argument("--min-free-gb", type=float, default=1.0, help="kill a run when the machine has less available")
    ap.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS), help="default: all five")
    ap.add_argument(
        "--traces", nargs="+", type=Path, metavar="JSON", help="measure these trace files as they are (no tiling)"
    )
    ap.add_argument(
        "--hta-python",
        default=sys.executable,
        help="python with HolisticTraceAnalysis 0.5 (HTA 0.5); skipped if it has no such package (default: this one)",
    )
    ap.add_argument(
        "--hta06-python",
        default=sys.executable,
        help="python with traceinsight 0.6 (HTA 0.6); skipped if it has no such package (default: this one)",
    )
    ap.add_argument("--skip-hta-after-fail", action="store_true", help="no more HTA runs at a size once one failed")
    ap.add_argument("--generate-only", action="store_true", help="only write the traces")
    ap.add_argument("--clean", action="store_true", help="delete each generated trace after its runs")
    ap.add_argument("--write-docs", action="store_true", help=f"put the results into {DOCS.relative_to(REPO)}")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument(
        "--docs-from", nargs="+", type=Path, metavar="JSON", help="put earlier --json results into the docs"
    )
    args = ap.parse_args(argv)
    if args.docs_from:
        for path in args.docs_from:
            saved = json.loads(path.read_text())
            results = [SizeResult(**r) for r in saved["results"]]
            write_docs(results, saved["machine"], results[0].source if results else "")
        return 0

    args.work_dir.mkdir(parents=True, exist_ok=True)
    mine = Limits(args.timeout, int(args.mem_limit_gb * GIB), int(args.min_free_gb * GIB))
    peer = Limits(args.hta_timeout, int(args.mem_limit_gb * GIB), int(args.min_free_gb * GIB))
    limits = {"profparse": mine, "decode": mine, "floor": mine, "hta": peer, "hta06": peer}
    pythons = {"hta": args.hta_python, "hta06": args.hta06_python}
    for tool, (package, version) in HTA_PACKAGES.items():
        if tool in args.tools and not _version_in(pythons[tool], package).startswith(version):
            print(f"{pythons[tool]} has no {package} {version}: {LABELS[tool]} skipped", file=sys.stderr)
            args.tools = [t for t in args.tools if t != tool]
    if "profparse" in args.tools and not args.generate_only:
        ensure_bytecode()
    cache: dict = {}
    results: list[SizeResult] = []
    todo = [(None, t) for t in args.sizes] if not args.traces else [(t, 0) for t in args.traces]
    for ready, target in todo:
        if ready is not None:
            trace, info = ready, {"bytes": ready.stat().st_size, "events": 0}
            label, source = size_label(info["bytes"]), ready.name.split(".")[0]
        else:
            label, source = size_label(target), args.source.name.split(".")[0]
            trace, info = ensure_trace(args.source, target, args.work_dir, cache, in_child=not args.generate_only)
        if args.generate_only:
            continue
        warm_page_cache(trace)
        runs: list[Run] = []
        hta_failed: set[str] = set()
        load = [os.getloadavg()[0]]
        for k in range(args.runs):
            for tool in args.tools:
                if tool in hta_failed and args.skip_hta_after_fail:
                    continue
                out = args.work_dir / f"out_{label}"
                env = None
                if tool == "profparse":
                    cmd, env = profparse_cmd(trace, out), {"PROFPARSE_PROFILE_PHASES": "1"}
                elif tool == "hta":
                    cmd = hta_cmd(trace, args.hta_as_gb, args.hta_python)
                elif tool == "hta06":
                    cmd = hta_cmd(trace, args.hta_as_gb, args.hta06_python, HTA06_CODE)
                elif tool == "floor":
                    cmd = [sys.executable, "-c", FLOOR_CODE, str(trace)]
                else:
                    cmd = [sys.executable, "-c", DECODE_CODE, str(trace)]
                log = args.work_dir / f"{tool}_{label}_{k}.log"
                seconds, peak, pss, ok, reason, cpu = measure(cmd, limits[tool], log, env)
                phases = {}
                counted = EVENTS.search(log.read_text(errors="replace")) if tool == "decode" and ok else None
                if counted and not info["events"]:  # a ready trace: its events, as the decode counted them
                    info["events"] = int(counted.group(1))
                for m in PHASE.finditer(log.read_text(errors="replace")):
                    phases[m.group(1)] = float(m.group(2))
                    if m.group(3):
                        phases[m.group(1) + " cpu"] = float(m.group(3))
                    if m.group(4):
                        phases[m.group(1) + " peak MB"] = float(m.group(4))
                runs.append(Run(tool, label, k, seconds, peak, pss, ok, reason, phases, cpu))
                if tool.startswith("hta") and not ok:
                    hta_failed.add(tool)
                status = "ok" if ok else f"did not finish ({reason})"
                print(
                    f"{label} run {k + 1}/{args.runs} {tool:9s} {seconds:7.2f} s (cpu {cpu:6.2f} s)"
                    f"  {info['bytes'] / MB / seconds:6.0f} MB/s  peak RSS {peak / GIB:5.2f} GiB"
                    f"  PSS {pss / GIB:5.2f} GiB  {status}",
                    file=sys.stderr,
                    flush=True,
                )
            shutil.rmtree(args.work_dir / f"out_{label}", ignore_errors=True)
        load.append(os.getloadavg()[0])
        results.append(summarize(label, info, runs, load, source))
        if args.clean:
            trace.unlink(missing_ok=True)
            trace.with_suffix(".meta.json").unlink(missing_ok=True)
    if args.generate_only:
        return 0
    m = machine()
    for tool, (package, _) in HTA_PACKAGES.items():
        if tool in args.tools:
            m["versions"][package] = _version_in(pythons[tool], package)
    print(side_by_side(results))
    print()
    print(table(results))
    print()
    print(scaling(results))
    print()
    print(phase_table(results))
    print()
    print(machine_text(m))
    if args.json:
        args.json.write_text(json.dumps({"machine": m, "results": [asdict(r) for r in results]}, indent=1))
    if args.write_docs:
        write_docs(results, m, args.source.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
