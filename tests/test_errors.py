"""The one rule for one-line errors (`specdec.errors.one_line`) and its users."""

from __future__ import annotations

import pytest

from specdec.errors import one_line


def test_first_line_stripped_or_the_class_name():
    assert one_line(ValueError("  bad K\nTraceback (most recent call last):\n  ...")) == "bad K"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line("no such store\nmore") == "no such store"
    assert one_line("   ") == "error"


def test_with_type_and_limit_as_a_failed_run_records_it():
    assert one_line(RuntimeError("out of memory\ndetails"), with_type=True) == "RuntimeError: out of memory"
    assert one_line(KeyError(), with_type=True) == "KeyError"
    assert one_line(ValueError("x" * 500), with_type=True, limit=300) == ("ValueError: " + "x" * 500)[:300]


def test_cli_fail_prints_one_line(capsys):
    from specdec.entrypoints.cli import fail

    with pytest.raises(SystemExit) as exc:
        fail("first\nsecond")
    assert exc.value.code == 2
    assert capsys.readouterr().err == "specdec: error: first\n"
