"""``profparse diff A B``: B - A per stage and level, and the kernels and ops that moved most."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from conftest import parsed as parsed_once
from tracebuilder import TraceBuilder

import profparse
from profparse.cli.main import main
from profparse.diff import diff_data, render

CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
CPU_NOSTACK = SAMPLE_TRACES / "qwen2_tiny_cpu_nostack_syncload.json.gz"
V100 = SHARED_TRACES / "v100_ns_resolution_5steps.json.gz"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def build(tmp_path: Path, name: str, forward_kernel_us: float, steps: int = 3) -> Path:
    """A small training trace whose forward GEMM kernel lasts ``forward_kernel_us``."""
    b = TraceBuilder()
    for step in range(steps):
        t0 = step * 200.0
        b.annotation(f"ProfilerStep#{step}", t0, 200)
        b.py("nn.Module: Linear_0", t0 + 1, 40)
        b.op("aten::linear", t0 + 2, 30)
        b.launch(t0 + 3, t0 + 5, forward_kernel_us, name="gemm_fwd")
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 60, 30, tid=200)
        b.op("AddmmBackward0", t0 + 61, 25, tid=200)
        b.launch(t0 + 62, t0 + 70, 20, tid=200, name="gemm_bwd")
        b.annotation("Optimizer.step#AdamW.step", t0 + 120, 20)
        b.op("aten::_foreach_add_", t0 + 121, 10)
        b.launch(t0 + 122, t0 + 125, 5, name="adam_kernel")
    return b.write(tmp_path / f"{name}.json.gz")


def test_diff_of_a_trace_with_itself_is_all_zeros():
    parsed = parsed_once(need(CPU_MARKS))
    for per_step in (False, True):
        data = diff_data(parsed, parsed, per_step=per_step)
        assert data["stages"], "the trace has time in its stages"
        assert all(r["delta"] == 0 for r in data["stages"])
        assert all(r["pct"] in (0.0, None) for r in data["stages"])
        assert data["kernels"] == [] and data["ops"] == []
    gpu = parsed_once(need(V100))
    data = diff_data(gpu, gpu)
    assert {r["level"] for r in data["stages"]} >= {"GPU busy", "kernels"}
    assert all(r["delta"] == 0 for r in data["stages"])
    assert data["kernels"] == []


def test_longer_forward_kernels_show_as_positive_forward_gpu_change(tmp_path):
    a = profparse.parse(build(tmp_path, "a", 10))
    b = profparse.parse(build(tmp_path, "b", 30))
    data = diff_data(a, b)
    rows = {(r["stage"], r["level"]): r for r in data["stages"]}
    fwd = rows[("forward", "GPU time")]
    assert fwd["a"] == 30_000 and fwd["b"] == 90_000  # 3 steps x 10 us -> 3 x 30 us, in ns
    assert fwd["delta"] == 60_000 and fwd["pct"] == pytest.approx(200.0)  # percent, as every _pct value
    assert re.search(r"forward\s+GPU time\s+0\.03\s+0\.09\s+\+0\.06\s+\+200\.0%", render(data))
    assert rows[("backward", "GPU time")]["delta"] == 0
    assert rows[("all", "GPU time")]["delta"] == 60_000
    top = data["kernels"][0]
    assert (top["stage"], top["name"], top["delta_ns"], top["a_count"], top["b_count"]) == (
        "forward",
        "gemm_fwd",
        60_000,
        3,
        3,
    )
    assert [k["name"] for k in data["kernels"]] == ["gemm_fwd"]  # nothing else moved
    back = diff_data(b, a)  # the other way round: the same change with the opposite sign
    assert {(r["stage"], r["level"]): r for r in back["stages"]}[("forward", "GPU time")]["delta"] == -60_000
    assert back["kernels"][0]["delta_ns"] == -60_000


def test_per_step_compares_means(tmp_path):
    a = profparse.parse(build(tmp_path, "a", 10, steps=2))
    b = profparse.parse(build(tmp_path, "b", 10, steps=4))
    totals = {(r["stage"], r["level"]): r for r in diff_data(a, b)["stages"]}
    assert totals[("forward", "GPU time")]["delta"] == 20_000  # two more steps of 10 us
    means = {(r["stage"], r["level"]): r for r in diff_data(a, b, per_step=True)["stages"]}
    assert means[("forward", "GPU time")]["a"] == means[("forward", "GPU time")]["b"] == 10_000
    assert all(r["delta"] == 0 for r in means.values())


def test_different_step_counts_are_pointed_out_where_totals_are_compared(tmp_path):
    a = profparse.parse(build(tmp_path, "a", 10, steps=2))
    b = profparse.parse(build(tmp_path, "b", 10, steps=4))
    note = "A has 2 steps and B 4: whole-trace totals differ by the step count too; --per-step compares means per step"
    data = diff_data(a, b)
    assert data["note"] == note
    assert f"  note: {note}\n" in render(data, "text") and f"{note}." in render(data, "markdown")
    assert diff_data(a, b, per_step=True)["note"] == ""  # means per step: nothing to point out
    assert diff_data(a, a)["note"] == "" and "note:" not in render(diff_data(a, a), "text")


def test_two_real_captures_differ_with_the_right_sign():
    a, b = parsed_once(need(CPU_MARKS)), parsed_once(need(CPU_NOSTACK))
    data = diff_data(a, b, top=5)
    assert any(r["delta"] != 0 for r in data["stages"])
    sa = a.stage_summary.query("scope == 'total'").set_index("stage")
    sb = b.stage_summary.query("scope == 'total'").set_index("stage")
    for r in data["stages"]:
        if r["column"] in sa.columns and r["stage"] != "all":
            x, y = float(sa.loc[r["stage"], r["column"]]), float(sb.loc[r["stage"], r["column"]])
            assert (r["a"], r["b"], r["delta"]) == (x, y, y - x)
    moved = data["ops"]
    assert len(moved) == 5
    assert [abs(m["delta_ns"]) for m in moved] == sorted((abs(m["delta_ns"]) for m in moved), reverse=True)
    for m in moved:
        assert m["delta_ns"] == pytest.approx(m["b_ns"] - m["a_ns"])


def test_formats_and_verb(tmp_path, capsys):
    a_path, b_path = build(tmp_path, "a", 10), build(tmp_path, "b", 30)
    a, b = profparse.parse(a_path), profparse.parse(b_path)
    data = diff_data(a, b)
    assert json.loads(render(data, "json"))["kernels"][0]["name"] == "gemm_fwd"
    md = render(data, "markdown")
    assert (
        "| stage | level | A | B | change | % |" in md
        and "| forward | GPU time | 0.03 | 0.09 | +0.06 | +200.0% |" in md
    )
    text = render(data, "text")
    assert "forward" in text and "+200.0%" in text and "gemm_fwd" in text
    assert main(["diff", str(a_path), str(b_path), "--format", "json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"]["trace"] == str(a_path) and out["b"]["trace"] == str(b_path)
    assert main(["diff", str(a_path), str(tmp_path / "missing.json"), "-q"]) == 3


def _ops_trace(tmp_path: Path, name: str, ops: dict[str, float], steps: int = 2) -> Path:
    """A CPU-only trace: per step, a forward module holding one op per ``ops`` entry (name -> duration in us)."""
    b = TraceBuilder()
    for step in range(steps):
        t0 = step * 1000.0
        b.annotation(f"ProfilerStep#{step}", t0, 1000)
        b.py("nn.Module: Linear_0", t0 + 1, 900)
        t = t0 + 2
        for op, dur in ops.items():
            b.op(op, t, dur)
            t += dur + 1
    return b.write(tmp_path / f"{name}.json.gz")


def test_two_different_traces_known_op_changes(tmp_path, capsys):
    """B slows one op, drops another and adds a third: each shows with its exact change, in the data and the verb."""
    a_path = _ops_trace(tmp_path, "a", {"aten::mm": 100, "aten::relu": 20, "aten::gone": 50})
    b_path = _ops_trace(tmp_path, "b", {"aten::mm": 160, "aten::relu": 20, "aten::new": 30})
    data = diff_data(profparse.parse(a_path), profparse.parse(b_path))
    moved = {m["name"]: m for m in data["ops"]}
    assert set(moved) == {"aten::mm", "aten::gone", "aten::new"}  # relu did not move
    assert (moved["aten::mm"]["a_ns"], moved["aten::mm"]["b_ns"], moved["aten::mm"]["delta_ns"]) == (
        200_000,
        320_000,
        120_000,
    )
    assert moved["aten::mm"]["pct"] == pytest.approx(60.0)
    assert (moved["aten::gone"]["b_count"], moved["aten::gone"]["delta_ns"]) == (0, -100_000)
    assert (moved["aten::new"]["a_count"], moved["aten::new"]["delta_ns"], moved["aten::new"]["pct"]) == (
        0,
        60_000,
        None,
    )
    assert [m["name"] for m in data["ops"]] == ["aten::mm", "aten::gone", "aten::new"]  # by size of change
    rows = {(r["stage"], r["level"]): r for r in data["stages"]}
    ops = rows[("forward", "ops")]
    assert (ops["a"], ops["b"], ops["delta"]) == (340_000, 420_000, 80_000)  # 2 x (170 -> 210 us)
    assert main(["diff", str(a_path), str(b_path), "-q"]) == 0
    text = capsys.readouterr().out
    mm = next(line for line in text.splitlines() if "aten::mm" in line)
    assert "0.20 (2)" in mm and "0.32 (2)" in mm and "+0.12" in mm and "+60.0%" in mm
    new = next(line for line in text.splitlines() if "aten::new" in line)
    assert new.split()[-1] == "new"


def test_the_verb_holds_one_trace_at_a_time_and_prints_what_the_library_does(tmp_path, capsys, monkeypatch):
    """``profparse diff``: trace A is given back (no reference left) before B is read, and the text is
    ``render(diff_data(A, B))``; ``side(release=True)`` gives back the path, kernels and ops it made, not what the
    caller held."""
    import gc
    import weakref

    import profparse.cli.diff_cmd as diff_cmd
    from profparse.diff import side

    a, b = build(tmp_path, "a.json", 100), build(tmp_path, "b.json", 150)
    parsed_before: list[weakref.ref] = []
    alive_when_reading_b: list[bool] = []
    real = diff_cmd.parse_input

    def tracked(args):
        gc.collect()
        alive_when_reading_b.extend(ref() is not None for ref in parsed_before)
        out = real(args)
        parsed_before.append(weakref.ref(out))
        return out

    monkeypatch.setattr(diff_cmd, "parse_input", tracked)
    assert main(["diff", str(a), str(b), "--no-cache", "-q"]) == 0
    assert alive_when_reading_b == [False]
    expected = render(diff_data(profparse.parse(a), profparse.parse(b)), "text")
    assert capsys.readouterr().out == expected

    parsed = profparse.parse(a)
    parsed.table("ops")  # the caller's: kept
    side(parsed, release=True)
    assert "ops" in parsed.computed()
    assert not {"critical_path", "kernels"} & parsed.computed()


def test_step_section_compares_the_steady_steps_as_summarize_reads_each(tmp_path):
    """The diff's first section: the steady steps' mean profiled and without the profiler, each side as
    summarize's ``without_profiler`` reads it; 4 ms more untraced time in every step is +4 ms per step profiled."""
    from test_advice import _gap_steps

    from profparse.outputs.summary import summary_data

    a, b = _gap_steps(tmp_path, [1_000] * 5), _gap_steps(tmp_path, [5_000] * 5)
    data = diff_data(parsed_once(a), parsed_once(b))
    rows = {r["key"]: r for r in data["step"]}
    assert list(rows) == ["profiled_step_ns", "step_ns"]
    for trace, side in ((a, "a"), (b, "b")):
        expected = summary_data(parsed_once(trace))["without_profiler"]
        assert {k: rows[k][side] for k in rows} == {k: expected[k] for k in rows}
    assert rows["profiled_step_ns"]["delta"] == pytest.approx(4e6)
    assert rows["step_ns"]["delta"] == rows["step_ns"]["b"] - rows["step_ns"]["a"]
    text = render(data)
    assert text.index("Step (mean of the steady steps; ms;") < text.index("Per stage and level")
    assert "step, profiled" in text and "+4.00" in text
    assert "| step without the profiler |" in render(data, "markdown")
    assert json.loads(render(data, "json"))["step"] == data["step"]


def test_step_section_without_steady_steps_says_so(tmp_path):
    a = parsed_once(build(tmp_path, "a.json", 10))
    none = TraceBuilder()
    none.op("aten::mm", 0, 10)  # no step at all
    data = diff_data(a, parsed_once(none.write(tmp_path / "none.json")))
    assert data["step"] == []
    assert "(no steady step in one of the traces)" in render(data)
    assert "events, 3 steps, Fake GPU)" in render(data) and "events, 0 steps, " in render(data)
    one = diff_data(a, parsed_once(build(tmp_path, "one.json", 10, steps=1)))
    assert "events, 1 step, Fake GPU)" in render(one)  # not "1 steps"


H200_PAIRS = SHARED_TRACES / "h200_pairs"


@pytest.mark.skipif(not (H200_PAIRS / "measured.json").exists(), reason="needs ../shared/traces/h200_pairs")
def test_diff_of_a_fix_on_an_h200_shows_the_saving_the_profiler_hid():
    """TF32 matmuls on an H200: profiled, the steps differ by 4.3 ms (the profiler's host cost bounds both); without
    the profiler by 38 ms, where the unprofiled blocks measured 32 ms (within 25%)."""
    measured = json.loads((H200_PAIRS / "measured.json").read_text())["fp32_matmul"]
    truth = measured["good_step_ns"] - measured["bad_step_ns"]
    data = diff_data(
        parsed_once(H200_PAIRS / "fp32_matmul_bad.json.gz"), parsed_once(H200_PAIRS / "fp32_matmul_good.json.gz")
    )
    rows = {r["key"]: r for r in data["step"]}
    assert abs(rows["profiled_step_ns"]["delta"]) < 0.25 * abs(truth)
    assert rows["step_ns"]["delta"] == pytest.approx(truth, rel=0.25)


def test_traces_without_ops_or_kernels_diff_against_any_other(tmp_path):
    """A side with no CPU ops (or no GPU kernels), or none in a step (``per_step``), has an empty moved-names list,
    typed as a filled one is: two empty lists of different types (an untyped one is float64 on pandas 3) refused to
    merge (exit 70)."""
    gpu_only = TraceBuilder()
    gpu_only.events.append(
        {"ph": "X", "cat": "kernel", "name": "gemm_fwd", "pid": 0, "tid": 7, "ts": 5, "dur": 3, "args": {"stream": 7}}
    )
    host_only = TraceBuilder()  # ops, but no step: none of them counts per step
    host_only.op("aten::linear", 0, 10)
    sides = {
        "full": parsed_once(build(tmp_path, "full.json", 10)),
        "gpu_only": parsed_once(gpu_only.write(tmp_path / "gpu_only.json")),
        "host_only": parsed_once(host_only.write(tmp_path / "host_only.json")),
    }
    for a in sides:
        for b in sides:
            for per_step in (False, True):
                data = diff_data(sides[a], sides[b], per_step=per_step)
                for table in ("ops", "kernels"):
                    names = {row["name"] for row in data[table]}
                    if a == b:
                        assert names == set(), (a, table)
                    elif {a, b} == {"full", "gpu_only"} and table == "ops":
                        # every op of the full trace moved, by its whole total (the other side has none)
                        assert names == set(sides["full"].ops["name"].astype(str)), (a, b, per_step)
                json.loads(render(data, "json"))
