"""The parser's choices (cli/choices.py) equal the library's, and building the parser imports no pandas."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_parser_choices_match_the_library() -> None:
    from profparse import diff, ranks
    from profparse.cli import choices
    from profparse.outputs import plots, summary

    assert choices.SUMMARY_FORMATS == summary.FORMATS and choices.SUMMARY_TOP_N == summary.TOP_N
    assert choices.DIFF_FORMATS == diff.FORMATS and choices.DIFF_TOP_N == diff.TOP_N
    assert choices.PLOT_KINDS == plots.PLOT_KINDS and choices.PLOT_FORMATS == plots.FORMATS
    assert choices.METRICS == tuple(ranks.METRICS) and choices.DEFAULT_METRIC == ranks.DEFAULT_METRIC


def test_building_the_parser_imports_no_pandas() -> None:
    code = (
        "import sys\n"
        "from profparse.cli.main import build_parser\n"
        "build_parser().parse_args(['summarize', 'x.json'])\n"
        "print(sorted(m for m in ('pandas', 'numpy', 'pyarrow', 'matplotlib') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.strip() == "[]"


def test_a_verb_is_its_module_and_its_name_in_verbs() -> None:
    """Where a new verb goes: ``cli/<verb>_cmd.py`` with ``add_parser`` and its name in ``VERBS``; the parser
    (and so ``--help``) is built from that tuple alone."""
    import argparse

    from profparse.cli import main

    modules = {p.stem.removesuffix("_cmd") for p in (REPO / "src" / "profparse" / "cli").glob("*_cmd.py")}
    assert modules == set(main.VERBS)
    sub = next(a for a in main.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == main.VERBS
