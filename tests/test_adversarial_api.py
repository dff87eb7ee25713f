"""The Python API's misuse is a profparse error with its exit code (issue 33 item 10): a trace path that is None,
bytes, a number, a list, an open file or a name with a NUL byte raised TypeError or ValueError."""

from __future__ import annotations

from pathlib import Path

import pytest

import profparse
from profparse.base.errors import InputNotFoundError, UsageError

BAD = {
    "none": (None, "NoneType"),
    "bytes": (b"trace.json", "bytes"),
    "int": (3, "int"),
    "list": (["trace.json"], "list"),
    "nul": ("tr\x00ace.json", "NUL byte"),
}


@pytest.mark.parametrize("function", ["load", "parse", "summarize"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_path_that_is_not_a_path_is_a_usage_error(function: str, case: str) -> None:
    value, said = BAD[case]
    with pytest.raises(UsageError, match=said) as caught:
        getattr(profparse, function)(value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("function", ["load", "parse", "summarize"])
def test_an_open_file_is_a_usage_error_that_says_to_pass_its_name(tmp_path: Path, function: str) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    with open(trace) as f, pytest.raises(UsageError, match=r"open file: pass its name"):
        getattr(profparse, function)(f)


def test_a_path_like_still_works_and_a_missing_one_is_exit_3(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError):
        profparse.load(tmp_path / "missing.json")
