"""Adversarial cases for the parsed-trace cache (profparse/cache/, docs/cache.md), issue 25 items 2, 3 and 12:
the cache never touches a folder or a file it did not make, never replays a text it did not write, survives any
damage to an entry (it is removed and rebuilt, never an exit 70), and reads an entry in less memory than parsing.

Every test starts with its own empty cache folder (conftest's autouse fixture sets PROFPARSE_CACHE_DIR)."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from adversarial import REPO, assert_success, run_cli, snapshot
from conftest import assert_same_frame
from tracebuilder import TraceBuilder, training_step

import profparse
from profparse.cache import folders, frames, sealed, store
from profparse.cli.main import main
from profparse.tables.registry import TABLES

#: every table an entry may store (``table.<name>.arrow``), by the property that reads it through the cache
PARSED_TABLES = tuple(name for name, spec in TABLES.items() if spec.stored)
OLD = time.time() - 3 * 3600  # older than the sweep's hour: what a killed run's leftovers look like


def small_trace(path: Path) -> Path:
    """Three training steps, one kernel per stage each, a [memory] event per step: a few dozen events."""
    b = TraceBuilder()
    t = 0.0
    for step in range(3):
        b.memory(t + 0.5, 1024, 4096 * (step + 1))
        t = training_step(b, step, t)
    b.launch(t + 1, t + 2, 10, name="extra")
    return b.write(path)


def cache_dir() -> Path:
    return Path(os.environ[store.DIR_ENV])


def entries(root: Path | None = None) -> list[Path]:
    return sorted(p for p in (root or cache_dir()).glob("e-*") if p.is_dir() and not p.is_symlink())


def seal(body: dict) -> str:
    """A stored JSON body as the cache writes it (with a valid checksum): what an attacker who read the code
    could plant. Before the checksums existed, plain JSON."""
    return sealed.sealed_json(body)


def run_main(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- item 2: the cache owns only a folder it made ---------------------------------------------------------------------


def test_a_folder_of_the_users_keeps_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFPARSE_CACHE_DIR naming a folder that holds the user's files: eviction deleted any non-empty ``stat/*``
    file that did not hold a live hash, and the sweep any ``.tmp-*`` older than an hour. Now the cache keeps its
    data in a subfolder it makes there, and every file of the user's stays as it was."""
    mine = tmp_path / "mine"
    (mine / "stat").mkdir(parents=True)
    (mine / "stat" / "todo.txt").write_text("buy milk\n")
    (mine / "stat" / ("0123456789abcdef" * 2)).write_text("a name the cache could have made\n")
    (mine / ".tmp-draft.txt").write_text("draft")
    (mine / f".tmp-{'a' * 32}").mkdir()
    (mine / f".tmp-{'a' * 32}" / "keep.txt").write_text("kept")
    (mine / "notes.md").write_text("hello")
    for path in mine.rglob("*"):
        os.utime(path, (OLD, OLD))
    monkeypatch.setenv(store.DIR_ENV, str(mine))
    before = snapshot(mine)
    trace = small_trace(tmp_path / "t.json")

    first = run_cli("summarize", str(trace), "--format", "json")
    assert_success(first)
    assert {k: v for k, v in snapshot(mine).items() if k in before} == before
    ours = mine / folders.SUBFOLDER
    assert set(snapshot(mine)) - set(before) <= set(snapshot(ours))  # all the cache wrote is in its subfolder
    assert f"the cache keeps its data in {ours}" in first.stderr
    assert (ours / folders.MARKER).read_bytes() == folders.MARKER_TEXT
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700
    assert len(entries(ours)) == 1 and not entries(mine)

    second = run_cli("summarize", str(trace), "--format", "json")  # the same folder again: the subfolder's entry
    assert_success(second)
    assert second.stdout == first.stdout and "keeps its data" not in second.stderr
    assert {k: v for k, v in snapshot(mine).items() if k in before} == before


def test_a_new_or_empty_folder_is_made_private_and_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = small_trace(tmp_path / "t.json")
    empty = cache_dir()
    new = tmp_path / "new" / "cache"
    monkeypatch.setenv(store.DIR_ENV, str(new))
    assert profparse.load(trace).cache is not None
    assert stat.S_IMODE(new.stat().st_mode) == 0o700  # before: 0755 (the umask's), readable by all
    assert (new / folders.MARKER).read_bytes() == folders.MARKER_TEXT and len(entries(new)) == 1

    monkeypatch.setenv(store.DIR_ENV, str(empty))
    assert [p.name for p in empty.iterdir()] == ["models"]  # conftest's: the built models alone, taken as it is
    assert profparse.load(trace).cache is not None
    assert (empty / folders.MARKER).read_bytes() == folders.MARKER_TEXT and len(entries(empty)) == 1


def test_a_marker_of_another_tool_is_not_profparses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other-cache"
    other.mkdir()
    (other / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# another tool's cache\n")
    monkeypatch.setenv(store.DIR_ENV, str(other))
    messages: list[str] = []
    assert profparse.load(small_trace(tmp_path / "t.json"), notify=messages.append).cache is not None
    assert not entries(other)
    assert entries(other / folders.SUBFOLDER)
    assert len(messages) == 1 and "keeps its data in" in messages[0]


def first_text(trace: Path) -> tuple[str, Path]:
    """The stdout of a cold ``summarize TRACE`` (text format) and the text it stored."""
    cold = run_cli("summarize", str(trace))
    assert_success(cold)
    (stored,) = cache_dir().glob("e-*/text.*.json")
    return cold.stdout, stored


def test_a_cache_folder_others_can_write_is_not_used(tmp_path: Path) -> None:
    """Another user who can write the folder could plant a text: the folder is refused, with a note."""
    trace = small_trace(tmp_path / "t.json")
    fresh, stored = first_text(trace)
    body = json.loads(stored.read_text())
    stored.write_text(seal({**body, "stdout": "owned\n"}))
    os.chmod(cache_dir(), 0o777)
    try:
        run = run_cli("summarize", str(trace))
    finally:
        os.chmod(cache_dir(), 0o700)
    assert_success(run)
    assert run.stdout == fresh
    assert "cache off: the cache folder" in run.stderr and "writable by other users" in run.stderr


@pytest.mark.parametrize("plant", ["escape", "exit_code", "edited"])
def test_a_planted_text_is_never_replayed(plant: str, tmp_path: Path) -> None:
    """A stored text with terminal escapes (in the text format, which never prints them), an exit code no
    result has, or an edit that does not match its checksum, is removed and the summary computed again."""
    trace = small_trace(tmp_path / "t.json")
    fresh, stored = first_text(trace)
    body = json.loads(stored.read_text())
    if plant == "escape":
        stored.write_text(seal({**body, "stdout": "\x1b]0;owned\x07\x1b[2J" + body["stdout"]}))
    elif plant == "exit_code":
        stored.write_text(seal({**body, "code": 42}))
    else:
        stored.write_text(json.dumps({**body, "stdout": body["stdout"].replace("forward", "f0rward")}))
    run = run_cli("summarize", str(trace))
    assert_success(run)
    assert run.stdout == fresh and "\x1b" not in run.stdout
    assert "profparse: warning: cached text " in run.stderr and "; removed" in run.stderr
    assert_success(again := run_cli("summarize", str(trace)))
    assert again.stdout == fresh and "cached text" not in again.stderr  # stored again


def test_names_the_cache_did_not_make_are_never_touched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In its own folder, eviction and the sweep remove only what the cache makes (real folders and regular
    files of its names), and never follow a symbolic link."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "meta.json").write_text("{}")
    (victim / "data.txt").write_text("precious")
    a, b = small_trace(tmp_path / "a.json"), small_trace(tmp_path / "b.json")
    b.write_text(b.read_text() + "\n")  # another content: another entry
    profparse.load(a)
    root = cache_dir()
    planted = {
        root / f"e-{'b' * 32}-{'c' * 16}": victim,  # an entry's name, a link to a folder
        root / f".tmp-{'d' * 32}": victim,  # a temporary's name, a link to a folder
        root / "stat" / ("e" * 32): victim / "data.txt",  # a stat record's name, a link to a file
    }
    (root / "stat").mkdir(exist_ok=True)
    for link, target in planted.items():
        link.symlink_to(target)
        os.utime(link, (OLD, OLD), follow_symlinks=False)
    (root / "notes.txt").write_text("mine")
    before = snapshot(victim)
    size = sum(f.stat().st_size for f in entries()[0].iterdir())
    monkeypatch.setenv(store.MAX_ENV, str(int(size * 1.5)))  # room for one entry: storing b evicts a
    profparse.load(b)
    assert len(entries()) == 1  # a's entry was evicted
    assert snapshot(victim) == before
    assert all(link.is_symlink() for link in planted) and (root / "notes.txt").read_text() == "mine"


# -- item 3: a damaged entry is removed and rebuilt -------------------------------------------------------------------


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Equal values, dtypes, columns and index (quicker than assert_frame_equal, in a loop of 24)."""
    return list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes) and a.equals(b)


def touch_tables(parsed: profparse.ParsedTrace) -> dict[str, pd.DataFrame]:
    """Every table, each read from the entry where stored (and stored where not)."""
    return {name: parsed.table(name) for name in PARSED_TABLES}


def test_bit_flips_in_any_stored_file_are_found_and_repaired(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """24 random bit flips (seeded), each in a random file of the entry (its Arrow tables, meta.json, the stored
    text): every one is noticed with one warning, the entry or file is removed and written again, and the
    tables and output are those of a run without the cache. Before, 6 of 24 such flips exited 70 and others
    went unnoticed (a flipped value decodes)."""
    trace = small_trace(tmp_path / "t.json")
    _, expected, usual = run_main(capsys, "summarize", str(trace), "--format", "json", "--no-cache")
    reference = touch_tables(profparse.load(trace, cache=False))
    assert run_main(capsys, "summarize", str(trace), "--format", "json") == (0, expected, usual)
    touch_tables(profparse.load(trace))  # every table stored
    (entry,) = entries()
    assert {p.name[len("table.") : -len(".arrow")] for p in entry.glob("table.*.arrow")} <= set(reference)
    rng = random.Random(25)
    for flip in range(24):
        (entry,) = entries()
        target = rng.choice(sorted(p for p in entry.rglob("*") if p.is_file()))
        data = bytearray(target.read_bytes())
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        target.write_bytes(bytes(data))
        heard: list[str] = []
        for name, frame in touch_tables(profparse.load(trace, notify=heard.append)).items():
            assert same(frame, reference[name]), f"flip {flip} in {target.name}: {name}"
        code, out, err = run_main(capsys, "summarize", str(trace), "--format", "json")
        assert code == 0 and out == expected, f"flip {flip} in {target.name}"
        heard += [line.removeprefix("profparse: ") for line in err.splitlines() if line not in usual.splitlines()]
        assert len(heard) == 1, f"flip {flip} in {target.name} (bit {bit}): {heard}"
        assert "unreadable" in heard[0] and "removed" in heard[0], heard
    heard = []
    touch_tables(profparse.load(trace, notify=heard.append))
    assert heard == [] and run_main(capsys, "summarize", str(trace), "--format", "json") == (0, expected, usual)


def test_meta_json_with_wrong_types_is_rebuilt(tmp_path: Path) -> None:
    """A meta.json of the right shape but wrong types made every later run exit 70 (AttributeError)."""
    trace = small_trace(tmp_path / "t.json")
    cold = run_cli("summarize", str(trace), "--format", "json")
    assert_success(cold)
    (entry,) = entries()
    for text in entry.glob("text.*.json"):
        text.unlink()  # so the next summarize reads the entry, not its stored text
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "files": sorted(meta["files"]), "rows": "many"}))
    run = run_cli("summarize", str(trace), "--format", "json")
    assert_success(run)
    assert run.stdout == cold.stdout
    warnings = [line for line in run.stderr.splitlines() if line not in cold.stderr.splitlines()]
    assert len(warnings) == 1 and warnings[0].startswith("profparse: warning: cache entry ")
    assert "parsing again" in warnings[0]
    assert isinstance(json.loads((entries()[0] / "meta.json").read_text())["files"], dict)  # written again


def test_any_error_reading_an_entry_is_a_miss(tmp_path: Path) -> None:
    """Even a meta.json whose checksum matches (an older profparse's bug, a hand edit) but whose types do not."""
    trace = small_trace(tmp_path / "t.json")
    reference = touch_tables(profparse.load(trace, cache=False))
    profparse.load(trace)
    (entry,) = entries()
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(seal({**meta, "files": sorted(meta["files"]), "process_names": 7}))
    heard: list[str] = []
    warm = profparse.load(trace, notify=heard.append)
    assert len(heard) == 1 and "is unreadable" in heard[0] and "parsing again" in heard[0]
    for name, frame in touch_tables(warm).items():
        assert_same_frame(frame, reference[name], check_exact=True, obj=name)
    assert profparse.load(trace, notify=heard.append).cache is not None and len(heard) == 1  # rebuilt


# -- item 12: a warm read holds one copy ------------------------------------------------------------------------------

READ_PEAK = (
    "import sys, pyarrow as pa\n"
    "from pathlib import Path\n"
    "from profparse.cache.frames import read_frame\n"
    "frame = read_frame(Path(sys.argv[1]))\n"
    "peak = sum(pool.max_memory() for pool in {pa.default_memory_pool(), pa.system_memory_pool()})\n"
    "print(peak, int(frame.memory_usage(deep=False).sum()))\n"
)


@pytest.mark.parametrize("batches", [1, 8])
def test_reading_a_stored_table_holds_one_copy(batches: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrow's allocations while reading a stored table, in a fresh process (its pools' peaks: deterministic,
    unlike RSS): about the frame itself (1.0x; 1.2x with batches: one column's are joined at a time). The whole
    Arrow table and then its pandas copy took twice the frame."""
    import numpy as np

    rows = 400_000
    monkeypatch.setattr(frames, "BATCH_ROWS", rows // batches)
    rng = np.random.default_rng(12)
    frame = pd.DataFrame({f"c{i}": rng.integers(0, 1 << 40, rows) for i in range(12)})
    frame["name"] = pd.Categorical(rng.choice(["aten::mm", "aten::add", "Memcpy"], rows))
    path = tmp_path / "table.arrow"
    frames.write_frame(path, frame)
    assert_same_frame(frames.read_frame(path), frame, check_exact=True)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-c", READ_PEAK, str(path)], capture_output=True, text=True, env=env, check=True
    ).stdout
    peak, size = map(int, out.split())
    assert peak < 1.5 * size, f"Arrow's peak {peak / 2**20:.1f} MB for a {size / 2**20:.1f} MB frame"
