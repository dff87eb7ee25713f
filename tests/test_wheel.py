"""The real wheel: built from a clean copy of the sources, installed (not editable) into a fresh venv, and the
installed ``profparse report`` and ``python -m profparse`` run there on a sample trace, with the report's assets.

Offline: the wheel is built without build isolation (setuptools from this venv) and installed with ``--no-deps``;
the fresh venv reaches the dependencies (numpy, pandas, ...) through a ``.pth`` line naming this venv's
site-packages, whose editable profparse it does not see (a ``.pth`` line adds a folder, it does not process the
folder's own ``.pth`` files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TRACES

SOURCE = REPO / "src" / "profparse"
TRACE = SAMPLE_TRACES / "qwen2_tiny_cpu_marks.json.gz"


def run(command: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=True, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy holding only what a release holds (no build folders, caches or egg-info)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(SOURCE, tree / "src" / "profparse", ignore=ignore)
    dist = tmp_path_factory.mktemp("dist")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation", "-w", str(dist)]
    run([*pip_wheel, "--no-index", "-q"], cwd=tree)
    (built,) = dist.glob("profparse-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; this venv's site-packages supply the dependencies."""
    root = tmp_path_factory.mktemp("venv") / "v"
    run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    python = root / "bin" / "python"
    purelib = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=root).stdout.strip()
    )
    (purelib / "zz_profparse_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    run([*install, str(wheel)], cwd=root)
    return root


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    """Every source file, the report's scripts and styles among them: package-data leaves none out."""
    expected = {
        p.relative_to(SOURCE.parent).as_posix()
        for p in SOURCE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    with zipfile.ZipFile(wheel) as archive:
        held = {name for name in archive.namelist() if name.startswith("profparse/")}
    assert expected - held == set()
    assert {"profparse/outputs/report/assets/report.js", "profparse/outputs/report/assets/report.css"} <= held


def test_the_installed_command_writes_the_report_with_its_assets(venv: Path, tmp_path: Path) -> None:
    where = run([str(venv / "bin" / "python"), "-c", "import profparse; print(profparse.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the installed copy, not the checkout
    run([str(venv / "bin" / "profparse"), "report", str(TRACE), "-o", "report.html", "-q"], cwd=tmp_path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    for asset in ("report.css", "report.js"):
        text = (SOURCE / "outputs" / "report" / "assets" / asset).read_text(encoding="utf-8")
        assert text in page


def test_python_dash_m_profparse_is_the_command(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    version = run([python, "-m", "profparse", "--version"], cwd=tmp_path).stdout
    assert version == run([str(venv / "bin" / "profparse"), "--version"], cwd=tmp_path).stdout
    summary = run([python, "-m", "profparse", "summarize", str(TRACE), "--format", "json"], cwd=tmp_path).stdout
    assert json.loads(summary)["totals"]
    bad = subprocess.run([python, "-m", "profparse", "summarize", str(tmp_path / "missing.json")], capture_output=True)
    assert bad.returncode == 3 and bad.stderr.count(b"\n") == 1  # the documented exit code, one line
