"""The before/after captures of ``profparse advise`` (profparse.capture.advice_pairs): each pattern is measurably
slower than its fix, the traces hold the pattern's ops on the bad side only, and the clean run holds none.

The pairs are captured once per session, with fewer profiled steps than the script's default, into a temporary
folder (about a minute on two cores). Step times on a shared machine move: the margins below are far below the
measured differences (docs/advice.md, "Checking the estimates") and the comparison uses each side's fastest step.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

STEPS = 5  # profiled steps per capture; the first is left out of the measurement
MARGIN = 0.10  # the fix must save at least this share of the good step (measured savings are 20-100%)
RECAPTURES = 2  # captures of a pair that missed, each with twice the steps (a loaded machine moves step times)


@pytest.fixture(scope="session")
def pairs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from profparse.capture.advice_pairs import KINDS, capture_clean, capture_pair

    out = tmp_path_factory.mktemp("advice-pairs")
    for kind in KINDS:
        capture_pair(kind, out, steps=STEPS)
    capture_clean(out, steps=STEPS)
    return out


@functools.lru_cache(maxsize=16)
def _parsed(path: Path):
    import profparse

    return profparse.parse(path)


def _trace(pairs_dir: Path, kind: str, bad: bool) -> Path:
    from profparse.capture.advice_pairs import trace_name

    return pairs_dir / trace_name(kind, bad)


def _per_step(path: Path, name: str, column: str = "count") -> float:
    """Per measured step (after the first): how many host events are named ``name`` (``column="count"``), or
    the sum of their ``column`` (``dur_ns``, ``self_ns``)."""
    events = _parsed(path).events
    events = events[(events["step"] >= 1) & (events["name"].astype(str) == name)]
    steps = len(_parsed(path).steps) - 1
    total = len(events) if column == "count" else float(events[column].sum())
    return total / steps


KINDS_UNDER_TEST = ("data_loading", "between_steps", "grad_zeroing", "optimizer_not_batched", "recompute")
#: the pairs whose step times show the fix's saving. Not grad_zeroing: on the CPU the fix's gradients are fresh
#: allocations each step (page faults, no caching allocator), and its measured saving ranged from -11 to +42 ms
#: between captures of the same pair (1.5-8 ms over 20 steps, against an estimate of 17-20 ms); its estimate is
#: checked on a simulated GPU program instead (tests/test_advice_gpu.py), its pattern here by its ops
TIMED_KINDS = tuple(kind for kind in KINDS_UNDER_TEST if kind != "grad_zeroing")


def test_every_kind_of_the_module_is_tested() -> None:
    from profparse.capture.advice_pairs import KINDS

    assert set(KINDS) == set(KINDS_UNDER_TEST)


@pytest.mark.parametrize("kind", KINDS_UNDER_TEST)
def test_every_step_is_a_profiler_step_and_there_are_no_stage_marks(pairs_dir: Path, kind: str) -> None:
    for bad in (True, False):
        parsed = _parsed(_trace(pairs_dir, kind, bad))
        assert list(parsed.steps["source"]) == ["ProfilerStep"] * STEPS
        names = parsed.events["name"].astype(str)
        assert not names.str.startswith("profparse.stage:").any()


@pytest.mark.parametrize("kind", TIMED_KINDS)
def test_the_fix_saves_a_clear_share_of_the_step(pairs_dir: Path, kind: str, tmp_path: Path) -> None:
    """Other processes can slow a whole capture (one side of a pair) on a shared machine: a pair that misses is
    captured again with twice the steps, up to twice, and one of those captures must show the saving."""
    from profparse.capture.advice_pairs import capture_pair, measure

    m = measure(_trace(pairs_dir, kind, True), _trace(pairs_dir, kind, False))
    assert len(m.bad_step_ns) == len(m.good_step_ns) == STEPS - 1
    assert m.difference_ns == pytest.approx(m.bad_step_ns.mean() - m.good_step_ns.mean())
    for attempt in range(RECAPTURES):
        # other processes only slow steps down: the fastest steps are the fairest comparison on a shared machine
        if m.fastest_difference_ns > MARGIN * float(m.good_step_ns.min()):
            break
        m = measure(*capture_pair(kind, tmp_path / f"again{attempt}", steps=2 * STEPS))
    assert m.fastest_difference_ns > MARGIN * float(m.good_step_ns.min()), m


def test_data_loading_waits_in_the_single_process_iterator(pairs_dir: Path) -> None:
    from profparse.capture.advice_pairs import PAIRS, READ_S

    bad, good = _trace(pairs_dir, "data_loading", True), _trace(pairs_dir, "data_loading", False)
    single = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    multi = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    assert _per_step(bad, single) == 1 and _per_step(good, single) == 0
    assert _per_step(good, multi) == 1
    read_ns = PAIRS["data_loading"].batch * READ_S * 1e9  # the sleeps alone
    assert _per_step(bad, single, "dur_ns") >= read_ns
    assert _per_step(good, multi, "dur_ns") < 0.5 * read_ns


def test_between_steps_reads_every_parameter_norm(pairs_dir: Path) -> None:
    bad, good = _trace(pairs_dir, "between_steps", True), _trace(pairs_dir, "between_steps", False)
    parameters = _per_step(good, "aten::lerp_") or _per_step(good, "torch::autograd::AccumulateGrad")
    assert _per_step(bad, "aten::linalg_vector_norm") == parameters > 0
    assert _per_step(good, "aten::linalg_vector_norm") == 0
    # torch.save and the JSON line run outside any op: the step's own (self) time grows
    assert _per_step(bad, "aten::item") > _per_step(good, "aten::item")


def test_grad_zeroing_zeroes_and_accumulates_on_the_bad_side_only(pairs_dir: Path) -> None:
    bad, good = _trace(pairs_dir, "grad_zeroing", True), _trace(pairs_dir, "grad_zeroing", False)
    parameters = _per_step(good, "torch::autograd::AccumulateGrad")
    assert _per_step(bad, "aten::_foreach_zero_") == 1 and _per_step(good, "aten::_foreach_zero_") == 0
    assert _per_step(bad, "aten::zero_") >= parameters + _per_step(good, "aten::zero_")
    # backward adds into the kept gradients instead of taking the new ones
    assert _per_step(bad, "aten::add_") >= _per_step(good, "aten::add_") + parameters


def test_optimizer_not_batched_runs_ops_per_parameter(pairs_dir: Path) -> None:
    bad, good = _trace(pairs_dir, "optimizer_not_batched", True), _trace(pairs_dir, "optimizer_not_batched", False)
    parameters = _per_step(good, "torch::autograd::AccumulateGrad")
    assert _per_step(bad, "aten::lerp_") == parameters > 100
    assert _per_step(good, "aten::lerp_") == 0
    assert _per_step(good, "aten::_fused_adamw_") == 1 and _per_step(bad, "aten::_fused_adamw_") == 0


def test_recompute_runs_the_layers_forward_twice(pairs_dir: Path) -> None:
    from profparse.capture.advice_pairs import MODELS

    bad, good = _trace(pairs_dir, "recompute", True), _trace(pairs_dir, "recompute", False)
    attention = "aten::_scaled_dot_product_flash_attention_for_cpu"
    layers = _per_step(good, attention)
    assert layers == MODELS["deep"]["num_hidden_layers"]
    assert _per_step(bad, attention) == 2 * layers


def test_the_clean_run_has_none_of_the_patterns(pairs_dir: Path) -> None:
    from profparse.capture.advice_pairs import MODELS, step_times_ns

    clean = _trace(pairs_dir, "clean", False)
    assert _per_step(clean, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") == 0
    assert _per_step(clean, "aten::linalg_vector_norm") == 0
    assert _per_step(clean, "aten::_foreach_zero_") == 0
    assert _per_step(clean, "aten::lerp_") == 0 and _per_step(clean, "aten::_fused_adamw_") == 1
    layers = MODELS["deep"]["num_hidden_layers"]
    assert _per_step(clean, "aten::_scaled_dot_product_flash_attention_for_cpu") == layers
    assert list(_parsed(clean).steps["source"]) == ["ProfilerStep"] * STEPS
    assert len(step_times_ns(clean)) == STEPS - 1


# -- the findings against the measurements ---------------------------------------------------------------------

TOLERANCE = 0.30  # issue 22: the estimate within 30% of the measured saving
#: kinds whose measured saving on the CPU also holds what the estimate leaves out, so only a floor is checked:
#: the per-tensor optimizer's temporaries slow the next forward and backward too (page faults, no caching
#: allocator), most while another process loads the machine: the estimate was 0.55-1.00 of the measured saving
LOWER_BOUND = {"optimizer_not_batched": 0.4}


def _findings(path: Path, kind: str | None = None):
    table = _parsed(path).findings
    return table if kind is None else table[table["kind"] == kind]


def _profiled_estimate(row) -> float:
    evidence = json.loads(row.evidence)
    path = evidence.get("path_saving_ms_per_step")
    return float(path) * 1e6 if path is not None else float(row.saving_ns_per_step)


def _estimate_and_measurement(folder: Path, kind: str) -> tuple[float, float]:
    """The finding's saving per step (from the bad trace alone) and the measured one: the difference of each
    side's fastest half of steps, which the steps other processes slowed do not move."""
    from profparse.capture.advice_pairs import measure

    found = _findings(_trace(folder, kind, True), kind)
    assert len(found) >= 1, _findings(_trace(folder, kind, True))[["kind", "saving_share"]]
    # the pairs are timed profiled (their ProfilerStep windows): the estimate on that basis is the critical
    # path's, which the evidence keeps where the saving is simulated without the profiler (docs/advice.md);
    # tests/test_replay.py checks the simulated savings against unprofiled timings
    estimate = sum(_profiled_estimate(row) for row in found.itertuples())
    measured = measure(_trace(folder, kind, True), _trace(folder, kind, False)).fast_half_difference_ns
    print(f"{kind}: estimate {estimate / 1e6:.1f} ms, measured {measured / 1e6:.1f} ms ({estimate / measured:.2f})")
    return estimate, measured


def test_the_grad_zeroing_finding_fires_on_the_pattern(pairs_dir: Path) -> None:
    """Its estimate is the path time of the zeroing inside ``zero_grad`` and of the AccumulateGrad calls that add
    into the zeroed gradients (one per parameter): at most the time of those two."""
    bad = _trace(pairs_dir, "grad_zeroing", True)
    found = _findings(bad, "grad_zeroing")
    assert len(found) == 1
    evidence = json.loads(found["evidence"].iloc[0])
    parameters = _per_step(_trace(pairs_dir, "grad_zeroing", False), "torch::autograd::AccumulateGrad")
    assert evidence["accumulating_adds_per_step"] == parameters
    assert evidence["zeroing_ops_per_step"] == _per_step(bad, "aten::_foreach_zero_") >= 1  # not the ops under it
    ops_ns = sum(_per_step(bad, name, "dur_ns") for name in ("aten::_foreach_zero_", "torch::autograd::AccumulateGrad"))
    assert 0.5 * ops_ns < float(found["saving_ns_per_step"].iloc[0]) <= ops_ns + 1_000  # ns rounding


@pytest.mark.parametrize("kind", TIMED_KINDS)
def test_the_finding_fires_on_the_pattern_and_estimates_the_saving(pairs_dir: Path, kind: str, tmp_path: Path) -> None:
    """The estimate within 30% of what the fix measurably saved (at least LOWER_BOUND of it for the kinds there).
    Other processes on a shared machine can slow one side of a pair for seconds: a pair that misses is captured
    again with twice the steps (up to twice), and one of those captures must agree."""
    from profparse.capture.advice_pairs import capture_pair

    def agrees(estimate: float, measured: float) -> bool:
        if kind in LOWER_BOUND:
            return estimate >= LOWER_BOUND[kind] * measured
        return estimate == pytest.approx(measured, rel=TOLERANCE)

    if kind in LOWER_BOUND:  # and never more than the stage's own time on the path
        path = _parsed(_trace(pairs_dir, kind, True)).critical_path
        path = path[(path["step"] >= 1) & (path["stage"] == "optimizer")]
        stage_ns = float((path["end_ns"] - path["start_ns"]).sum()) / path["step"].nunique()
        assert 0 < float(_findings(_trace(pairs_dir, kind, True), kind)["saving_ns_per_step"].sum()) <= stage_ns

    estimate, measured = _estimate_and_measurement(pairs_dir, kind)
    for attempt in range(RECAPTURES):
        if agrees(estimate, measured):
            break
        again = tmp_path / f"again{attempt}"
        capture_pair(kind, again, steps=2 * STEPS)
        estimate, measured = _estimate_and_measurement(again, kind)
    assert agrees(estimate, measured), (estimate, measured)


@pytest.mark.parametrize("kind", KINDS_UNDER_TEST)
def test_the_finding_does_not_fire_on_the_fix(pairs_dir: Path, kind: str) -> None:
    assert _findings(_trace(pairs_dir, kind, False), kind).empty


@pytest.mark.parametrize("kind", [*KINDS_UNDER_TEST, "clean"])
def test_no_finding_on_a_fixed_or_clean_run_claims_five_percent(pairs_dir: Path, kind: str) -> None:
    path = _trace(pairs_dir, kind, False)
    others = _findings(path)
    others = others[others["kind"] != kind]
    assert (others["saving_share"] < 0.05).all(), others[["kind", "saving_share", "message"]]
