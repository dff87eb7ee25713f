"""The findings table itself: its vocabulary is documented kind by kind, steps round-trip through their text,
and on every sample and shared trace the findings are sane (savings within the step, sorted, known kinds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tracebuilder import TraceBuilder, backward_node, forward_op, training_step

import profparse
from profparse.analysis import advice
from profparse.analysis.advice import COLUMNS, KINDS, Finding, detectors, kinds
from profparse.analysis.advice.finding import frame, parse_steps, steps_text

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"


def test_every_kind_has_a_paragraph_in_the_docs_and_no_other() -> None:
    doc = (REPO / "docs" / "advice.md").read_text()
    documented = re.findall(r"^### ([a-z0-9_]+)$", doc, flags=re.M)
    assert sorted(documented) == sorted(KINDS)


def test_every_single_trace_kind_has_its_detector_in_kinds_order() -> None:
    found = detectors.registered()
    assert [f.__name__ for f in found] == [k.name for k in KINDS.values() if not k.across_ranks]
    assert KINDS["late_rank"].detector is None  # found across ranks, by profparse.ranks.advice


def test_a_detector_must_be_named_as_a_kind(monkeypatch) -> None:
    monkeypatch.setattr(kinds, "_DETECTORS", dict(kinds._DETECTORS))
    with pytest.raises(ValueError, match="faster_please"):

        @kinds.detector
        def faster_please(ctx):
            return []

    with pytest.raises(ValueError, match="late_rank"):

        @kinds.detector
        def late_rank(ctx):
            return []


def test_a_new_kind_is_one_entry_plus_its_detector(tmp_path: Path, monkeypatch) -> None:
    """Nothing else to edit: the kind's entry and its marked function make ``findings`` run it and list it."""
    monkeypatch.setattr(kinds, "_DETECTORS", dict(kinds._DETECTORS))
    monkeypatch.setitem(KINDS, "slow_everything", kinds.Kind("slow_everything", "all of it", "make it faster"))

    @kinds.detector
    def slow_everything(ctx) -> list[Finding]:
        steps = [int(s) for s in ctx.steps["step"]]
        return [Finding("slow_everything", "forward", steps, 0.5 * ctx.step_ns, ctx.step_ns, "low", "planted")]

    assert detectors.registered()[-1] is slow_everything
    b = TraceBuilder()
    t = 0.0
    for step in range(4):
        t = training_step(b, step, t) + 10.0
    table = advice.findings(profparse.load(b.write(tmp_path / "t.json.gz"), cache=False))
    row = table[table["kind"] == "slow_everything"]
    assert len(row) == 1 and row["fix"].iloc[0] == "make it faster" and row["saving_share"].iloc[0] == 0.5


@pytest.mark.parametrize("steps", [[1], [1, 2, 3, 5], [2, 4, 6], [1, 2, 3, 4, 7, 8], [10, 11, 12, 100]])
def test_steps_round_trip(steps: list[int]) -> None:
    assert parse_steps(steps_text(steps)) == steps


def test_steps_text_is_compact() -> None:
    assert steps_text([5, 1, 2, 3]) == "1-3,5"


def test_unknown_kind_or_confidence_is_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        Finding("faster_please", "forward", [1], 1.0, 10.0, "high", "x")
    with pytest.raises(ValueError, match="confidence"):
        Finding("data_loading", "other", [1], 1.0, 10.0, "sure", "x")


def test_frame_sorts_by_saving_and_fills_the_fix() -> None:
    small = Finding("between_steps", "other", [1, 2], 1e6, 1e8, "medium", "small")
    big = Finding("data_loading", "other", [1, 2], 5e6, 1e8, "high", "big", {"top_events": []})
    table = frame([small, big])
    assert list(table.columns) == list(COLUMNS)
    assert table["kind"].tolist() == ["data_loading", "between_steps"]
    assert table["saving_share"].tolist() == [0.05, 0.01]
    assert table["fix"].tolist() == [KINDS["data_loading"].fix, KINDS["between_steps"].fix]
    assert json.loads(table["evidence"].iloc[0]) == {"top_events": []}


def _traces() -> list[Path]:
    found = sorted((REPO / "sample_traces").rglob("*.json.gz"))
    if SHARED.is_dir():
        found += sorted(SHARED.glob("*.json.gz")) + sorted((SHARED / "critical_path").glob("*.json.gz"))
    return found


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_findings_are_sane_on_real_traces(trace: Path) -> None:
    """Known kinds, each saving positive and at most its step, biggest first; the savings of findings about
    different work add up to at most the step (each counts only path time of its own events)."""
    parsed = profparse.load(trace, cache=False)
    table = parsed.findings
    assert set(table["kind"]) <= set(KINDS)
    assert (table["saving_ns_per_step"] > 0).all()
    assert (table["saving_share"] <= 1.0).all()
    assert table["saving_ns_per_step"].is_monotonic_decreasing
    assert table["saving_share"].sum() <= 1.0 + 1e-9
    for row in table.itertuples():
        assert set(parse_steps(row.steps)) <= set(parsed.steps["step"])
        assert row.step_count == len(parse_steps(row.steps))
        assert isinstance(json.loads(row.evidence), dict)


def _loader_steps(tmp_path: Path, wait_us: float, single: bool = False, step_us: float = 50_000) -> Path:
    """Four CPU training steps of ``step_us``, each starting with ``wait_us`` in a DataLoader's ``__next__``."""
    loader = "_SingleProcessDataLoaderIter" if single else "_MultiProcessingDataLoaderIter"
    b = TraceBuilder()
    for step in range(4):
        t0 = step * step_us
        b.annotation(f"ProfilerStep#{step}", t0, step_us)
        b.annotation(f"enumerate(DataLoader)#{loader}.__next__", t0 + 1, wait_us)
        work = (step_us - wait_us - 10) / 3
        t = t0 + 2 + wait_us
        b.py("nn.Module: Linear_0", t, work)
        forward_op(b, "aten::linear", t + 1, work - 2, seq=step)
        backward_node(b, "AddmmBackward0", t + work + 1, work - 2, seq=step)
        b.annotation("Optimizer.step#AdamW.step", t + 2 * work + 2, work - 2)
        b.op("aten::_fused_adamw_", t + 2 * work + 3, work - 4)
    return b.write(tmp_path / f"loader_{wait_us}_{single}.json")


@pytest.mark.parametrize(
    ("wait_us", "single", "fires"),
    [
        (6_000, False, False),  # 12% of a 50 ms step, under 10 ms: the batch's hand-over from a worker
        (15_000, False, True),  # the workers do not keep up
        (3_000, True, True),  # in the main process every wait is the loader's own work
    ],
)
def test_a_worker_loaders_hand_over_is_not_a_finding(tmp_path: Path, wait_us: float, single: bool, fires: bool) -> None:
    found = profparse.load(_loader_steps(tmp_path, wait_us, single), cache=False).findings
    found = found[found["kind"] == "data_loading"]
    assert len(found) == int(fires), found
    if fires:
        assert found["saving_ns_per_step"].iloc[0] == pytest.approx(wait_us * 1e3, rel=0.01)


def test_the_worker_wait_threshold() -> None:
    from profparse.analysis.advice.host import worker_wait_threshold_ns

    assert worker_wait_threshold_ns(50e6) == 10e6  # 10 ms, above 5% of the step
    assert worker_wait_threshold_ns(20e6) == 5e6  # a quarter of a short step
    assert worker_wait_threshold_ns(1e9) == 50e6  # 5% of a long step


def _gap_steps(tmp_path: Path, gaps_us: list[float], work_us: float = 48_000) -> Path:
    """CPU training steps of ``work_us`` of forward, backward and optimizer, each followed inside its
    ``ProfilerStep`` by ``gaps_us[i]`` of untraced time (the loop's own code, or a stall)."""
    b = TraceBuilder()
    t0 = 0.0
    for step, gap in enumerate(gaps_us):
        b.annotation(f"ProfilerStep#{step}", t0, work_us + gap)
        part = (work_us - 10) / 3
        t = t0 + 2
        b.py("nn.Module: Linear_0", t, part)
        forward_op(b, "aten::linear", t + 1, part - 2, seq=step)
        backward_node(b, "AddmmBackward0", t + part + 1, part - 2, seq=step)
        b.annotation("Optimizer.step#AdamW.step", t + 2 * part + 2, part - 2)
        b.op("aten::_fused_adamw_", t + 2 * part + 3, part - 4)
        t0 += work_us + gap
    return b.write(tmp_path / f"gaps_{'_'.join(str(int(g)) for g in gaps_us)}.json")


@pytest.mark.parametrize(
    ("gaps_us", "fires"),
    [
        # one stalled step (a GC pause, a preempted process) lifts the mean to 7.7% of the step, over the kind's 6%:
        # the median step's 1 ms (2%) is what the loop's code takes
        ([1_000, 1_000, 1_000, 13_000, 1_000], False),
        ([5_000, 5_000, 5_000, 5_000, 5_000], True),  # the loop's own work in every step: ~10% of the step
        ([9_000, 9_000, 1_000, 9_000, 9_000], True),  # in most steps
    ],
)
def test_between_steps_lists_what_the_typical_step_holds(tmp_path: Path, gaps_us: list[float], fires: bool) -> None:
    found = profparse.load(_gap_steps(tmp_path, gaps_us), cache=False).findings
    found = found[found["kind"] == "between_steps"]
    assert len(found) == int(fires), found
    if fires:  # the saving is the mean of the steady steps' gaps (the untraced time is all on the path)
        parsed = profparse.load(_gap_steps(tmp_path, gaps_us), cache=False)
        steady = parsed.steps[parsed.steps["steady"]]["step"].to_numpy()
        mean_gap_ns = float(np.mean([gaps_us[s] for s in steady])) * 1e3
        assert found["saving_ns_per_step"].iloc[0] == pytest.approx(mean_gap_ns, rel=0.05)


def test_a_writer_makes_each_table_and_value_once_and_holds_what_is_read_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writing every table with ``release``: nothing is computed twice (what a later table reads is held until
    then), and what a made table was made from is not held for that table's later readers (the FLOP counts are
    given back once the flops table is made: the findings read the table, not the counts)."""
    from profparse.outputs.parquet import table_makers
    from profparse.tables import registry

    trace = REPO / "sample_traces" / "gpu" / "a100_ddp_rank0_nccl.json.gz"
    parsed = profparse.parse(trace)
    made: list[str] = []
    held_when: dict[str, set[str]] = {}
    resolve = registry.resolve
    by_path = {spec.compute: name for name, spec in {**registry.TABLES, **registry.VALUES}.items()}

    def counted(path: str):
        function = resolve(path)

        def run(**kwargs):
            name = by_path[path]
            made.append(name)
            held_when[name] = parsed.computed()
            return function(**kwargs)

        return run

    monkeypatch.setattr(registry, "resolve", counted)
    for make in table_makers(parsed, release=True).values():
        make()
    repeated = {name for name in made if made.count(name) > 1}
    assert not repeated, repeated
    assert {"flops", "flop_counts", "findings", "critical_path"} <= set(made)
    assert "flops" in held_when["findings"] and "flop_counts" not in held_when["findings"]


def test_what_if_host_time_is_kept_as_its_union() -> None:
    """A what-if's host intervals are kept as their union (sorted, disjoint, touching ones joined): the same time
    covered on a 1 ns grid, in or out of order, with empty and reversed intervals."""
    from profparse.analysis.advice.finding import WhatIf
    from profparse.base.intervals import union_pieces

    rng = np.random.default_rng(3)
    starts = rng.integers(0, 500, 200)
    intervals = np.stack([starts, starts + rng.integers(-5, 30, 200)], axis=1)
    intervals[:10, 1] = intervals[10:20, 0]  # touching
    grid = np.zeros(600, dtype=bool)
    for start, end in intervals:
        grid[start:end] = True
    for given in (intervals, intervals[np.argsort(intervals[:, 0], kind="stable")]):
        union = WhatIf(given).host
        assert (union[1:, 0] > union[:-1, 1]).all() and (union[:, 1] > union[:, 0]).all()
        covered = np.zeros(600, dtype=bool)
        for start, end in union:
            covered[start:end] = True
        assert np.array_equal(covered, grid)
    assert np.array_equal(WhatIf(intervals).host, np.stack(union_pieces(intervals[:, 0], intervals[:, 1]), axis=1))
    assert WhatIf().host.shape == (0, 2)


def test_a_writer_gets_the_tables_the_detectors_read_back_before_the_what_ifs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that lent the findings the tables and values their detectors read (parse, ``release``) holds none
    of them when the what-ifs are replayed (the peak of parse); the findings are those of a plain parse."""
    from profparse.outputs.parquet import table_makers
    from profparse.tables.registry import inputs_of

    # what the findings read, less the replay model and what the events table (written beside all others) reads
    read = inputs_of("findings") - inputs_of("replay_model") - {"replay_model"} - inputs_of("events")
    assert {"critical_path", "flops", "flop_counts", "stage_summary"} <= read
    trace = REPO / "sample_traces" / "gpu" / "a100_ddp_rank0_nccl.json.gz"
    parsed = profparse.parse(trace)
    held_at_what_ifs: list[set[str]] = []
    simulate = advice.simulate

    def watched(ctx, found) -> None:
        held_at_what_ifs.append(ctx.parsed.computed())
        simulate(ctx, found)

    monkeypatch.setattr(advice, "simulate", watched)
    made = {name: make() for name, make in table_makers(parsed, release=True).items()}
    assert len(held_at_what_ifs) == 1
    assert {"critical_path", "flops"} <= set(made)
    assert not read & held_at_what_ifs[0], held_at_what_ifs[0]
    monkeypatch.undo()
    plain = profparse.parse(trace).table("findings")
    assert not plain.empty
    assert made["findings"].equals(plain)


def test_a_one_off_is_neither_replayed_nor_applied_before_the_listed_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finding in no more than half the steady steps is dropped before the what-ifs: a replay of it would be
    wasted, and as a fix applied before the listed ones it would shrink their savings. The CPU capture with stage
    marks has one: optimizer_not_batched in one of its two steady steps."""
    trace = REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"
    parsed = profparse.parse(trace)
    detected: list[tuple[str, int, int]] = []
    replayed: list[tuple[str, int, int]] = []
    for detect in detectors.registered():  # what the detectors find, before any is dropped
        ctx = advice.AdviceContext.of(parsed)
        detected += [(f.kind, len(set(f.steps)), len(ctx.steps)) for f in detect(ctx)]
    one_offs = [kind for kind, steps, steady in detected if steps <= steady // 2]
    assert "optimizer_not_batched" in one_offs
    simulate = advice.simulate

    def watched(ctx, found) -> None:
        replayed.extend((f.kind, len(set(f.steps)), len(ctx.steps)) for f in found)
        simulate(ctx, found)

    monkeypatch.setattr(advice, "simulate", watched)
    table = profparse.parse(trace).table("findings")
    assert replayed and all(steps > steady // 2 for _, steps, steady in replayed)
    assert not set(one_offs) & set(table["kind"])
    for evidence in table["evidence"]:
        assert not set(json.loads(evidence).get("applied_after", [])) & set(one_offs)


@pytest.mark.parametrize("dropped", [False, True])
def test_each_path_segment_finds_the_row_of_its_event(tmp_path: Path, dropped: bool) -> None:
    """``segment_rows`` maps each path segment's trace_index to its row: by position when no event was dropped,
    by search when one was (an event without ``ts`` at the front: every row is then one before its position)."""
    b = TraceBuilder()
    t = 0.0
    for step in range(4):
        t = training_step(b, step, t)
    if dropped:
        b.events.insert(0, {"ph": "X", "name": "no time", "pid": 1, "tid": 1, "dur": 5, "cat": "cpu_op"})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(b.document()))
    parsed = profparse.parse(path)
    ctx = advice.AdviceContext.of(parsed)
    index = parsed.raw.events["trace_index"].to_numpy()
    assert bool(index[0] == 1) is dropped
    rows, wanted = ctx.segment_rows, ctx.path["trace_index"].to_numpy()
    on_event = wanted >= 0
    assert on_event.sum() > 20
    assert (rows[~on_event] == -1).all()
    assert (index[rows[on_event]] == wanted[on_event]).all()
