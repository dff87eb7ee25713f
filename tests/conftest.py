from __future__ import annotations

import functools
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

try:
    import fcntl
except ImportError:  # Windows: each worker makes its own (once_per_run)
    fcntl = None

# CI runs the property tests with a fixed seed sequence, so a landing never depends on luck; locally they explore.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# A shell that starts the tests in the background (`.ci/run &`) ignores SIGINT in them, and an ignored signal is
# inherited: the Ctrl-C tests' profparse processes would never see theirs. Restored before any worker starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tracebuilder, hta_oracle

REPO = TESTS.parent
SAMPLE_TRACES = REPO / "sample_traces"
# Real GPU traces: ../shared/traces where it is laid beside the clone (five traces), else the two MIT-licensed ones
# copied into the repository (sample_traces/gpu/), so every clone tests real NVIDIA and AMD traces.
REPO_GPU_TRACES = SAMPLE_TRACES / "gpu"
SHARED_TRACES = REPO.parent / "shared" / "traces"
if not SHARED_TRACES.is_dir():
    SHARED_TRACES = REPO_GPU_TRACES


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package's sources to bytecode once, in the controller before any worker starts: where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on CI's machines) every ``python -m profparse`` that a test starts would
    otherwise compile the modules it imports from source again (~0.3 s of a tiny trace's 1 s summarize). Python
    reads the ``__pycache__`` files that setting only stops it from writing; they are the repository's own
    (ignored by git)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import compileall

        compileall.compile_dir(REPO / "src" / "profparse", quiet=2)  # a read-only clone: as before


@pytest.fixture(scope="session")
def _session_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The capture's built models, shared by the tests of one run (building one takes seconds)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, _session_models: Path
) -> Path:
    """Every test gets an empty cache folder of its own (docs/cache.md): never the user's ~/.cache, and no
    test reads what another one parsed. CLI runs in subprocesses inherit it through the environment. Its
    ``models`` (where captures find the built model) is the run's shared one."""
    folder = tmp_path_factory.mktemp("cache")
    (folder / "models").symlink_to(_session_models, target_is_directory=True)
    monkeypatch.setenv("PROFPARSE_CACHE_DIR", str(folder))
    monkeypatch.delenv("PROFPARSE_CACHE_MAX_BYTES", raising=False)
    return folder


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder ``make(folder)`` filled, made once per test run: the pytest-xdist workers of one run share it
    (the first to ask makes it while the others wait on a lock), so a capture that several test files read runs
    once, not once per worker and file. A ``make`` that fails or skips leaves no folder behind: the next asker
    tries again."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder above the workers'
    folder, done = root / f"once-{name}", root / f"once-{name}.done"
    with open(root / f"once-{name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


def assert_same_frame(a: Any, b: Any, **kwargs: Any) -> None:
    """``pd.testing.assert_frame_equal(a, b, **kwargs)``, after a quick check that passes identical frames at once:
    the cache's own test of a table read back (``same_frame``: columns, dtypes, index and values, NaN equal to NaN),
    plus a categorical's categories in order and the index's type and names, which every option of
    assert_frame_equal accepts. assert_frame_equal compares column by column in Python: seconds for an events
    table."""
    import pandas as pd

    from profparse.cache.frames import same_frame

    def categories(frame: pd.DataFrame) -> list[object]:
        return [d.categories.tolist() for d in frame.dtypes if isinstance(d, pd.CategoricalDtype)]

    if (
        same_frame(a, b)
        and categories(a) == categories(b)
        and type(a.index) is type(b.index)
        and a.index.names == b.index.names
    ):
        return
    pd.testing.assert_frame_equal(a, b, **kwargs)


@functools.lru_cache(maxsize=16)
def parsed(path: Path, include_marks: bool = True):
    """Parse once per test session (tests must not modify what they get)."""
    import profparse

    return profparse.parse(path, include_marks=include_marks)


def shared_traces() -> list[Path]:
    return sorted(SHARED_TRACES.glob("*.json.gz")) if SHARED_TRACES.is_dir() else []


def sample_traces() -> list[Path]:
    return sorted(SAMPLE_TRACES.glob("*.json.gz")) if SAMPLE_TRACES.is_dir() else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "shared_trace" in metafunc.fixturenames:
        paths = shared_traces()
        metafunc.parametrize(
            "shared_trace",
            paths or [pytest.param(None, marks=pytest.mark.skip(reason="no GPU traces (../shared, sample_traces)"))],
            ids=[p.name for p in paths] or ["absent"],
        )
    if "sample_trace" in metafunc.fixturenames:
        paths = sample_traces()
        metafunc.parametrize(
            "sample_trace",
            paths or [pytest.param(None, marks=pytest.mark.skip(reason="no sample_traces/"))],
            ids=[p.name for p in paths] or ["absent"],
        )


#: The files that take longest (measured with --durations), slowest first. README command 2 runs the suite with
#: pytest-xdist's --dist loadfile, which hands whole files to the workers in collection order: these go first, so
#: the run does not end with one worker alone on a long file while the others wait.
SLOW_FILES = (
    "test_robustness.py",
    "test_ground_truth.py",
    "test_ranks.py",
    "test_report.py",
    "test_adversarial_inputs.py",
    "test_cache_replay.py",
    "test_capture.py",
    "test_output_digests.py",
    "test_replay.py",
    "test_adversarial_ranks.py",
    "test_cache.py",
    "test_advice_pairs.py",
    "test_adversarial_cli.py",
    "test_adversarial_outputs.py",
    "test_adversarial_integrations.py",
    "test_critical_path.py",
    "test_memory_categories.py",
    "test_integrations_handler.py",
    "test_random_gpu_traces.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run :data:`SLOW_FILES` first, in that order; every other file, and the tests within a file, keep theirs."""
    first = {name: place for place, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))
