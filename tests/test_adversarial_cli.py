"""Adversarial command lines, file names and options (issue 25, items 7-10, 14 and nits).

Each case runs the CLI as a user does, in a fresh process (tests/adversarial.py), and asserts the documented
exit code, one ``profparse:`` line, no traceback, nothing left behind and inputs unchanged. Times are only compared
with a valid input measured in the same test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from adversarial import REPO, assert_clean_failure, assert_success, assert_time_within, run_cli, snapshot
from tracebuilder import TraceBuilder, training_step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file names as bytes, /proc (Linux)")

#: b"tr\xffce.json" as Python holds it (PEP 383): a name that is not UTF-8, as a Linux file system allows
NOT_UTF8 = b"tr\xffce.json".decode("utf-8", "surrogateescape")


def small_trace(path: Path, steps: int = 3, kernel: str = "gemm_fwd", op: str = "aten::mm", padding: str = "") -> Path:
    """A few training steps with GPU kernels; ``kernel`` names a forward kernel, ``op`` a forward op; ``padding``
    goes into an event's args (a valid file as large as one with long names)."""
    b = TraceBuilder()
    t = 1000.0
    for step in range(steps):
        t = training_step(b, step, t)
        b.launch(t - 60, t - 58, 3, name=kernel)
        b.op(op, t - 61, 4, padding=padding)
    return b.write(path)


# -- 7. file names that are not UTF-8 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "extra"),
    [
        ("summarize", ["--format", "json"]),
        ("summarize", ["--format", "markdown"]),
        ("parse", ["-o", "{tmp}/out"]),
        ("plot", ["-o", "{tmp}/plots", "--kind", "stages", "--kind", "top_kernels", "--format", "png"]),
        ("report", ["-o", "{tmp}/page.html"]),
    ],
)
def test_a_trace_named_in_bytes_that_are_not_utf8(tmp_path: Path, verb: str, extra: list[str]) -> None:
    """report, parse and plot exited 70 (UnicodeEncodeError writing the page, the Parquet metadata; matplotlib's
    set_text on the title): the name is shown with the byte escaped, ``tr\\xffce.json``, everywhere."""
    trace = small_trace(tmp_path / NOT_UTF8)
    before = snapshot(trace)
    argv = [verb, str(trace), "--no-cache", *(a.format(tmp=tmp_path) for a in extra)]
    run = run_cli(*argv)
    assert_success(run, folders=(tmp_path,))
    assert snapshot(trace) == before
    if verb == "summarize":
        shown = json.loads(run.stdout)["trace"] if "json" in argv else run.stdout
        assert "tr\\xffce.json" in shown
    elif verb == "parse":
        import pyarrow.parquet as pq

        source = pq.read_schema(tmp_path / "out" / "events.parquet").metadata[b"profparse.source"]
        assert source.decode("utf-8").endswith("tr\\xffce.json")
    elif verb == "plot":
        assert (tmp_path / "plots" / "stages.png").stat().st_size > 0
    else:
        page = (tmp_path / "page.html").read_bytes().decode("utf-8")  # strict: the page is valid UTF-8
        assert "<title>profparse report: tr\\xffce.json</title>" in page


def test_a_rank_folder_of_names_that_are_not_utf8(tmp_path: Path) -> None:
    """``parse DIR`` wrote each rank's name into the dataset's tables (Arrow: UTF-8 only): every rank failed with
    an internal error, exit 70."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        small_trace(ranks / (b"rank%d_\xfe.json" % rank).decode("utf-8", "surrogateescape"), steps=2 + rank)
    out = tmp_path / "dataset"
    run = run_cli("parse", str(ranks), "-o", str(out), "--no-cache", "-j", "1")
    assert_success(run, folders=(tmp_path,))
    listed = run_cli("summarize", str(out), "--format", "json")
    assert_success(listed)
    files = sorted(r["file"] for r in json.loads(listed.stdout)["ranks"])
    assert [Path(f).name for f in files] == ["rank0_\\xfe.json", "rank1_\\xfe.json"], files


def test_an_output_folder_named_in_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Arrow takes paths as UTF-8 text: ``parse -o`` such a name is refused before any work (exit 11), not an
    internal error after parsing."""
    trace = small_trace(tmp_path / "t.json")
    out = tmp_path / b"out\xfe".decode("utf-8", "surrogateescape")
    run = run_cli("parse", str(trace), "-o", str(out), "--no-cache")
    assert_clean_failure(run, 11, contains="out\\xfe: cannot write", folders=(tmp_path,))
    assert not out.exists()


# -- 8, 11. plot --dpi: a documented range, and a bounded image ----------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    header = path.read_bytes()[:24]
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


@pytest.mark.parametrize("dpi", ["1", "3", "5", "19"])
def test_plot_dpi_below_the_smallest_readable_one(tmp_path: Path, dpi: str) -> None:
    """--dpi 1-5 was an internal error (FreeType: "invalid ppem value", a 7 pt label under one pixel): the range
    starts at 20, checked by the parser before any work (exit 2)."""
    trace = small_trace(tmp_path / "t.json")
    run = run_cli("plot", str(trace), "-o", str(tmp_path / "plots"), "--dpi", dpi, "--no-cache")
    assert_clean_failure(run, 2, contains="--dpi", folders=(tmp_path,))
    assert "between 20 and 1000" in run.stderr
    assert not (tmp_path / "plots").exists()


def test_plot_at_the_smallest_dpi(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.json")
    run = run_cli("plot", str(trace), "-o", str(tmp_path / "plots"), "--dpi", "20", "--format", "png", "--no-cache")
    assert_success(run, folders=(tmp_path,))
    assert png_size(tmp_path / "plots" / "stages.png")[0] > 0


def test_plot_png_pixels_are_bounded(tmp_path: Path) -> None:
    """--dpi 1000 drew every figure at full size: 201 Mpixel for a tall top_ops, 2.1 GB and 74 s on a tiny trace.
    A PNG is now at most 16 Mpixel (drawn at the highest dpi that fits, with a note), in a time comparable with
    the default dpi's."""
    from profparse.cli.choices import PLOT_MAX_PIXELS
    from profparse.outputs.plots import MAX_PIXELS

    assert PLOT_MAX_PIXELS == MAX_PIXELS  # the option's help says the library's bound
    trace = small_trace(tmp_path / "t.json")
    argv = ["plot", str(trace), "--kind", "stages", "--format", "png", "--no-cache"]
    default = run_cli(*argv, "-o", str(tmp_path / "default"))
    assert_success(default, folders=(tmp_path,))
    big = run_cli(*argv, "-o", str(tmp_path / "big"), "--dpi", "1000")
    assert_success(big, folders=(tmp_path,))
    width, height = png_size(tmp_path / "big" / "stages.png")
    assert width * height <= 1.05 * MAX_PIXELS, (width, height)  # bbox_inches="tight" adds a few pixels
    assert width * height > 0.5 * MAX_PIXELS  # but the figure is as sharp as the bound allows
    assert "stages.png: drawn at" in big.stderr and "not 1000" in big.stderr, big.stderr
    assert big.seconds <= 3 * default.seconds + 4, (big.seconds, default.seconds)
    cached = run_cli(*argv[:-1], "-o", str(tmp_path / "again"), "--dpi", "1000")  # stored once, then copied
    assert_success(cached, folders=(tmp_path,))
    again = run_cli(*argv[:-1], "-o", str(tmp_path / "again2"), "--dpi", "1000")
    assert_success(again, folders=(tmp_path,))
    assert "stages.png: drawn at" in again.stderr, again.stderr  # the note is replayed with the stored figure
    assert png_size(tmp_path / "again2" / "stages.png") == (width, height)


# -- 9. long names: labels in linear time ------------------------------------------------------------------------------

LONG = 150_000


@pytest.mark.parametrize(
    "kernel",
    [
        "a" * LONG,  # one identifier: the namespace pattern restarted at each of its characters (92 s)
        "void " + "a" * LONG + "::k<int>(float)",
        "k" + ":" * LONG + "x<int>",  # a run of colons that is not before a separator
        "_ZN" + "1" * LONG + "fooE",  # a mangled length of 150,000 digits: int() refused it (exit 70)
        "_Z3fooI" + "1" * LONG + "E",  # digits after template arguments (finditer restarted per digit)
        "k" + "<" * LONG,  # nested templates: a RecursionError (exit 70)
    ],
    ids=["identifier", "namespace", "colons", "mangled-length", "mangled-args", "nested"],
)
def test_summarize_a_150k_character_kernel_name(tmp_path: Path, kernel: str) -> None:
    """Names are shortened from their first 4096 characters, by patterns that read each character a bounded number
    of times: a 150,000-character name costs about what the same bytes in an argument cost."""
    op = "aten::" + kernel.replace("<", "_")
    good = small_trace(tmp_path / "good.json", padding="x" * (len(kernel) + len(op)))
    bad = small_trace(tmp_path / "bad.json", kernel=kernel, op=op)
    assert abs(good.stat().st_size - bad.stat().st_size) < 2000
    good_run = run_cli("summarize", str(good), "--no-cache", "-q", fresh=True)
    assert_success(good_run)
    bad_run = run_cli("summarize", str(bad), "--no-cache", "-q", "--top", "20", timeout=60, fresh=True)
    assert_success(bad_run)
    assert_time_within(bad_run, good_run, factor=3)
    assert max(len(line) for line in bad_run.stdout.splitlines()) < 1000  # labels, not names


def test_report_of_many_20k_character_names(tmp_path: Path) -> None:
    """250 names of 20,000 characters in a 5 MB file took 50 s in report (2 s for short names)."""
    long_names = TraceBuilder()
    padded = TraceBuilder()
    t = 1000.0
    for step in range(3):
        t = training_step(long_names, step, t)
        training_step(padded, step, t - 100)
    for i in range(125):
        name = f"k{i}_" + "a" * 20_000
        long_names.launch(t + 10 * i, t + 10 * i + 2, 3, name=name)
        long_names.op(f"aten::op{i}_" + "b" * 20_000, t + 10 * i + 5, 2)
        padded.launch(t + 10 * i, t + 10 * i + 2, 3, name=f"k{i}", padding="a" * 20_000)
        padded.op(f"aten::op{i}", t + 10 * i + 5, 2, padding="b" * 20_000)
    bad, good = long_names.write(tmp_path / "long.json"), padded.write(tmp_path / "padded.json")
    good_run = run_cli("report", str(good), "-o", str(tmp_path / "good.html"), "--no-cache", "-q", fresh=True)
    assert_success(good_run, folders=(tmp_path,))
    bad_run = run_cli("report", str(bad), "-o", str(tmp_path / "bad.html"), "--no-cache", "-q", timeout=60, fresh=True)
    assert_success(bad_run, folders=(tmp_path,))
    assert_time_within(bad_run, good_run, factor=3)


# -- 10. terminal escapes in error lines -----------------------------------------------------------------------------

HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202e"  # clear the screen, set the window title (BEL), reverse the text


def assert_inert(stderr: str) -> None:
    """No raw control character or bidi override reached stderr: each is a visible escape."""
    assert not any(ch in stderr for ch in "\x1b\x07\u202e"), repr(stderr)
    assert "\\x1b[2J" in stderr and "\\u202e" in stderr, stderr


def test_rank_error_lines_escape_file_names(tmp_path: Path) -> None:
    """``rank N: error: <message>`` printed the rank file's name raw (cli/parse_cmd.py), here as parsed and as
    read back from the dataset."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    small_trace(ranks / "rank0.json")
    (ranks / f"rank1{HOSTILE}.json").write_text("not json at all")
    out = tmp_path / "dataset"
    run = run_cli("parse", str(ranks), "-o", str(out), "--no-cache", "-j", "1")
    assert_clean_failure(run, 7, contains="rank 1: error:", folders=(tmp_path,))
    assert_inert(run.stderr)
    again = run_cli("summarize", str(out), "--keep-going")  # the failed rank, read back from failed_ranks
    assert_success(again)
    assert "rank 1: error:" in again.stderr
    assert_inert(again.stderr)


@pytest.mark.parametrize(
    "argv",
    [
        ["summarize", "{trace}", "{tmp}/" + HOSTILE],  # unrecognized arguments: a glob that matched too much
        ["summarize", "{trace}", "--format", HOSTILE],  # invalid choice
        ["plot", "{trace}", "-o", "{tmp}/p", "--dpi", HOSTILE],  # a bad number, quoted with repr
        [HOSTILE],  # not a verb
    ],
    ids=["unrecognized", "choice", "number", "verb"],
)
def test_usage_errors_escape_the_command_line(tmp_path: Path, argv: list[str]) -> None:
    """argparse quoted the offending arguments raw in its one line ("unrecognized arguments: ...")."""
    trace = small_trace(tmp_path / "t.json")
    run = run_cli(*(a.format(trace=trace, tmp=tmp_path) for a in argv))
    assert_clean_failure(run, 2, folders=(tmp_path,))
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert not any(ch in run.stderr for ch in "\x1b\x07\u202e"), repr(run.stderr)


# -- 14. an error a Ctrl-C caused is an interrupt --------------------------------------------------------------------

NUMPY_FAILED = 'Importing the numpy C-extensions failed. ... PyCapsule_Import could not import module "datetime"'


def _numpy_import_broken_by(how: str) -> None:
    """What a Ctrl-C that lands while numpy loads looks like when it reaches the command line."""
    import signal

    if how == "context":  # caught, and another error raised while handling it
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError(NUMPY_FAILED)  # noqa: B904 - the implicit chain is the point
    if how == "cause":
        raise ImportError(NUMPY_FAILED) from KeyboardInterrupt()
    if how == "lost":  # caught in C, which raises its own error with no trace of it: only the signal tells
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise ImportError(NUMPY_FAILED)
    if how == "sigterm":
        try:
            signal.raise_signal(signal.SIGTERM)
        except BaseException:  # noqa: BLE001 - main's Terminated, caught as C code would
            pass
        raise ImportError(NUMPY_FAILED)
    raise ImportError(NUMPY_FAILED)  # "plain": a real bug


@pytest.mark.parametrize(
    ("how", "code", "line"),
    [
        ("context", 130, "profparse: interrupted"),
        ("cause", 130, "profparse: interrupted"),
        ("lost", 130, "profparse: interrupted"),
        ("sigterm", 143, "profparse: terminated (SIGTERM)"),
        ("plain", 2, "profparse: error: a dependency failed to import: "),
    ],
)
def test_an_error_a_signal_caused_is_that_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str, code: int, line: str
) -> None:
    """A Ctrl-C while numpy loads broke its import, and the ImportError hid the KeyboardInterrupt: exit 70 (seen
    once in test_ctrl_c_at_any_moment[parse]). An exception with a KeyboardInterrupt in its __cause__/__context__
    chain, or raised after SIGINT arrived, is exit 130 (SIGTERM: 143); the same ImportError without one is a broken
    dependency: one line and exit 2 (docs/exit-codes.md), never 70."""
    import signal

    from profparse.cli import main as cli
    from profparse.cli import summarize_cmd

    monkeypatch.delenv("PROFPARSE_DEBUG", raising=False)
    monkeypatch.setattr(summarize_cmd, "run", lambda args: _numpy_import_broken_by(how))
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert cli.main(["summarize", str(small_trace(tmp_path / "t.json"))]) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and len(err.splitlines()) == 1, err
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # put back
    assert cli.main(["summarize", "--help"]) == 0  # the next run in this process does not inherit the signal


# -- nits: csv rows, --peak-tflops ------------------------------------------------------------------------------------


def test_csv_quotes_names_that_hold_a_carriage_return(tmp_path: Path) -> None:
    """summarize --format csv quoted only fields with "\\n" (its line terminator): a kernel named "a\\rb" split its
    row in two for csv readers."""
    import csv
    import io

    trace = small_trace(tmp_path / "t.json", kernel="gemm\rsplit", op="aten::mm\rnext")
    run = run_cli("summarize", str(trace), "--format", "csv", "--no-cache", "-q", "--top", "20")
    assert_success(run)
    rows = list(csv.reader(io.StringIO(run.stdout, newline="")))
    assert rows[0] == ["step", "stage", "section", "name", "column", "value"]
    assert all(len(row) == 6 for row in rows), [row for row in rows if len(row) != 6][:3]
    names = {row[3] for row in rows}
    assert any("gemm\rsplit" in name for name in names), names
    assert any("aten::mm\rnext" in name for name in names), names
    assert run.stdout.endswith("\n") and "\r\n" not in run.stdout  # rows end in "\n"


FLOPS_TRACE = REPO / "sample_traces" / "qwen2_tiny_cpu_marks.json.gz"  # recorded shapes: an MFU per step


@pytest.mark.parametrize("value", ["1e-320", "5e-324", "1e-7", "1e300", "1.7e308"])
def test_peak_tflops_outside_the_float_range_of_the_mfu(tmp_path: Path, value: str) -> None:
    """--peak-tflops 1e-320 (and 1e300) leaked numpy's RuntimeWarning (overflow in divide / multiply) to stderr,
    with an MFU of 1e196 (or 0): outside 1e-06 to 1e+06 TFLOP/s it is a usage error, before any work."""
    if not FLOPS_TRACE.is_file():
        pytest.skip(f"{FLOPS_TRACE} not present")
    run = run_cli("summarize", str(FLOPS_TRACE), "--peak-tflops", value, "--no-cache")
    assert_clean_failure(run, 2, contains="--peak-tflops")
    assert "between 1e-06 and 1e+06" in run.stderr and "RuntimeWarning" not in run.stderr


def test_peak_tflops_at_its_bounds() -> None:
    if not FLOPS_TRACE.is_file():
        pytest.skip(f"{FLOPS_TRACE} not present")
    for value in ("1e-6", "1e6"):
        run = run_cli("summarize", str(FLOPS_TRACE), "--peak-tflops", value, "--no-cache", "-q", "--format", "json")
        assert_success(run)
        assert run.stderr == "", run.stderr
        assert any(s["mfu"] for s in json.loads(run.stdout)["efficiency"]["steps"]), "no MFU computed"
