"""The report's headline: the few numbers a reader needs first, each linking to the section that explains it.

Every number comes from :func:`profparse.outputs.summary.summary_data` (``summarize --format json``) or from
``ranks_summary_data``: the headline only picks and words them, so it can never disagree with the sections below.
Each item is ``{key, label, text, detail, href}`` plus ``value`` (the raw number, for tests and tooltips). The last
item is the top finding (``findings``, what to change first) when the trace has one, else the top warning.
Where the trace has warm-up steps (the ``steps`` table's ``steady`` column) and steady ones, the step time, the
biggest stage, GPU idle and the top finding are about the steady steps, each saying so, and the step time's
detail shows the warm-up apart ("step 1: warm-up, 2.0 s"; GPU idle's detail: its idle share).
"""

from __future__ import annotations

import statistics
import textwrap
from typing import Any

from profparse.base.formats import count_text, share_text, utilisation_text
from profparse.outputs.views._common import fmt_time

#: Most severe first: the headline shows the first warning of the most severe kind.
SEVERITY_ORDER = ("error", "warning", "info")
#: The top finding's fix is cut to this many characters in the headline (the Findings section shows it whole).
FIX_CHARS = 110


def _item(key: str, label: str, text: str, detail: str, href: str, value: Any = None, **extra: Any) -> dict:
    return {"key": key, "label": label, "text": text, "detail": detail, "href": href, "value": value, **extra}


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def warm_up_steps(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The warm-up steps (``steady`` false) of a trace that also has steady ones: the headline leaves them out."""
    steps = summary["step_totals"]
    warm = [s for s in steps if not s.get("steady", True)]
    return warm if len(warm) < len(steps) and summary.get("steady_totals") else []


def _scope(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The per-stage totals the headline reads and the words that say which: the steady steps' where the trace has
    warm-up steps to leave out, else the whole trace's."""
    if warm_up_steps(summary):
        steady = sum(1 for s in summary["step_totals"] if s.get("steady", True))
        return summary["steady_totals"], f"in the {count_text(steady, 'steady step')}"
    return summary["totals"], ""


def step_time(summary: dict[str, Any]) -> dict[str, Any]:
    """The median step window (the span from a step's start to its end) of the steady steps, with the fastest and
    slowest of them."""
    warm = warm_up_steps(summary)
    windows = [s["window_ns"] for s in summary["step_totals"] if not warm or s.get("steady", True)]
    if not windows:
        return _item("step_time", "Step time", "no steps", "no ProfilerStep# or step marks in this trace", "#overview")
    median = statistics.median(windows)
    kind = "steady steps" if warm else "steps"
    spread = f" ({fmt_time(min(windows))} to {fmt_time(max(windows))})" if min(windows) < max(windows) else ""
    detail = f"median of {len(windows)} {kind}{spread}" if len(windows) > 1 else f"1 {kind[:-1]}"
    if warm:  # shown apart, in the same box: a seventh box would push the sections below the first screen
        detail += f"; {warm_up_text(summary)}"
    replayed = (summary.get("without_profiler") or {}).get("step_ns")
    return _item("step_time", "Step time", fmt_time(median), without_profiler(summary) + detail, "#per-step", median,
                 warm_up=[s["step"] for s in warm], without_profiler_ns=replayed)  # fmt: skip


def warm_up_text(summary: dict[str, Any]) -> str:
    """The warm-up steps the headline leaves out, in words ("step 1: warm-up, 2.0 s"); "" without any."""
    warm = warm_up_steps(summary)
    if not warm:
        return ""
    total = sum(s["window_ns"] for s in warm)
    took = f"{total / 1e9:.1f} s" if total >= 1e9 else fmt_time(total)  # fmt_time keeps ms up to 99,999 ms
    return f"step{'s' if len(warm) > 1 else ''} {', '.join(str(s['step']) for s in warm)}: warm-up, {took}"


def _warm_up_idle(summary: dict[str, Any]) -> str:
    """GPU idle in the warm-up steps, for the GPU idle item's detail ("" without warm-up or GPU spans)."""
    numbers = {s["step"] for s in warm_up_steps(summary)}
    rows = [r for r in summary.get("per_step") or [] if r["step"] in numbers]
    idle = sum(r["gpu_idle_ns"] or 0 for r in rows)
    span = idle + sum((r["gpu_busy_ns"] or 0) + (r["gpu_overlap_ns"] or 0) for r in rows)
    return f"; warm-up {_share(idle, span)} idle" if span else ""


def without_profiler(summary: dict[str, Any]) -> str:
    """The step time's first words: the mean steady step replayed without the profiler's own cost
    (docs/without_profiler.md), with what the estimate rests on; "" when no step could be replayed."""
    data = summary.get("without_profiler") or {}
    if not data:
        return ""
    basis = "calibrated at capture" if data["basis"] == "calibrated" else "uncalibrated"
    cost = fmt_time(data["overhead_ns_per_step"])
    return f"~{fmt_time(data['step_ns'])} without the profiler: its own cost ~{cost}/step, {basis}; "


def biggest_stage(summary: dict[str, Any]) -> dict[str, Any]:
    """The stage with the most host wall time (in the steady steps where the trace has warm-up steps), its share of
    all stages and, with a GPU, its GPU busy time."""
    rows, scope = _scope(summary)
    totals = [t for t in rows if t["host_wall_ns"]]
    if not totals:
        return _item("biggest_stage", "Biggest stage", "-", "no host time in any stage", "#overview")
    top = max(totals, key=lambda t: t["host_wall_ns"])
    detail = f"{fmt_time(top['host_wall_ns'])} host wall, {top['share']:.1%} of all stages"
    if summary["gpu_activity_ns"] > 0:
        detail += f"; GPU busy {fmt_time(top['gpu_busy_ns'] or 0)}"
    detail += f" {scope}" if scope else ""
    return _item("biggest_stage", "Biggest stage", top["stage"], detail, "#overview", top["host_wall_ns"],
                 stage=top["stage"])  # fmt: skip


def gpu_idle(summary: dict[str, Any]) -> dict[str, Any]:
    """GPU idle as a share of the stages' GPU spans (busy + overlap + idle, the overview's additive split), in the
    steady steps where the trace has warm-up steps."""
    if summary["gpu_activity_ns"] <= 0:
        return _item("gpu_idle", "GPU idle", "no GPU", "no GPU activity in this trace", "#view-stages")
    rows, scope = _scope(summary)
    idle = sum(t["gpu_idle_ns"] or 0 for t in rows)
    busy = sum((t["gpu_busy_ns"] or 0) + (t["gpu_overlap_ns"] or 0) for t in rows)
    span = idle + busy
    detail = f"{fmt_time(idle)} idle, {fmt_time(busy)} busy in all stages' GPU spans {scope or 'of the trace'}"
    detail += _warm_up_idle(summary) if scope else ""
    return _item("gpu_idle", "GPU idle", _share(idle, span), detail, "#view-stages", idle / span if span else None)


def exposed_communication(summary: dict[str, Any]) -> dict[str, Any]:
    """Collective kernel time that no other GPU work overlaps, against all collective time and the steps' time
    (the steady steps' where the trace has warm-up steps)."""
    section = summary.get("communication") or {}
    _, scope = _scope(summary)
    exposure = (section.get("steady_exposure") if scope else section.get("exposure")) or []
    comm = sum(r["comm_ns"] or 0 for r in exposure)
    if not comm:
        none = "no NCCL/RCCL collective kernels" + (f" {scope}" if scope else "")
        return _item("exposed_comm", "Exposed communication", "none", none, "#view-communication", 0)
    exposed = sum(r["exposed_ns"] or 0 for r in exposure)
    detail = f"{_share(exposed, comm)} of {fmt_time(comm)} collective time is not overlapped"
    steps = sum(s["window_ns"] for s in summary["step_totals"] if not scope or s.get("steady", True))
    if steps:
        detail += f"; {_share(exposed, steps)} of the {'steady ' if scope else ''}steps' time"
    return _item("exposed_comm", "Exposed communication", fmt_time(exposed), detail, "#view-communication", exposed)


def mfu(summary: dict[str, Any]) -> dict[str, Any]:
    """MFU of each stage with counted FLOPs, and the peak (and basis, where the summary gives one) it divides by."""
    section = summary.get("efficiency") or {}
    if not section:
        return _item("mfu", "MFU", "-", "no FLOPs counted (capture with record_shapes=True)", "#efficiency")
    known = [s for s in section["stages"] if s["mfu"] is not None and s["flops"] > 0]
    note = section["peak"]["note"]
    if not known:
        return _item("mfu", "MFU", "no MFU", note, "#efficiency")
    text = ", ".join(f"{s['stage']} {utilisation_text(s['mfu'])}" for s in known)
    modes = [f"{s['stage']} {s['math_mode']}" for s in known if s.get("math_mode")]
    basis = section["peak"].get("basis")
    detail = "; ".join(x for x in (f"peak by math mode: {', '.join(modes)}" if modes else "", basis or "", note) if x)
    return _item("mfu", "MFU per stage", text, detail, "#efficiency", {s["stage"]: s["mfu"] for s in known})


def top_warning(warnings: list[dict[str, Any]]) -> dict[str, Any]:
    """The first check of the most severe kind that fired, and how many fired in all."""
    if not warnings:
        return _item("top_warning", "Top warning", "none", "no check fired", "#checks")
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    first = min(warnings, key=lambda w: rank.get(w["severity"], len(rank)))
    more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
    return _item("top_warning", "Top warning", f"{first['severity']}: {first['check']}", first["message"] + more,
                 "#checks", first["severity"])  # fmt: skip


def top_finding(findings: list[dict[str, Any]], steady: bool = False) -> dict[str, Any]:
    """The finding that saves the most per step (the summary lists them biggest first): its kind, stage, saving
    and share of a step (a steady step where ``steady``: the detectors count steady steps only), and its fix
    shortened; how many more there are."""
    first = findings[0]
    per = "steady step" if steady else "step"
    text = (
        f"{first['kind']} · {first['stage']}: saves {fmt_time(first['saving_ns_per_step'])}/{per} "
        f"({share_text(first['saving_share'])})"
    )
    fix = textwrap.shorten(str(first["fix"]), FIX_CHARS, placeholder=" …")
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return _item("top_finding", "Top finding", text, fix + more, "#findings", first["saving_ns_per_step"],
                 kind=first["kind"], stage=first["stage"].split(",")[0])  # fmt: skip


def what_to_change(summary: dict[str, Any]) -> dict[str, Any]:
    """The headline's last item: the top finding where the trace has one (what to change first), else the top
    warning, as before findings existed."""
    findings = summary.get("findings") or []
    return top_finding(findings, bool(warm_up_steps(summary))) if findings else top_warning(summary["warnings"])


def trace_headline(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace page's headline, in reading order."""
    return [
        step_time(summary),  # with the step without the profiler: a seventh box would wrap the headline
        biggest_stage(summary),
        gpu_idle(summary),
        exposed_communication(summary),
        mfu(summary),
        what_to_change(summary),
    ]


def ranks_headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The ranks page's headline: ranks parsed, the widest straggler, the late rank, failed ranks."""
    ok = [r for r in data["ranks"] if r["status"] == "ok"]
    failed = len(data["ranks"]) - len(ok)
    out = [_item("ranks", "Ranks", f"{len(ok)} parsed", f"{failed} failed" if failed else "none failed",
                 "#failed" if failed else "#heatmap", len(ok))]  # fmt: skip
    leads = [r for r in data["stragglers"] if r.get("lead_ns")]
    if leads:
        top = max(leads, key=lambda r: r["lead_ns"])
        detail = f"{top['stage']}: {fmt_time(top['lead_ns'])} over the median rank ({fmt_time(top['median_ns'])})"
        out.append(_item("straggler", "Slowest rank", f"rank {top['slowest_rank']}", detail, "#stragglers",
                         top["lead_ns"], stage=top["stage"]))  # fmt: skip
    else:
        out.append(_item("straggler", "Slowest rank", "none", "all ranks take the same time", "#stragglers"))
    out.append(_late_rank(data.get("late_ranks")))
    return out


def _late_rank(late: dict[str, Any] | None) -> dict[str, Any]:
    if not late or not late.get("available"):
        return _item("late_rank", "Late rank", "-", "not in this dataset (written before collectives were matched)",
                     "#late-ranks")  # fmt: skip
    stages = [s for s in late.get("stages") or [] if s["late_rank"] is not None]
    if not stages:
        why = "no rank arrived late" if late.get("collectives") else "no collective matched across ranks"
        return _item("late_rank", "Late rank", "none", why, "#late-ranks")
    top = max(stages, key=lambda s: s["waiting_ns"] or 0)
    delay, waited = fmt_time(top["mean_delay_ns"]), fmt_time(top["waiting_ns"])
    detail = f"{top['stage']}: last in {top['times_last']} of {top['collectives']} collectives, {delay} late on average"
    detail += f"; others waited {waited}"
    return _item("late_rank", "Late rank", f"rank {top['late_rank']}", detail, "#late-ranks", top["late_rank"],
                 stage=top["stage"])  # fmt: skip
