"""Memory categories: a hand-built trace with known answers, and CPU captures checked against torch's own labels.

torch labels tensors in ``torch.profiler._memory_profiler.MemoryProfileTimeline``; its allocations join the
trace's ``[memory]`` events on (address, time): ``t`` is the event's ``ts`` in ns plus ``baseTimeNanoseconds``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import sample_traces
from tracebuilder import AUTOGRAD, TraceBuilder, backward_node, forward_op, memory_event

import profparse
from profparse.analysis.memory_categories import CATEGORIES, MEMORY_RULES, live_by_category
from profparse.outputs.summary import render_summary, summary_data

# torch's category -> ours. AUTOGRAD_DETAIL is what flows between autograd nodes (gradients of activations):
# made and freed inside one backward, a temporary. UNKNOWN (None) is left out.
TORCH_CATEGORIES = {
    "PARAMETER": "parameter",
    "GRADIENT": "gradient",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activation",
    "TEMPORARY": "temporary",
    "INPUT": "input",
    "AUTOGRAD_DETAIL": "temporary",
}
PATTERNS = ("causal_lm_adamw", "causal_lm_checkpointing", "mlp_sgd_accumulation", "from_pretrained_adamw")


# -- a hand-built trace ------------------------------------------------------------------------------------------


def _alloc(b: TraceBuilder, ts: float, nbytes: int, addr: int, total: int, tid: int = 100) -> None:
    memory_event(b, ts, nbytes, total, tid=tid)["args"]["Addr"] = addr


def _hand_built(tmp_path: Path) -> profparse.ParsedTrace:
    """One step; each address is one allocation whose category is known (see EXPECTED)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    _alloc(b, 1, 1000, 1, 1000)  # weights, before any forward, never freed
    _alloc(b, 2, 64, 2, 1064)  # the batch: made before forward, freed at the end of the step
    b.py("nn.Module: Linear_0", 9, 12)
    forward_op(b, "aten::linear", 10, 10, seq=1)
    _alloc(b, 11, 32, 3, 1096)  # scratch freed inside the op
    _alloc(b, 12, -32, 3, 1064)
    _alloc(b, 13, 128, 4, 1192)  # saved for backward
    backward_node(b, "AddmmBackward0", 30, 8, seq=1)
    _alloc(b, 32, 16, 5, 1208, tid=AUTOGRAD)
    _alloc(b, 33, -16, 5, 1192, tid=AUTOGRAD)
    _alloc(b, 35, -128, 4, 1064, tid=AUTOGRAD)
    backward_node(b, "torch::autograd::AccumulateGrad", 40, 5, seq=2)
    _alloc(b, 41, 1000, 6, 2064, tid=AUTOGRAD)  # .grad
    b.annotation("Optimizer.step#AdamW.step", 70, 20)
    b.op("aten::zeros_like", 71, 1)
    _alloc(b, 71.5, 1000, 7, 3064)  # state
    _alloc(b, 73, 500, 8, 3564)  # a denominator, freed before the step ends
    _alloc(b, 80, -500, 8, 3064)
    _alloc(b, 95, -64, 2, 3000)
    return profparse.parse(b.write(tmp_path / "memory.json"))


EXPECTED = {  # address -> (category, rule)
    1: ("parameter", "load.parameter"),
    2: ("input", "step.input"),
    3: ("temporary", "op.temporary"),
    4: ("activation", "forward.activation"),
    5: ("temporary", "op.temporary"),
    6: ("gradient", "grad.accumulate"),
    7: ("optimizer_state", "optimizer.state"),
    8: ("temporary", "optimizer.temporary"),
}


def _addresses(parsed: profparse.ParsedTrace, table: pd.DataFrame) -> np.ndarray:
    events = parsed.raw.events
    rows = pd.Index(events["trace_index"].to_numpy()).get_indexer(table["trace_index"].to_numpy())
    return events["mem_addr"].to_numpy()[rows]


def test_hand_built_categories_and_rules(tmp_path: Path) -> None:
    parsed = _hand_built(tmp_path)
    table = parsed.memory_categories
    labels = zip(table["category"].astype(str), table["rule"].astype(str), strict=True)
    found = {int(a): label for a, label in zip(_addresses(parsed, table), labels, strict=True)}
    assert found == EXPECTED
    row = table.set_index(pd.Index(_addresses(parsed, table)))
    assert row.loc[4, "alloc_stage"] == "forward" and row.loc[4, "free_stage"] == "backward"
    assert pd.isna(row.loc[1, "free_stage"]) and pd.isna(row.loc[1, "free_step"])  # alive at the end
    assert row.loc[8, "free_ts_ns"] - row.loc[8, "ts_ns"] == 7000


def test_the_table_from_the_cache_equals_the_fresh_one(tmp_path: Path, monkeypatch) -> None:
    """Where no allocation lies inside an op, every ``op_name`` is missing: the stored table read back gave None
    where the fresh one held NaN (an object column on pandas 3). The text columns are categoricals, as the table's
    other text columns, so missing is missing both ways, with or without an op around."""
    monkeypatch.setenv("PROFPARSE_CACHE_DIR", str(tmp_path / "cache"))
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    _alloc(b, 1, 1000, 1, 1000)  # outside every op
    _alloc(b, 2, 64, 2, 1064)
    _alloc(b, 95, -64, 2, 1000)
    path = b.write(tmp_path / "no_ops.json")
    fresh = profparse.load(path, cache=True).memory_categories
    stored = profparse.load(path, cache=True).memory_categories
    assert len(fresh) == 2 and fresh["op_name"].isna().all()
    pd.testing.assert_frame_equal(stored, fresh)
    with_op = _hand_built(tmp_path).memory_categories
    for table in (fresh, with_op):
        assert all(isinstance(table[c].dtype, pd.CategoricalDtype) for c in ("device", "alloc_stage", "op_name"))
    assert set(with_op["op_name"].cat.categories) == set(with_op["op_name"].dropna())  # only the names used


def test_a_temporary_is_freed_inside_the_outermost_op(tmp_path: Path) -> None:
    """torch's rule: a tensor made and freed inside one outermost op with a schema is a temporary, even when the
    inner op that made it ended before the free (log_softmax's output inside cross_entropy_loss). A user range
    recorded as an op (older traces) is not such an op: what it frees outside any op is an intermediate."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("## forward ##", 5, 40)  # a user range as older Kineto recorded it
    forward_op(b, "aten::cross_entropy_loss", 10, 10, seq=1)
    b.op("aten::log_softmax", 11, 3)
    _alloc(b, 12, 256, 1, 256)  # made by log_softmax, freed by cross_entropy_loss after log_softmax ended
    b.op("aten::nll_loss", 15, 3)
    _alloc(b, 18.5, -256, 1, 0)
    forward_op(b, "aten::mul", 22, 2, seq=2)
    _alloc(b, 26, 64, 2, 64)  # made in the user range outside any op, freed by a later op of the same forward
    forward_op(b, "aten::add", 29, 2, seq=3)
    _alloc(b, 30, -64, 2, 0)
    backward_node(b, "AddBackward0", 48, 1, seq=3)
    backward_node(b, "MulBackward0", 50, 8, seq=2)
    backward_node(b, "NllLossBackward0", 60, 8, seq=1)
    parsed = profparse.parse(b.write(tmp_path / "outermost.json"))
    table = parsed.memory_categories
    labels = zip(table["category"].astype(str), table["rule"].astype(str), strict=True)
    found = {int(a): label for a, label in zip(_addresses(parsed, table), labels, strict=True)}
    assert found == {1: ("temporary", "op.temporary"), 2: ("activation", "forward.intermediate")}


def test_cuda_order_blocks_reused_and_kernels_after_the_frees(tmp_path: Path) -> None:
    """As a CUDA trace orders it: the host frees a temporary while the kernels that use it are still queued, and
    the caching allocator hands the same block (address) to the next tensor. Lifetimes come from the host's
    allocation and free of each use of a block, not from the kernels."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    forward_op(b, "aten::cross_entropy_loss", 10, 10, seq=1)
    b.op("aten::log_softmax", 11, 3)
    _alloc(b, 12, 512, 7, 512)  # a temporary: freed on the host before its kernels run
    b.launch(13, 60, 20, name="log_softmax_kernel")
    _alloc(b, 18, -512, 7, 0)
    forward_op(b, "aten::mul", 22, 4, seq=2)
    _alloc(b, 23, 512, 7, 512)  # the same block again: saved for backward
    b.launch(24, 85, 10, name="mul_kernel")
    backward_node(b, "MulBackward0", 120, 8, seq=2)
    _alloc(b, 125, -512, 7, 0, tid=AUTOGRAD)
    backward_node(b, "NllLossBackward0", 130, 8, seq=1)
    parsed = profparse.parse(b.write(tmp_path / "cuda_order.json"))
    table = parsed.memory_categories.sort_values("ts_ns")
    assert list(zip(table["category"].astype(str), table["rule"].astype(str), strict=True)) == [
        ("temporary", "op.temporary"),
        ("activation", "forward.activation"),
    ]
    assert (table["device"].astype(str).str.contains("cuda")).all()


def test_every_allocation_has_one_row(sample_trace: Path) -> None:
    parsed = profparse.load(sample_trace)
    table, memory = parsed.memory_categories, parsed.memory
    allocations = memory.loc[memory["bytes"] > 0, "trace_index"]
    assert sorted(table["trace_index"]) == sorted(allocations)
    assert table["bytes"].sum() == memory.loc[memory["bytes"] > 0, "bytes"].sum()
    category_of = {rule.name: rule.category for rule in MEMORY_RULES}
    assert (table["rule"].astype(str).map(category_of) == table["category"].astype(str)).all()
    freed = table["free_ts_ns"].notna()
    assert (table.loc[freed, "free_ts_ns"] >= table.loc[freed, "ts_ns"]).all()
    assert set(table["category"].astype(str)) <= set(CATEGORIES)


# -- ground truth from torch on CPU ------------------------------------------------------------------------------


def _train(pattern: str, prof, folder: str) -> None:
    import torch
    from transformers import LlamaForCausalLM

    if pattern == "mlp_sgd_accumulation":
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(3):
            for _ in range(2):  # two micro-batches per optimizer step
                x, y = torch.randn(16, 32), torch.randn(16, 8)
                (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
        return
    if pattern == "from_pretrained_adamw":
        model = LlamaForCausalLM.from_pretrained(folder)
    else:
        model = LlamaForCausalLM(_llama_config())
    if pattern == "causal_lm_checkpointing":
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        prof.step()


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def _capture(pattern: str, folder: Path) -> tuple[Path, pd.DataFrame]:
    """The trace of three steps of ``pattern`` and torch's label of each allocation: addr, t (epoch ns), label."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline, TensorKey
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    weights = tempfile.mkdtemp(dir=folder)
    if pattern == "from_pretrained_adamw":
        LlamaForCausalLM(_llama_config()).save_pretrained(weights)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)
    with prof:
        _train(pattern, prof, weights)
    trace = folder / f"{pattern}.json"
    prof.export_chrome_trace(str(trace))
    timeline = MemoryProfileTimeline(prof._memory_profile())
    labels = [
        (key.storage.ptr, t, timeline.categories.get(key, version))
        for t, action, (key, version), _ in timeline.timeline
        if isinstance(key, TensorKey) and action == Action.CREATE
    ]
    truth = pd.DataFrame(
        [(int(a), int(t), TORCH_CATEGORIES.get(c.name) if c is not None else None) for a, t, c in labels],
        columns=["addr", "t", "truth"],
    )
    return trace, truth.dropna().drop_duplicates(["addr", "t"])


def _without_python(trace: Path) -> Path:
    document = json.loads(trace.read_text())
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("cat") != "python_function"]
    stripped = trace.with_name(trace.stem + "_nopy.json")
    stripped.write_text(json.dumps(document))
    return stripped


@pytest.fixture(scope="module", params=PATTERNS)
def captured(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, pd.DataFrame]:
    trace, truth = _capture(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, trace, truth


def agreement(parsed: profparse.ParsedTrace, truth: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """Allocations joined to torch's labels (an allocation made and freed in one Optimizer.step is a temporary in
    the truth: torch mislabels AdamW's denominators) and the byte-weighted share where both agree."""
    table = parsed.memory_categories
    base = int(parsed.raw.header.get("baseTimeNanoseconds", 0))
    mine = table.assign(addr=_addresses(parsed, table), t=table["ts_ns"] + base)
    joined = mine.merge(truth, on=["addr", "t"], how="inner")
    in_step = joined["rule"].astype(str) == "optimizer.temporary"
    joined.loc[in_step, "truth"] = "temporary"
    same = joined["truth"] == joined["category"].astype(str)
    return joined, float(joined.loc[same, "bytes"].sum() / joined["bytes"].sum())


def test_agreement_with_torch_labels(captured) -> None:
    pattern, trace, truth = captured
    parsed = profparse.parse(trace)
    joined, share = agreement(parsed, truth)
    assert joined["bytes"].sum() >= 0.8 * parsed.memory_categories["bytes"].sum()  # the join found most bytes
    assert set(joined["truth"]) >= {"gradient", "temporary", "activation"}
    assert share >= 0.95, (pattern, share)
    stripped = profparse.parse(_without_python(trace))
    _, stripped_share = agreement(stripped, truth)
    assert stripped_share >= 0.95, (pattern, stripped_share)
    table = parsed.memory_categories
    changed = stripped.memory_categories["category"] != table["category"]
    assert table.loc[changed, "bytes"].sum() <= 0.01 * table["bytes"].sum()  # stacks hardly matter


def test_sample_captures_have_every_training_category() -> None:
    paths = [p for p in sample_traces() if "qwen2_tiny_cpu" in p.name]
    if not paths:
        pytest.skip("no sample captures")
    for path in paths:
        table = profparse.load(path).memory_categories
        found = set(table["category"].astype(str))
        assert {"parameter", "gradient", "optimizer_state", "activation", "temporary"} <= found, path.name


# -- live bytes per category -------------------------------------------------------------------------------------


def test_hand_built_peak_by_category(tmp_path: Path) -> None:
    peak = _hand_built(tmp_path).memory_peak_categories
    forward = peak[(peak["stage"] == "forward") & (peak["step"] == 1)].set_index("category")
    assert forward["peak_allocated_bytes"].iloc[0] == 1192  # after the saved activation (t = 13 us)
    expected = {"parameter": 1000, "input": 64, "activation": 128}
    assert {str(c): int(v) for c, v in forward["live_bytes"].items()} == {c: expected.get(c, 0) for c in CATEGORIES}
    optimizer = peak[peak["stage"] == "optimizer"].set_index("category")["live_bytes"]
    assert optimizer["optimizer_state"] == 1000 and optimizer["temporary"] == 500 and optimizer["gradient"] == 1000


def test_memory_from_before_the_trace_is_its_own_row(tmp_path: Path) -> None:
    """A model loaded before profiling: 5000 B already allocated when the first event (a 64 B batch) comes; a
    pre-trace buffer of 1000 B (address 9, never allocated in the trace) is freed in forward. At each peak the rows
    add up to Total Allocated, the pre-trace memory as ``before_trace`` (5000, then 4000), not as a parameter (before,
    it was ``other``; a summary could show ``parameter 64 B`` beside it)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    _alloc(b, 2, 64, 2, 5064)  # the batch; 5000 B were there before
    b.py("nn.Module: Linear_0", 9, 30)
    forward_op(b, "aten::linear", 10, 10, seq=1)
    _alloc(b, 13, 128, 4, 5192)  # saved for backward: forward's peak
    _alloc(b, 20, -1000, 9, 4192)  # a buffer allocated before the trace, freed
    forward_op(b, "aten::relu", 25, 10, seq=2)
    _alloc(b, 26, 500, 5, 4692)
    backward_node(b, "AddmmBackward0", 50, 8, seq=1)
    _alloc(b, 52, -128, 4, 4564, tid=AUTOGRAD)
    _alloc(b, 53, -500, 5, 4064, tid=AUTOGRAD)
    _alloc(b, 90, -64, 2, 4000)
    parsed = profparse.parse(b.write(tmp_path / "t.json"))
    peak = parsed.memory_peak_categories
    live = {
        str(stage): {str(c): int(v) for c, v in rows.set_index("category")["live_bytes"].items() if v}
        for stage, rows in peak[peak["step"] == 1].groupby("stage", observed=True)
    }
    assert live["forward"] == {"before_trace": 5000, "input": 64, "activation": 128}  # at 5192 B, t = 13 us
    # backward's peak (4564 B) is after its first free: the relu output saved for backward (500) is still live
    assert live["backward"] == {"before_trace": 4000, "input": 64, "activation": 500}
    totals = peak[peak["step"] == 1].groupby("stage", observed=True)
    assert (totals["live_bytes"].sum() == totals["peak_allocated_bytes"].first()).all()
    assert "parameter" not in live["forward"]


def test_frees_without_an_address_do_not_pile_up_below_zero(tmp_path: Path) -> None:
    """A legacy trace (no ``Addr``, no ``Total Allocated``; the 2021 V100 one): each step allocates 300 B and frees
    them. Its frees cannot be paired, so nothing says they free memory from before the trace: at each step's peak
    everything live is ``other`` (300 B); ``before_trace`` read -300 B, -600 B, -900 B and ``other`` 600 B, 900 B,
    1200 B (on the V100 trace: -50.3 GiB and 52.9 GiB on a 32 GB GPU)."""
    b = TraceBuilder()
    for step in range(3):
        t0 = step * 100
        b.annotation(f"ProfilerStep#{step}", t0, 90)
        forward_op(b, "aten::linear", t0 + 10, 20, seq=step)
        for ts, nbytes in ((t0 + 12, 100), (t0 + 14, 200), (t0 + 60, -200), (t0 + 62, -100)):
            del memory_event(b, ts, nbytes, None)["args"]["Addr"]
    peak = profparse.parse(b.write(tmp_path / "t.json")).memory_peak_categories
    for step in range(3):
        live = peak[peak["step"] == step].set_index("category")["live_bytes"]  # one stage per step here
        assert {str(c): int(v) for c, v in live.items() if v} == {"other": 300}


def _categories_add_up(path: Path) -> None:
    parsed = profparse.load(path)
    memory = parsed.table("memory")
    live = live_by_category(parsed.raw.events, memory, parsed.table("memory_categories"))
    assert (live.sum(axis=1) == memory["allocated_bytes"].to_numpy()).all()
    peak = parsed.memory_peak_categories
    sums = peak.groupby(["step", "stage", "device"], observed=True, dropna=False)
    assert (sums["live_bytes"].sum() == sums["peak_allocated_bytes"].first()).all()


def test_categories_add_up_to_total_allocated_on_gpu_traces(shared_trace: Path) -> None:
    _categories_add_up(shared_trace)


def test_categories_add_up_to_total_allocated_on_samples(sample_trace: Path) -> None:
    _categories_add_up(sample_trace)


def test_summary_section_on_hand_built_trace(tmp_path: Path) -> None:
    parsed = _hand_built(tmp_path)
    data = summary_data(parsed)["memory_categories"]
    (step,) = data["step_peaks"]
    assert step["stage"] == "optimizer" and step["peak_allocated_bytes"] == 3564
    live = {c: step[c] for c in CATEGORIES}
    expected = {"parameter": 1000, "input": 64, "gradient": 1000, "optimizer_state": 1000, "temporary": 500}
    assert live == {**dict.fromkeys(CATEGORIES, 0), **expected}
    assert data["top_activations"] == []  # the only activation was freed in backward
    text = render_summary(parsed)
    assert "Memory at the peak, by category" in text
    assert json.loads(render_summary(parsed, "json"))["memory_categories"]["step_peaks"][0]["gradient"] == 1000


def test_summary_top_activations_are_live_at_the_peak() -> None:
    path = next((p for p in sample_traces() if p.name == "qwen2_tiny_cpu_marks.json.gz"), None)
    if path is None:
        pytest.skip("no sample capture")
    parsed = profparse.load(path)
    data = summary_data(parsed)["memory_categories"]
    highest = max(data["step_peaks"], key=lambda r: r["peak_allocated_bytes"])
    assert sum(r["bytes"] for r in data["top_activations"]) <= highest["activation"]
    assert data["top_activations"][0]["bytes"] >= data["top_activations"][-1]["bytes"] > 0
