"""Declared dependencies: every import of src/ is a requirement or an extra's, the HTA distribution is told
apart, and install hints name both a checkout and the package index."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO

from profparse.cli.main import main
from profparse.hta import HTA_DISTRIBUTIONS, hta_distribution

#: Imports that only optional code makes, and the extra that declares them; every other import of src/ is core.
OPTIONAL_IMPORTS = {"hta": "hta", "torch": "capture", "transformers": "capture", "safetensors": "capture",
                    "distributed": "dask", "dask": "dask"}  # fmt: skip


def _third_party_imports(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "profparse"}


def _requirement_names(requirements: list[str]) -> set[str]:
    """Distribution names a list of requirements installs; ``dask[distributed]`` counts ``distributed`` too (that
    extra of dask is the distribution of that name)."""
    names = set()
    for r in requirements:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", r)
        names.add(match.group(1))
        names |= {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
    return {n.lower().replace("_", "-") for n in names}


def test_every_import_of_src_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    # a module's distribution as installed here; the HTA module comes from either of two
    dist_of = {
        m: {d.lower().replace("_", "-") for d in ds} for m, ds in importlib.metadata.packages_distributions().items()
    }
    dist_of["hta"] = {d.lower() for d in HTA_DISTRIBUTIONS}
    imports = _third_party_imports(REPO / "src" / "profparse")
    assert {"numpy", "pandas", "pyarrow", "msgspec", "matplotlib", "tqdm", "hta", "torch"} <= imports
    for module in sorted(imports):
        dists = dist_of.get(module, {module})
        extra = OPTIONAL_IMPORTS.get(module)
        if extra is None:
            assert dists & core, f"src imports {module} ({dists}) but it is not a core dependency"
        else:
            assert dists & extras[extra], f"{module} ({dists}) is not in the {extra} extra"
            assert not dists & core, f"{module} is optional (the {extra} extra), not core"
    assert extras["hta"] == {"traceinsight"}  # the maintained distribution of HTA (0.6+)


def test_hta_distribution_prefers_traceinsight(monkeypatch):
    installed = {"traceinsight": "0.6.1", "HolisticTraceAnalysis": "0.5.0"}

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert hta_distribution() == ("traceinsight", "0.6.1")
    del installed["traceinsight"]
    assert hta_distribution() == ("HolisticTraceAnalysis", "0.5.0")
    installed.clear()
    assert hta_distribution() is None


def test_install_hints_say_checkout_and_index(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "hta", None)  # makes "import hta" fail
    assert main(["hta", str(tmp_path / "whatever.json.gz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("profparse: error: HTA is not installed") and err.count("\n") == 1
    assert "pip install -e '.[hta]'" in err and "pip install 'profparse[hta]'" in err
    hinted = [p for p in (REPO / "src").rglob("*.py") if "profparse[" in p.read_text(encoding="utf-8")]
    assert [p.name for p in hinted] == ["errors.py"]  # every hint comes from errors.install_hint


def _declared_floors() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floors = {}
    for requirement in project["dependencies"]:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement)
        floors[match.group(1).lower()] = match.group(2)
    return floors


def test_the_checked_floors_are_the_declared_ones():
    from profparse.base.requirements import FLOORS

    assert FLOORS == _declared_floors()
    floors = (REPO / ".ci" / "floors.txt").read_text(encoding="utf-8")
    for name, floor in FLOORS.items():  # CI installs exactly these
        assert re.search(rf"^{name}=={re.escape(floor)}(\.0)*$", floors, re.M), f".ci/floors.txt does not pin {name}"


def test_installed_versions_read_as_importlib_reads_them():
    from profparse.base.requirements import FLOORS, installed_versions

    assert installed_versions(list(FLOORS)) == {name: importlib.metadata.version(name) for name in FLOORS}


@pytest.mark.parametrize(
    ("installed", "named"),
    [
        ({"pandas": "1.5.3"}, "pandas 1.5.3 is installed; profparse needs pandas>=2.0"),
        (
            {"numpy": "2.1.0", "pyarrow": "14.0.2"},
            "pyarrow 14.0.2 is installed; profparse needs pyarrow>=16 with numpy 2",
        ),
        ({"numpy": "2.0.0", "matplotlib": "3.8.3"}, "matplotlib 3.8.3 is installed; profparse needs matplotlib>=3.8.4"),
        ({"xxhash": None}, "xxhash is not installed; profparse needs xxhash>=3.0"),
        ({"numpy": "2.0.2", "pandas": "2.1.4"}, "pandas 2.1.4 is installed; profparse needs pandas>=2.2.2 with numpy"),
    ],
)
def test_a_dependency_below_its_floor_is_one_line_exit_2(monkeypatch, capsys, tmp_path, installed, named):
    from profparse.base import requirements

    fine = {"numpy": "1.26.4", "pandas": "2.2.3", "pyarrow": "17.0.0", "matplotlib": "3.9.0", "msgspec": "0.18.6",
            "tqdm": "4.66.0", "xxhash": "3.4.1"}  # fmt: skip
    assert requirements.problems(fine) == []
    monkeypatch.setattr(requirements, "installed_versions", lambda names: {**fine, **installed})
    assert main(["summarize", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"profparse: error: {named}") and err.count("\n") == 1


def test_version_numbers_compare_as_releases():
    from profparse.base.requirements import version_tuple

    assert version_tuple("3.8.4") > version_tuple("3.8.3") > version_tuple("3.7")
    assert version_tuple("2.0.0rc1") == (2, 0, 0) and version_tuple("16.1.0") >= version_tuple("16")
