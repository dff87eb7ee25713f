"""profparse's own imports form no cycle: every import of a profparse module (at the top of a file or inside a
function) is read from the sources, and the graph they make has no strongly connected part of two or more."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "profparse"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> its file (a package by its ``__init__.py``)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the profparse modules it names in an import (``from a.b import c``: ``a.b.c`` when that is a
    module, else ``a.b``)."""

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name] |= {known(a.name) for a in node.names if a.name.split(".")[0] == "profparse"}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "profparse":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else known(node.module))
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.append(top)
                        if top == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_imports_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "profparse"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "one.py").write_text("def f():\n    from profparse.sub.two import g\n")
    (package / "sub" / "two.py").write_text("import profparse.sub.one\nfrom profparse.sub import one\n")
    graph = import_graph(module_files(package))
    assert graph["profparse.sub.one"] == {"profparse.sub.two"}
    assert graph["profparse.sub.two"] == {"profparse.sub.one"}
    assert cycles(graph) == [["profparse.sub.one", "profparse.sub.two"]]


def test_profparse_imports_have_no_cycle() -> None:
    found = cycles(import_graph(module_files()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(part) for part in found)


def private_imports(modules: dict[str, Path]) -> list[str]:
    """``module: from other import _name`` for every private function, class or constant one profparse module
    takes from another (a package's own ``_module`` is fine: it is the package's, shared by its modules)."""
    found = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "profparse":
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{node.module}.{alias.name}" not in modules:
                        found.append(f"{name}: from {node.module} import {alias.name}")
    return found


def test_private_imports_are_found(tmp_path: Path) -> None:
    package = tmp_path / "profparse"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_shared.py").write_text("")
    (package / "one.py").write_text("def _helper():\n    pass\n")
    (package / "two.py").write_text("from profparse.one import _helper\nfrom profparse import _shared\n")
    assert private_imports(module_files(package)) == ["profparse.two: from profparse.one import _helper"]


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(module_files()) == []


# The layers, lowest first: a module may import its own layer and the ones below it, never one above.
LAYERS = (
    ("base", ("profparse.base",)),
    ("trace", ("profparse.trace",)),
    ("stages", ("profparse.stages",)),
    ("tables", ("profparse.tables",)),
    ("analysis", ("profparse.analysis",)),
    ("outputs", ("profparse.outputs",)),
    ("cache", ("profparse.cache",)),
    ("verbs", ("profparse.api", "profparse.diff", "profparse.hta")),
    ("ranks", ("profparse.ranks",)),
    ("cli", ("profparse.cli",)),
    ("package", ("profparse", "profparse.__main__")),
    ("capture", ("profparse.capture",)),
    ("integrations", ("profparse.integrations",)),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (the package itself only by its own name)."""
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "profparse" and module.startswith(prefix + "."))
            if inside and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{module} lies in no layer: add it to LAYERS or move it into one"
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )


def test_an_upward_import_is_found() -> None:
    graph = {"profparse.trace.events": {"profparse.base.errors"}, "profparse.base.files": {"profparse.cli.main"}}
    assert upward_imports(graph) == ["profparse.base.files (base) imports profparse.cli.main (cli)"]


def test_every_module_lies_in_a_layer_and_no_import_runs_upward() -> None:
    graph = import_graph(module_files())
    assert upward_imports(graph) == []


def private_member_uses(modules: dict[str, Path]) -> list[str]:
    """``module:line: name._member`` wherever a module reaches into a private member of another profparse module
    or of a parsed trace (``parsed._x``); ``self._x`` and ``cls._x`` are a class's own."""
    found = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ours = {"parsed"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "profparse":
                ours |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                ours |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("profparse")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ours:
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def test_private_member_uses_are_found(tmp_path: Path) -> None:
    package = tmp_path / "profparse"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("def _helper():\n    pass\n")
    (package / "two.py").write_text(
        "import os\nfrom profparse import one\n\ndef f(parsed):\n    os._exit(0)\n    one._helper()\n    parsed._x\n"
    )
    assert private_member_uses(module_files(package)) == ["profparse.two:6: one._helper", "profparse.two:7: parsed._x"]


def test_no_module_touches_another_modules_private_members() -> None:
    assert private_member_uses(module_files()) == []
