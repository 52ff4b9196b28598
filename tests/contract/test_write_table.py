"""The table writer: rows from recorded results, spliced between the markers."""

from __future__ import annotations

import pytest

from tests.contract.write_table import END, START, TableError, splice, table


def test_each_finding_gets_a_row_and_missing_runs_say_so() -> None:
    results = {
        "b": {
            "real": {"test": "test_b_x", "summary": "cache_n 0 | 613", "numbers": {}},
            "fake": {"test": "test_b_x", "summary": "cache_n 0 / 20", "numbers": {}},
        }
    }
    rows = table(results).splitlines()
    b_row = next(r for r in rows if r.startswith("| (b)"))
    assert "`test_b_x`" in b_row
    assert "cache_n 0 \\| 613" in b_row
    j_row = next(r for r in rows if r.startswith("| (j)"))
    assert j_row.count("not run") == 4
    pool_row = next(r for r in rows if r.startswith("| (d) unified pool with"))
    assert "no unified pool in the fake" in pool_row


def test_splice_replaces_only_the_table() -> None:
    document = f"intro\n{START}\nold\n{END}\noutro\n"
    assert splice(document, "new") == f"intro\n{START}\nnew\n{END}\noutro\n"


def test_splice_without_markers_is_refused() -> None:
    with pytest.raises(TableError, match="markers"):
        splice("no table here", "new")
