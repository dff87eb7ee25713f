"""A verb's result served from the cache (cache/replay, cli/common): a cached ``summarize`` prints the text the
first run printed, byte for byte, without importing pandas, numpy or pyarrow; plot, report and diff write the same
files; any change (trace, options, code, --no-cache) never serves a stale result.

Every test runs with its own empty PROFPARSE_CACHE_DIR (conftest's autouse fixture); CLI runs are fresh processes
(they inherit it), so ``sys.modules`` shows what a real run imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracebuilder import TraceBuilder, training_step

from profparse.cache import keys, sealed, store

REPO = Path(__file__).resolve().parent.parent


HEAVY = ("pandas", "numpy", "pyarrow")


# Runs profparse's main() and writes the heavy modules it imported into a file named by PROFPARSE_TEST_MODULES.
RUNNER = (
    "import json, os, sys\n"
    "from profparse.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stdout.flush(); sys.stderr.flush()\n"
    "heavy = [m for m in ('pandas', 'numpy', 'pyarrow') if m in sys.modules]\n"
    "open(os.environ['PROFPARSE_TEST_MODULES'], 'w').write(json.dumps(heavy))\n"
    "sys.exit(code)\n"
)


def cli(tmp_path: Path, *argv: str) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, heavy modules imported) of ``profparse ARGV`` in a fresh process."""
    flag = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PROFPARSE_TEST_MODULES": str(flag)}
    env.pop("PROFPARSE_PROFILE_PHASES", None)
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    heavy = json.loads(flag.read_text())
    flag.unlink()
    return proc.returncode, proc.stdout, proc.stderr, heavy


def texts() -> list[Path]:
    return sorted(Path(os.environ[store.DIR_ENV]).glob("e-*/text.*.json"))


def steps_trace(path: Path, steps: int = 3, kernel_us: float = 10) -> Path:
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        t = training_step(b, step, t)
    b.launch(t + 1, t + 2, kernel_us, name="extra")
    return b.write(path)


def truncated_trace(path: Path) -> Path:
    """A trace cut at 80 % of its bytes: read with a warning on stderr (not --strict)."""
    steps_trace(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.8)])
    return path


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "csv"])
def test_cached_summary_is_byte_identical_and_imports_no_pandas(tmp_path: Path, fmt: str) -> None:
    trace = truncated_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "summarize", str(trace), "--format", fmt)
    assert cold[0] == 0 and "truncated at byte" in cold[2] and cold[1]
    assert cold[3] == list(HEAVY)  # the first run parses
    assert len(texts()) == 1
    warm = cli(tmp_path, "summarize", str(trace), "--format", fmt)
    assert warm[:3] == cold[:3]  # exit code, stdout, stderr (the truncation warning again)
    assert warm[3] == []  # printed from the stored text
    uncached = cli(tmp_path, "summarize", str(trace), "--format", fmt, "--no-cache")
    assert uncached[:3] == cold[:3] and uncached[3] == list(HEAVY)


def test_quiet_hides_the_replayed_notes_only(tmp_path: Path) -> None:
    trace = truncated_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "summarize", str(trace))
    quiet = cli(tmp_path, "summarize", str(trace), "-q")
    assert quiet[3] == [] and quiet[1] == cold[1] and quiet[2] == "" and "warning" in cold[2]


def test_another_option_misses_then_hits(tmp_path: Path) -> None:
    trace = steps_trace(tmp_path / "t.json")
    default = cli(tmp_path, "summarize", str(trace), "--format", "json")
    top1 = cli(tmp_path, "summarize", str(trace), "--format", "json", "--top", "1")
    assert top1[3] == list(HEAVY)  # not served the default's text
    assert top1[1] != default[1] and len(texts()) == 2
    again = cli(tmp_path, "summarize", str(trace), "--format", "json", "--top", "1")
    assert again[3] == [] and again[:3] == top1[:3]
    other = cli(tmp_path, "summarize", str(trace), "--format", "json", "--no-marks")  # another entry
    assert other[3] == list(HEAVY)


def test_a_changed_trace_is_summarized_again(tmp_path: Path) -> None:
    trace = steps_trace(tmp_path / "t.json", steps=3)
    three = cli(tmp_path, "summarize", str(trace), "--format", "json")
    steps_trace(trace, steps=4)  # same path, new content
    four = cli(tmp_path, "summarize", str(trace), "--format", "json")
    assert four[3] == list(HEAVY)
    steps = {json.dumps(json.loads(out[1]).get("steps")) for out in (three, four)}
    assert len(steps) == 2  # the summary shows the new trace's steps
    assert four[:3] == cli(tmp_path, "summarize", str(trace), "--format", "json", "--no-cache")[:3]


def test_the_same_content_under_another_name_names_that_file(tmp_path: Path) -> None:
    first = truncated_trace(tmp_path / "first.json")
    second = tmp_path / "second.json"
    second.write_bytes(first.read_bytes())
    cli(tmp_path, "summarize", str(first))
    assert len(texts()) == 1
    code, out, err, _ = cli(tmp_path, "summarize", str(second))
    assert code == 0 and "first.json" not in out + err and "second.json" in err
    assert (code, out, err) == cli(tmp_path, "summarize", str(second), "--no-cache")[:3]


def test_the_stored_text_is_what_is_served_and_no_cache_ignores_it(tmp_path: Path) -> None:
    trace = steps_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "summarize", str(trace))
    (stored,) = texts()
    body = json.loads(stored.read_text())
    assert body["stdout"] == cold[1] and body["code"] == 0
    assert [f"profparse: {n}" for n in body["notes"]] == cold[2].splitlines() and body["notes"]  # its warnings
    body.update(stdout="from the cache\n", notes=["warning: replayed"], code=0)
    stored.write_text(sealed.sealed_json(body))  # sealed again: a text the cache wrote
    assert cli(tmp_path, "summarize", str(trace))[:3] == (0, "from the cache\n", "profparse: warning: replayed\n")
    assert cli(tmp_path, "summarize", str(trace), "--no-cache")[:3] == cold[:3]


def test_a_code_change_misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from profparse.cli.main import main

    trace = steps_trace(tmp_path / "t.json")
    assert main(["summarize", str(trace)]) == 0
    cold = capsys.readouterr()
    (stored,) = texts()
    body = json.loads(stored.read_text())
    stored.write_text(sealed.sealed_json({**body, "stdout": "STALE\n"}))
    assert main(["summarize", str(trace)]) == 0 and capsys.readouterr().out == "STALE\n"  # served while current
    monkeypatch.setattr(keys, "code_fingerprint", lambda: "another profparse")
    assert main(["summarize", str(trace)]) == 0
    assert capsys.readouterr().out == cold.out  # the older code's text is not served


def test_an_unreadable_text_is_removed_and_the_summary_recomputed(tmp_path: Path) -> None:
    trace = steps_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "summarize", str(trace))
    (stored,) = texts()
    stored.write_text('{"stdout": "cut')
    again = cli(tmp_path, "summarize", str(trace))
    assert again[0] == 0 and again[1] == cold[1]
    first, *rest = again[2].splitlines()
    assert first.startswith("profparse: warning: cached text ") and first.endswith("; removed")
    assert rest == cold[2].splitlines()
    assert cli(tmp_path, "summarize", str(trace))[:3] == cold[:3]  # stored again


def test_a_folder_of_ranks_is_not_served_from_texts(tmp_path: Path) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(2):
        steps_trace(folder / f"rank{rank}.json", kernel_us=10 + rank)
    first = cli(tmp_path, "summarize", str(folder), "-q")
    assert first[0] == 0 and texts() == []


def outputs_stored() -> list[Path]:
    return sorted(Path(os.environ[store.DIR_ENV]).glob("e-*/out.*"))


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def test_cached_plot_writes_the_same_files_without_drawing(tmp_path: Path) -> None:
    trace = truncated_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "cold"), "--format", "png")
    assert cold[0] == 0 and cold[3] == list(HEAVY) and len(outputs_stored()) == 1
    warm = cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "warm"), "--format", "png")
    assert warm[3] == []  # neither parsed nor drawn
    assert warm[0] == 0 and warm[1:3] == tuple(
        s.replace(str(tmp_path / "cold"), str(tmp_path / "warm")) for s in cold[1:3]
    )
    assert "truncated at byte" in warm[2] and "wrote " in warm[2]
    drawn = folder_files(tmp_path / "cold")
    assert drawn and folder_files(tmp_path / "warm") == drawn and all(n.endswith(".png") for n in drawn)
    forced = cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "warm"), "--format", "png", "--force")
    assert forced[0] == 0 and forced[3] == [] and folder_files(tmp_path / "warm") == drawn
    one = cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "one"), "--kind", "stages", "--format", "png")
    assert one[3] == list(HEAVY) and folder_files(tmp_path / "one") == {"stages.png": drawn["stages.png"]}


def test_a_stored_plot_missing_a_file_is_drawn_again(tmp_path: Path) -> None:
    trace = steps_trace(tmp_path / "t.json")
    cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "a"), "--format", "png", "--kind", "stages")
    (stored,) = outputs_stored()
    (stored / "stages.png").unlink()
    again = cli(tmp_path, "plot", str(trace), "-o", str(tmp_path / "b"), "--format", "png", "--kind", "stages")
    assert again[0] == 0 and again[3] == list(HEAVY)
    assert folder_files(tmp_path / "b") == folder_files(tmp_path / "a")


def test_cached_report_writes_the_same_page(tmp_path: Path) -> None:
    trace = truncated_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "report", str(trace), "-o", str(tmp_path / "cold.html"))
    assert cold[0] == 0 and cold[3] == list(HEAVY)
    warm = cli(tmp_path, "report", str(trace), "-o", str(tmp_path / "warm.html"))
    assert warm[3] == [] and warm[0] == 0 and warm[1] == cold[1]
    assert warm[2] == cold[2].replace("cold.html", "warm.html") and "truncated at byte" in warm[2]
    assert (tmp_path / "warm.html").read_bytes() == (tmp_path / "cold.html").read_bytes()
    refused = cli(tmp_path, "report", str(trace), "-o", str(tmp_path / "warm.html"))  # exists, no --force
    assert refused[0] != 0 and refused[2].startswith("profparse: error: ") and refused[2].count("\n") == 1
    assert refused[0] == cli(tmp_path, "report", str(trace), "-o", str(tmp_path / "warm.html"), "--no-cache")[0]
    assert cli(tmp_path, "report", str(trace), "-o", str(tmp_path / "warm.html"), "--force")[:2] == (0, "")


def test_cached_diff_is_byte_identical_and_keyed_by_both_traces(tmp_path: Path) -> None:
    a = truncated_trace(tmp_path / "a.json")
    b = steps_trace(tmp_path / "b.json", steps=4, kernel_us=30)
    cold = cli(tmp_path, "diff", str(a), str(b), "--format", "json")
    assert cold[0] == 0 and cold[3] == list(HEAVY) and "truncated at byte" in cold[2]
    warm = cli(tmp_path, "diff", str(a), str(b), "--format", "json")
    assert warm[3] == [] and warm[:3] == cold[:3]
    assert cli(tmp_path, "diff", str(a), str(b), "--format", "json", "--no-cache")[:3] == cold[:3]
    steps_trace(b, steps=5, kernel_us=30)  # B changed: A's entry holds no text for it
    changed = cli(tmp_path, "diff", str(a), str(b), "--format", "json")
    assert changed[3] == list(HEAVY) and changed[1] != cold[1]
    assert changed[:3] == cli(tmp_path, "diff", str(a), str(b), "--format", "json", "--no-cache")[:3]


def test_the_cache_opening_note_is_printed_warm_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(store.MAX_ENV, "lots")
    trace = steps_trace(tmp_path / "t.json")
    cold = cli(tmp_path, "summarize", str(trace))
    assert f"note: {store.MAX_ENV}='lots' is not a byte count" in cold[2].splitlines()[0]
    warm = cli(tmp_path, "summarize", str(trace))
    assert warm[3] == [] and warm[:3] == cold[:3]


def test_the_fingerprint_covers_the_reports_assets(tmp_path: Path) -> None:
    """The report writes its css/js into every page, so editing them in a checkout must miss the cached pages:
    the fingerprint of a copy of the package changes with its report.css, as with any .py file."""
    import importlib.util
    import shutil

    package = Path(keys.__file__).resolve().parents[1]
    copy = tmp_path / "profparse"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def fingerprint() -> str:
        spec = importlib.util.spec_from_file_location("keys_copy", copy / "cache" / "keys.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.code_fingerprint()

    before = fingerprint()
    assert fingerprint() == before  # the same files, the same fingerprint
    css = copy / "outputs" / "report" / "assets" / "report.css"
    css.write_text(css.read_text() + "\n/* edited */\n")
    assert fingerprint() != before
