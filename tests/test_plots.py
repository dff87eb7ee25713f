"""``profparse plot``: one valid, non-empty PNG and SVG per kind; kinds without data are skipped with a reason."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from conftest import parsed as parsed_once
from tracebuilder import AUTOGRAD, TraceBuilder, backward_node, forward_op, training_step

import profparse
from profparse.base import names
from profparse.base.files import MARKER
from profparse.base.marks import STAGES
from profparse.base.names import shorten_name
from profparse.cli.main import main
from profparse.outputs import plots
from profparse.outputs.plots import PLOT_KINDS, STAGE_COLORS, optional_table, write_plots

US = 1000  # ns
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CPU_MARKS = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"
V100 = SHARED_TRACES / "v100_ns_resolution_5steps.json.gz"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == PNG_MAGIC
    image = mpimg.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 300
    assert float(np.std(image[..., :3])) > 0.01, f"{path.name} is blank"


def assert_svg(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 50, f"{path.name} has almost nothing drawn"


def results_by_kind(results) -> dict[str, plots.PlotResult]:
    by_kind = {r.kind: r for r in results}
    assert list(by_kind) == list(PLOT_KINDS)  # one result per kind, in order
    return by_kind


def has_analysis(parsed) -> bool:
    return hasattr(type(parsed), "modules")


def test_cpu_sample_trace_plots(tmp_path):
    parsed = parsed_once(need(CPU_MARKS))
    out = tmp_path / "plots"
    by_kind = results_by_kind(write_plots(parsed, out))
    drawn = {"stages", "timeline", "top_ops", "memory"}
    if has_analysis(parsed):
        drawn |= {"layers", "load"}
    if (parsed.flops["flops"] > 0).any():  # recorded shapes: FLOPs counted (host-time TFLOP/s on a CPU trace)
        drawn |= {"roofline"}
    if len(parsed.critical_path):  # steps found: their critical path (tests/test_critical_path_outputs.py)
        drawn |= {"critical_path"}
    for kind in drawn:
        r = by_kind[kind]
        assert r.skipped is None, (kind, r.skipped)
        assert [f.name for f in r.files] == [f"{kind}.png", f"{kind}.svg"]
        assert_png(out / f"{kind}.png")
        assert_svg(out / f"{kind}.svg")
    assert by_kind["top_kernels"].skipped and "GPU" in by_kind["top_kernels"].skipped
    assert not by_kind["top_kernels"].files
    written = sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert written == sorted(f"{k}.{fmt}" for k in drawn for fmt in ("png", "svg"))


@pytest.mark.parametrize("name", ["v100_ns_resolution_5steps", "v100_resnet50_legacy2021", "mi300x_resnet18_train"])
def test_gpu_trace_plots(tmp_path, name):
    parsed = parsed_once(need(SHARED_TRACES / f"{name}.json.gz"))
    out = tmp_path / "plots"
    by_kind = results_by_kind(write_plots(parsed, out, formats=("png",)))
    for kind in ("stages", "timeline", "top_kernels", "top_ops"):
        assert by_kind[kind].skipped is None
        assert_png(out / f"{kind}.png")
    memory = by_kind["memory"]
    if name == "v100_resnet50_legacy2021":  # [memory] events without Total Allocated: the running sum is drawn
        assert memory.skipped is None
    elif name == "v100_ns_resolution_5steps":
        assert memory.skipped and "[memory]" in memory.skipped
    for r in by_kind.values():
        assert (r.skipped is None) == bool(r.files)
        assert r.skipped is None or r.skipped.strip()


def test_kinds_and_formats_can_be_chosen(tmp_path):
    parsed = parsed_once(need(V100))
    out = tmp_path / "one"
    results = write_plots(parsed, out, kinds=["timeline"], formats=("svg",))
    assert [r.kind for r in results] == ["timeline"]
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "timeline.svg"])
    assert_svg(out / "timeline.svg")
    with pytest.raises(ValueError, match="unknown plot kind"):
        write_plots(parsed, tmp_path / "bad", kinds=["pie"])
    assert not (tmp_path / "bad").exists()


def test_synthetic_trace_without_memory_or_modules_skips_cleanly(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        t = training_step(b, step, t)
    parsed = profparse.parse(b.write(tmp_path / "t.json.gz"))
    by_kind = results_by_kind(write_plots(parsed, tmp_path / "out", formats=("png",)))
    assert by_kind["memory"].skipped
    assert by_kind["load"].skipped
    for kind in ("stages", "timeline", "top_kernels", "top_ops"):
        assert by_kind[kind].skipped is None
        assert_png(tmp_path / "out" / f"{kind}.png")


def test_memory_plot_from_memory_events(tmp_path):
    b = TraceBuilder()
    t = 0.0
    total = 0
    for step in range(2):
        t0 = t
        t = training_step(b, step, t)
        for i in range(20):
            total += (1 << 20) if i < 12 else -(1 << 19)
            b.memory(t0 + 1 + i * 4, 1 << 20, total)
    parsed = profparse.parse(b.write(tmp_path / "t.json.gz"))
    fig, why = plots.make_figure(parsed, "memory")
    assert why is None and fig is not None
    ax = fig.axes[0]
    assert "GPU 0" in ax.get_ylabel() or "cuda" in ax.get_ylabel()
    assert "MiB" in ax.get_ylabel()
    plots.save_figure(fig, tmp_path / "memory", ("png",))
    assert_png(tmp_path / "memory.png")


def test_memory_plot_legends_lie_inside_the_figure(tmp_path):
    """A trace whose memory is all ``other`` (no addresses, as in the 2021 V100 trace): the stage legend is wider
    than the category one, and was cut off at the figure's edge ("backwa", "optimiz")."""
    b = TraceBuilder()
    t, total = 0.0, 0
    for step in range(2):
        t0, t = t, training_step(b, step, t)
        for i in range(4):
            total += 1 << 20 if i < 2 else -(1 << 20)
            del b.memory(t0 + 1 + i * 20, 1 << 20 if i < 2 else -(1 << 20), total)["args"]["Addr"]
    fig, why = plots.make_figure(profparse.parse(b.write(tmp_path / "t.json")), "memory")
    assert why is None
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    from matplotlib.legend import Legend

    legends = fig.findobj(Legend)
    assert sorted(leg.get_title().get_text() for leg in legends) == ["category", "stage"]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0 and box.y1 <= fig.bbox.y1, legend


def test_empty_or_missing_tables_are_skipped():
    class Bare:
        empty = pd.DataFrame({"x": []})

    assert optional_table(Bare(), "modules") is None  # attribute missing
    assert optional_table(Bare(), "empty") is None  # no rows


def test_timeline_caps_drawn_rectangles(monkeypatch):
    parsed = parsed_once(need(V100))
    monkeypatch.setattr(plots, "MAX_RECTS", 12)
    tracks, gap = plots._timeline_intervals(parsed)
    assert len(tracks.intervals) <= 12 or gap >= tracks.intervals["end_ns"].max() - tracks.intervals["start_ns"].min()
    fig, why = plots.make_figure(parsed, "timeline")
    assert why is None and fig is not None
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_one_colour_per_stage_everywhere():
    assert set(STAGE_COLORS) == set(STAGES)
    assert len(set(STAGE_COLORS.values())) == len(STAGES)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
            "vectorized_elementwise_kernel<CUDAFunctor_add>",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
            "at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)"
            "::{lambda(float, float)#1}>, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<float, float, "
            "float, at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, "
            "float)::{lambda(float, float)#1}>, at::detail::Array<char*, 3>)",
            "vectorized_elementwise_kernel<BinaryFunctor<threshold_kernel_impl>>",
        ),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", None),
        ("volta_sgemm_64x64_nt", "volta_sgemm_64x64_nt"),
        (
            "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34GridwiseGemm"
            "MultiD_xdl_cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorENS_5TupleIJEEES7_ttftSA_",
            "kernel_grouped_conv_fwd_xdl_cshuffle_v3<…>",
        ),
        (
            "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22Implicit",
            "Kernel<ImplicitGemmConvolution>",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD"),
    ],
)
def test_kernel_names_are_shortened_readably(name, short):
    got = shorten_name(name)
    assert len(got) <= names.LABEL_WIDTH
    if short is not None:
        assert got == short
    else:
        assert got == "ncclKernel_AllReduce_RING_LL_Sum_float"
    assert shorten_name("aten::mm", kernel=False) == "aten::mm"


def test_plot_verb(tmp_path, capsys):
    trace = need(CPU_MARKS)
    out = tmp_path / "p"
    assert main(["plot", str(trace), "-o", str(out), "--kind", "stages", "--kind", "top_kernels", "-q"]) == 0
    stdout = capsys.readouterr().out
    assert f"stages: {out}/stages.png {out}/stages.svg" in stdout
    assert "top_kernels: skipped" in stdout
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "stages.png", "stages.svg"]
    stages = (out / "stages.png").read_bytes()
    assert main(["plot", str(trace), "-o", str(out), "-q"]) == 6  # exists, no --force
    assert main(["plot", str(trace), "-o", str(out), "-q", "--force", "--kind", "timeline", "--format", "png"]) == 0
    # --force --kind timeline replaces only the timeline's files: the other plots stay as they were
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "stages.png", "stages.svg", "timeline.png"]
    assert (out / "stages.png").read_bytes() == stages


@pytest.mark.parametrize("path", [CPU_MARKS, V100], ids=["cpu_marks", "v100"])
def test_stages_plot_bars_are_the_summary_numbers(path):
    parsed = parsed_once(need(path))
    panels = {title: frame for frame, title in plots._level_panels(parsed)}
    totals = parsed.stage_summary.query("scope == 'total'").set_index("stage")
    host = panels["Host threads"].sum(axis=1)
    assert (host == totals.loc[host.index, "host_wall_ns"].astype(float)).all()  # bar height = host wall
    if "GPU" in panels:
        gpu = panels["GPU"].sum(axis=1)
        parts = totals.loc[gpu.index, ["gpu_busy_ns", "gpu_overlap_ns", "gpu_idle_ns"]].sum(axis=1)
        assert (gpu == parts.astype(float)).all()


def _bars(ax) -> list:
    from matplotlib.patches import Rectangle

    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0 and p.get_width() > 0]


@pytest.mark.parametrize("path", [CPU_MARKS, V100], ids=["cpu_marks", "v100"])
def test_stages_plot_one_unit_and_legend_off_the_bars(path):
    parsed = parsed_once(need(path))
    fig, why = plots.make_figure(parsed, "stages")
    assert why is None
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_ylabel()]
    assert len({ax.get_ylabel() for ax in axes}) == 1  # same unit in every panel
    for ax in axes:
        legend = ax.get_legend().get_window_extent(renderer)
        for bar in _bars(ax):
            assert not legend.overlaps(bar.get_window_extent(renderer)), "the legend covers a bar"
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_layers_plot_labels_every_bar_with_its_number():
    from profparse.outputs.views import layers

    parsed = parsed_once(need(CPU_MARKS))
    prepared, why = layers.data(parsed)
    if prepared is None:
        pytest.skip(f"no layers in this version of the analyses: {why}")
    fig, _ = plots.make_figure(parsed, "layers")
    ax = fig.axes[0]
    wide = prepared["wide"]
    scale, _unit = plots.time_unit(float(wide.to_numpy().max()))
    expected = sorted(f"{v / scale:,.2f}" for v in wide.to_numpy().ravel() if v > 0)
    assert sorted(t.get_text() for t in ax.texts) == expected
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_layers_take_a_recomputed_layer_by_its_name_not_its_depth(tmp_path):
    """Activation checkpointing runs a layer again from the autograd engine, with no parent module: the recomputed
    layer sits at depth 0 and its Linear at the layers' depth. The view shows each layer once, the recomputation
    as its third bar (the kernel it launched), and no Linear row."""
    from profparse.outputs.views import layers

    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 200)
    b.py("nn.Module: Model_0", 1, 100)
    for i, t0 in enumerate((2, 45)):
        b.py(f"nn.Module: Layer_{i}", t0, 40)
        b.py(f"nn.Module: Linear_{i}", t0 + 1, 30)
        forward_op(b, "aten::mm", t0 + 2, 20, seq=10 + i)
        b.launch(t0 + 3, t0 + 8, 6 + i, name=f"gemm_{i}")
    backward_node(b, "MmBackward0", 110, 20, seq=11)
    b.launch(112, 115, 4, tid=AUTOGRAD, name="gemm_1_bwd")
    backward_node(b, "MmBackward0", 135, 30, seq=10)
    b.launch(137, 140, 10, tid=AUTOGRAD, name="gemm_0_bwd")
    backward_node(b, "CheckpointFunctionBackward", 170, 20, seq=98)
    b.py("nn.Module: Layer_1", 172, 15, tid=AUTOGRAD)  # the recomputation
    b.py("nn.Module: Linear_1", 173, 12, tid=AUTOGRAD)
    b.op("aten::mm", 174, 8, tid=AUTOGRAD)
    b.launch(175, 180, 3, tid=AUTOGRAD, name="gemm_1_again")
    parsed = profparse.parse(b.write(tmp_path / "recompute.json"))
    modules = parsed.modules
    again = modules[modules["recompute"]].set_index("module")["depth"]
    assert again.to_dict() == {"Layer_1": 0, "Linear_1": 1}  # the trace this view must read right
    prepared, why = layers.data(parsed)
    assert why is None and prepared["depth"] == 1
    wide = prepared["wide"]
    assert list(wide.index) == ["Layer_0", "Layer_1"]
    assert wide.loc["Layer_1", "backward (recompute)"] == 3 * US and wide.loc["Layer_0", "backward (recompute)"] == 0
    assert (wide.loc["Layer_0", "forward"], wide.loc["Layer_1", "forward"]) == (6 * US, 7 * US)


def test_every_registered_view_is_a_plot_kind():
    from profparse.outputs.views import views

    assert PLOT_KINDS == tuple(views())
    for kind, module in views().items():
        assert module.KIND == kind and module.TITLE and callable(module.data) and callable(module.draw)


def test_a_view_is_its_module_and_its_name_in_kinds():
    """Where a new plot goes: a module in outputs/views/ and its name in KINDS; plot, report and --kind read KINDS."""
    from profparse.cli import choices
    from profparse.outputs import plots, views

    modules = {p.stem for p in Path(views.__file__).parent.glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(views.KINDS)
    assert choices.PLOT_KINDS is views.KINDS and plots.PLOT_KINDS is views.KINDS


def test_roofline_points_have_their_math_modes_roof_and_one_label_per_op():
    """Each point's roof is the lower of its math mode's peak (the device's datasheet row) and intensity x memory
    bandwidth; labels are summarize's, one per op name whatever its stage."""
    from profparse.outputs.views import roofline

    parsed = parsed_once(need(SHARED_TRACES / "mi300x_resnet18_train.json.gz"))
    prepared, why = roofline.data(parsed)
    assert why is None
    points = prepared["points"]
    row = parsed.peak.row
    compute = np.array([row.tflops_for(m or "fp32") for m in points["math_mode"]])
    expected = np.minimum(compute, points["intensity"].to_numpy() * row.memory_gbps / 1e3)
    np.testing.assert_allclose(points["roof_tflops"], expected)
    np.testing.assert_allclose(points["of_roof"], points["tflops"] / expected)
    assert (points["roof_tflops"] <= max(compute)).all() and set(prepared["mode_peaks"]) <= set(points["math_mode"])
    assert points.groupby("name")["label"].nunique().eq(1).all()
    named = zip(points["name"], points["label"], strict=True)
    assert all(label == shorten_name(name, kernel=False) for name, label in named)
    fig = roofline.draw(prepared)  # several math modes: one roof line each, named
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert len(prepared["mode_peaks"]) >= 2  # bf16 convolutions, fp32 elementwise ops
    assert {f"{m} peak {v:g} TFLOP/s" for m, v in prepared["mode_peaks"].items()} <= labels


def _roofline_points(rows: list[tuple[str, str, float, float, float]]) -> dict:
    """A roofline's prepared data from (name, stage, intensity, TFLOP/s, GPU ms) rows, the most time first, on a
    device of 100 TFLOP/s and 1000 GB/s."""
    frame = pd.DataFrame(rows, columns=["name", "stage", "intensity", "tflops", "ms"])
    frame = frame.sort_values("ms", ascending=False, kind="stable").reset_index(drop=True)
    roof = np.minimum(100.0, frame["intensity"].to_numpy() * 1000 / 1e3)
    points = frame.assign(
        label=frame["name"],
        time_ns=frame["ms"] * 1e6,
        math_mode="bf16",
        roof_tflops=roof,
        of_roof=frame["tflops"] / roof,
    )
    return {"points": points, "basis": "GPU", "peak_tflops": 100.0, "mode_peaks": {"bf16": 100.0},
            "memory_gbps": 1000.0, "peak_note": "a test device", "trace": "t.json"}  # fmt: skip


def test_roofline_draws_ops_far_under_their_roof_on_its_floor_and_names_without_overlap():
    """Ops under 0.1% of the lowest roof are triangles on the plot's floor (the axis no longer spans their decades)
    and the caption counts them; the ops with the most time are named once each, no name over another or out of
    the plot, even where their points crowd."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from profparse.outputs.views import roofline

    crowd = [(f"aten::op_number_{i}", "forward", 0.1 * (1 + i / 50), 0.05, 10.0 - i) for i in range(8)]
    tiny = [("aten::add_", "optimizer", 0.2, 1e-7, 0.01), ("aten::mul_", "optimizer", 0.3, 2e-7, 0.01)]
    wide = [("aten::a_very_long_operator_name_on_the_right_edge", "backward", 90.0, 60.0, 20.0)]
    prepared = _roofline_points(crowd + tiny + wide)
    points = prepared["points"]
    floor = roofline.floor_tflops(points)
    assert floor == pytest.approx(1e-3 * points["roof_tflops"].min())  # the lowest roof: intensity 0.1 -> 0.1 TF
    fig = roofline.draw(prepared)
    ax = fig.axes[0]
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if len(c.get_offsets())])
    assert ys.min() == pytest.approx(floor) and (ys == pytest.approx(floor)).sum() == 2  # the two tiny ops
    assert ax.get_ylim()[0] <= floor and "2 (op, stage) points under" in ax.get_xlabel()
    renderer = FigureCanvasAgg(fig).get_renderer()
    texts = [t for t in ax.texts if t.get_text()]
    named = [t.get_text() for t in texts]
    assert named[0] == "a_very_long_operator_name_on_the_right_edge" and len(set(named)) == len(named) >= 2
    assert not {"add_", "mul_"} & set(named)  # under the floor: no name
    boxes = [t.get_window_extent(renderer) for t in texts]
    inside = ax.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, named[i]
        assert not any(box.overlaps(other) for other in boxes[i + 1 :]), named[i]
    above = _roofline_points(crowd)  # nothing far under its roof: no floor, no caption
    assert roofline.floor_tflops(above["points"]) is None
    assert "under" not in roofline.draw(above).axes[0].get_xlabel()


@pytest.mark.parametrize("kind", ["timeline", "critical_path"])
def test_step_labels_of_many_steps_do_not_overlap(tmp_path, kind):
    """300 steps in a few inches: the step labels drawn (measured by the renderer) never overlap, and there are
    still several of them, the first step's among them; the critical path's per-step rows keep one bar per step."""
    import matplotlib.pyplot as plt

    b = TraceBuilder()
    t0 = 0.0
    for step in range(1, 301):
        t0 = training_step(b, step, t0) + 1
    parsed = profparse.parse(b.write(tmp_path / "steps.json"))
    fig, why = plots.make_figure(parsed, kind)
    assert why is None and fig is not None
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)  # the layout as it is saved
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith("step ")]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda box: box.x0)
    assert 5 <= len(boxes) < 100 and labels[0].get_text() == "step 1"
    assert all(a.x1 <= b.x0 for a, b in pairwise(boxes)), [(a.x0, a.x1) for a in boxes[:6]]
    if kind == "critical_path":
        rows = fig.axes[1]
        ticks = [t for t in rows.get_yticklabels() if t.get_text()]
        tick_boxes = sorted((t.get_window_extent(renderer) for t in ticks), key=lambda box: box.y0)
        assert 5 <= len(ticks) < 100 and all(a.y1 <= b.y0 for a, b in pairwise(tick_boxes))
        assert len(rows.patches) >= 300 and len(rows.patches) % 300 == 0  # a bar per step and bound drawn
    plt.close(fig)


def test_a_step_far_from_every_span_does_not_stretch_the_timeline(tmp_path):
    """A step range with nothing in it, an hour after the trace's spans: its label was drawn an hour of axis away,
    and saving the figure with a tight box asked for a PNG of billions of pixels (exit 70). Labels are drawn over
    the part of a step inside the drawn span only."""
    b = TraceBuilder()
    t = training_step(b, 1, 0.0)
    b.annotation("ProfilerStep#2", t + 3.6e9, 1)
    write_plots(profparse.parse(b.write(tmp_path / "far.json")), tmp_path / "plots", kinds=["timeline"])
    assert_png(tmp_path / "plots" / "timeline.png")
    import matplotlib.image as mpimg

    height, width = mpimg.imread(tmp_path / "plots" / "timeline.png").shape[:2]
    assert width < 3000 and height < 1000


def test_timeline_draws_the_stages_over_an_other_span_that_overlaps_them(tmp_path):
    """ProfilerStep#1 began before the Python frame that holds its stages: its "other" span covered step 1 on the
    main thread without holding the stages, and the timeline drew it over them (all of step 1 grey on a capture
    with Python stacks). Step ranges are no stage's span now: the stages show."""
    from matplotlib.colors import to_rgb
    from tracebuilder import step_begun_before_its_frame

    from profparse.outputs.views import timeline
    from profparse.outputs.views._common import time_unit

    parsed = parsed_once(step_begun_before_its_frame(tmp_path / "t.json"))
    prepared, _ = timeline.data(parsed)
    fig = timeline.draw(prepared)
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    ax = fig.axes[0]
    scale, _ = time_unit(prepared["span_ns"])  # ns per x unit; the trace's first event is at 0
    main_row = 0
    for stage, (start_us, end_us) in (("forward", (30, 330)), ("optimizer", (650, 950))):
        x, y = ax.transData.transform(((start_us + end_us) / 2 * 1e3 / scale, main_row))
        pixel = image[int(round(image.shape[0] - y)), int(round(x))]
        assert np.abs(pixel - np.array(to_rgb(STAGE_COLORS[stage]))).max() < 0.05, (stage, pixel)


def test_memory_plot_spans_the_timeline_not_kinetos_window_end(tmp_path):
    """Kineto writes a "Record Window End" instant when the profiler stops (~100 ms after the last event of a
    capture): the memory plot's axis ran to it, half of it empty. It ends with the last event (the last step)."""
    from profparse.outputs.views import memory

    b = TraceBuilder()
    t, total = 0.0, 0
    for step in range(2):
        t0, t = t, training_step(b, step, t)
        for i in range(20):
            total += 1 << 20
            b.memory(t0 + 1 + i * 4, 1 << 20, total)
    b.events.append({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": t + 100_000.0})
    parsed = profparse.parse(b.write(tmp_path / "t.json"))
    prepared, _ = memory.data(parsed)
    assert prepared["span_ns"] == int(t * 1000)  # the last step's end, from the first event
