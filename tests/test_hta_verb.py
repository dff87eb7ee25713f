"""``profparse hta``: HTA's kernel-type and idle-time breakdowns split by stage add up to HTA's own totals."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import parsed as parsed_once
from hta_oracle import HTA_MISSING

from profparse.cli.main import main


def test_verb_without_hta_says_to_install_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "hta", None)  # makes "import hta" fail
    code = main(["hta", str(tmp_path / "whatever.json.gz")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "hta extra" in err


hta = pytest.importorskip("hta", reason=HTA_MISSING)

from profparse.hta import UNMATCHED, hta_by_stage, hta_data, load_hta, render  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5.0 under pandas 3 (hta_notes.md)
_HTA: dict = {}


def hta_once(path):
    if path not in _HTA:
        _HTA[path] = load_hta(path)
    return _HTA[path]


@pytest.fixture(scope="module")
def loaded():
    cache: dict = {}

    def get(path):
        if path not in cache:
            cache[path] = hta_by_stage(parsed_once(path), ta=hta_once(path))
        return cache[path]

    return get


def test_per_stage_kernel_time_adds_up_to_hta_totals(shared_trace, loaded):
    result = loaded(shared_trace)
    assert result.unmatched == 0
    types = result.kernel_types
    assert set(types["stage"]) <= {"load", "forward", "backward", "optimizer", "other", UNMATCHED}
    ours = types.groupby("kernel_type")["time_us"].sum()
    ta = hta_once(shared_trace)
    _, all_kernels = ta.get_gpu_kernel_breakdown(visualize=False)
    theirs = all_kernels.groupby("kernel_type")["sum (us)"].sum()
    for kernel_type, value in theirs.items():
        assert ours[kernel_type] == pytest.approx(value, abs=1e-6), kernel_type
    # HTA's overlap-aware time, split by stage, adds up too (stages do not overlap on the GPU in these traces)
    merged = types.groupby("kernel_type")["hta_time_us"].sum()
    hta_merged = result.hta_kernel_types.set_index("kernel_type")["sum"]
    assert float(merged.sum()) == pytest.approx(float(hta_merged.sum()), rel=1e-3)


def test_hta_rows_join_the_right_profparse_kernels(shared_trace, loaded):
    parsed = parsed_once(shared_trace)
    ta = hta_once(shared_trace)
    from profparse.hta import hta_gpu_rows

    rows = hta_gpu_rows(ta, parsed)
    # HTA's event index is the position in traceEvents, like profparse's trace_index
    assert (rows["trace_index"] == rows["index"]).all()
    kernels = parsed.kernels.set_index("trace_index")
    assert (kernels.loc[rows["trace_index"], "stage"].astype(str).to_numpy() == rows["stage"].to_numpy()).all()


def test_per_stage_idle_time_adds_up_to_hta_idle_breakdown(shared_trace, loaded):
    result = loaded(shared_trace)
    ours = result.idle.groupby(["stream", "idle_category"])["idle_time_us"].sum()
    theirs = result.hta_idle.set_index(["stream", "idle_category"])["idle_time"]
    for key, value in theirs.items():
        assert float(ours.get(key, 0.0)) == pytest.approx(value, abs=0.01), key
    assert np.isclose(float(ours.sum()), float(theirs.sum()), atol=0.05)


def test_render_formats(loaded):
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "a100_ddp_rank0_nccl.json.gz"
    if not path.exists():
        pytest.skip("shared traces not present")
    data = hta_data(loaded(path))
    text = render(data, "text")
    assert "backward   COMMUNICATION" in text and "host wait" in text
    assert json.loads(render(data, "json"))["gpu_rows"] == data["gpu_rows"]
    assert "| stage | kernel type | kernels | ms | of stage |" in render(data, "markdown")


def test_hta_verb(capsys):
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "mi250_minitoy.json.gz"
    if not path.exists():
        pytest.skip("shared traces not present")
    assert main(["hta", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"profparse hta: {path}")
    assert "GPU kernel time by HTA kernel type, per stage" in out


def test_events_hta_s_rounding_makes_negative_are_counted_and_said(tmp_path, capsys):
    """HTA rounds each event's start up and its end down to whole microseconds: a kernel within one microsecond
    gets -1 us, which HTA's sums include. The verb keeps HTA's numbers and says how many there are; --exact has
    none."""
    from tracebuilder import TraceBuilder, training_step

    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        t = training_step(b, step, t)
    b.annotation("ProfilerStep#9", t + 1, 40)
    for i in range(3):  # within one microsecond each: [t + 10.2, t + 10.7] and so on
        b.launch(t + 2 + i, t + 10.2 + 2 * i, 0.5, name="tiny")
    path = b.write(tmp_path / "tiny.json")
    rounded = hta_by_stage(parsed_once(path))
    theirs = load_hta(path).t.get_trace(0).query("stream != -1")["dur"]
    assert rounded.negative == int((theirs < 0).sum()) == 3  # (traceinsight 0.6; HTA 0.5 rounds the same way)
    assert rounded.kernel_types["time_us"].sum() == pytest.approx(theirs.sum())  # HTA's own numbers, -1s in them
    assert main(["hta", str(path), "-q"]) == 0
    assert "3 GPU events under 1 us got -1 us from HTA's rounding" in capsys.readouterr().out
    exact = hta_by_stage(parsed_once(path), exact=True)
    assert exact.negative == 0 and "negative_duration_rows" in hta_data(exact)
    assert main(["hta", str(path), "-q", "--exact"]) == 0
    assert "rounding (its sums" not in capsys.readouterr().out


def test_empty_and_cut_traces_get_a_clear_error(tmp_path):
    """HTA reads the file itself: an empty or cut trace used to end with exit 1 and an empty or cryptic message."""
    from adversarial import assert_clean_failure, run_cli
    from tracebuilder import TraceBuilder, training_step

    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    assert_clean_failure(run_cli("hta", "-q", str(empty)), 4, contains="has no events")
    b = TraceBuilder()
    t = 0.0
    for step in range(20):
        t = training_step(b, step, t)
    whole = b.write(tmp_path / "whole.json").read_bytes()
    for fraction in (0.1, 0.5, 0.95):
        cut = tmp_path / f"cut{fraction}.json"
        cut.write_bytes(whole[: int(len(whole) * fraction)])
        assert_clean_failure(run_cli("hta", "-q", str(cut)), 4, contains="cut short (truncated at byte")


def test_a_correlation_id_used_by_two_calls_is_one_hta_row(tmp_path, capsys):
    """Two runtime calls with one correlation id (and its one kernel): HTA's own parse repeats the kernel's row
    whole, under the same index label, and the verb's lookups by label exited 70. Each row is taken once: the
    kernel's time counts once, as profparse's table has it."""
    from tracebuilder import AUTOGRAD, TraceBuilder, training_step

    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        t = training_step(b, step, t)
    b.annotation("ProfilerStep#3", t, 50)
    runtime, kernel = b.launch(t + 2, t + 5, 7, name="shared_id_kernel")
    b.span("cudaLaunchKernel", t + 3, 1, "cuda_runtime", AUTOGRAD, correlation=runtime["args"]["correlation"])
    path = b.write(tmp_path / "shared_id.json")
    assert load_hta(path).t.get_trace(0).index.duplicated().any()  # what HTA does with it
    result = hta_by_stage(parsed_once(path), exact=True)
    ours = parsed_once(path).kernels
    assert result.kernel_types["time_us"].sum() == pytest.approx(ours["dur_ns"].sum() / 1000)
    assert main(["hta", str(path), "-q"]) == 0
    assert "internal error" not in capsys.readouterr().err
