"""No function in ``src/profparse`` is longer than a screen: a long function holds several steps that want names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "profparse"
MAX_LINES = 80


def long_functions(package: Path = PACKAGE, limit: int = MAX_LINES) -> list[str]:
    """``file:line name (N lines)`` for every function or method longer than ``limit`` lines (with docstring)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_a_long_function_is_found(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(6))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_functions(tmp_path, limit=5) == [f"{tmp_path.name}/m.py:5 long (7 lines)"]


def test_no_function_is_longer_than_80_lines() -> None:
    assert long_functions() == []
