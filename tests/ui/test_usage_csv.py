"""The CSV cells and file names of the usage downloads: text a spreadsheet would run is made
plain text, numbers stay numbers, and a file name needs no quoting."""

from __future__ import annotations

import csv
import io

import pytest

from app.ui import usage_csv


@pytest.mark.parametrize(("value", "cell"), [
    ("=1+2", "'=1+2"), ("+SUM(A1)", "'+SUM(A1)"), ("-2+3", "'-2+3"), ("@cmd", "'@cmd"),
    ("\t=1", "'\t'=1"), ("\r=1", "'\r'=1"), ("nimble", "nimble"), ("a=b", "a=b"), ("", ""),
    ("ops;=cmd|' /C calc'!A0", "ops;'=cmd|' /C calc'!A0"), ("a, -1", "a, '-1"), ("a;\t=b", "a;'\t'=b"),
    ("a-b;c", "a-b;c"),
    (None, ""), (-5, -5), (12.5, 12.5),
])
def test_a_cell_that_would_run_is_made_text(value: object, cell: object) -> None:
    assert usage_csv.cell(value) == cell


def test_lines_are_rfc_4180_and_read_back() -> None:
    text = usage_csv.lines([["a, b", 'say "hi"', "=x"], [1, None, "line\nbreak"]])
    assert text.endswith("\r\n")
    assert list(csv.reader(io.StringIO(text))) == [["a, b", 'say "hi"', "'=x"], ["1", "", "line\nbreak"]]
    assert usage_csv.lines([["a;b", "t\tab", "plain", 3]]) == '"a;b","t\tab",plain,3\r\n'  # any locale's separator


def test_a_file_name_keeps_only_safe_characters() -> None:
    assert usage_csv.filename("arbiter-requests", "Équipe \"x\"; rm", "2025-03-01") == \
        "arbiter-requests-quipe_x_rm-2025-03-01.csv"
    assert usage_csv.filename("arbiter-usage", "", "2025-03-01") == "arbiter-usage-2025-03-01.csv"
