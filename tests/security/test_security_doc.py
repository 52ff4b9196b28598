"""docs/security.md's attack table is the generator's output for the tests in tests/security.

The table is written by ``python -m tests.security.table`` from a run of tests/security; these
checks keep it from drifting: its format is the generator's, it lists exactly the tests that
exist with the attack, input and expected they declare, and every row passed when it was made.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.table import BEGIN, DOC, END, Row, parse, render, table_text

REPO_ROOT = Path(__file__).parents[2]
REGENERATE = (
    "regenerate it: SECURITY_TABLE=/tmp/security.json .venv/bin/pytest -q tests/security && "
    ".venv/bin/python -m tests.security.table /tmp/security.json"
)


def declared_rows(tmp_path: Path) -> list[Row]:
    """The rows tests/security declares, from a collection run (no test runs)."""
    target = tmp_path / "rows.json"
    env = {**os.environ, "SECURITY_ROWS": str(target)}
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*argv, "tests/security"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [Row(**row) for row in json.loads(target.read_text())]


def test_the_table_is_in_the_generators_format() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert render(parse(doc)) == table_text(doc)


def test_the_table_lists_every_attack_test_as_declared(tmp_path: Path) -> None:
    documented = [row.declared() for row in parse(DOC.read_text(encoding="utf-8"))]
    declared = declared_rows(tmp_path)
    assert {row.test for row in documented} == {row.test for row in declared}, REGENERATE
    assert sorted(documented, key=lambda r: r.test) == sorted(declared, key=lambda r: r.test), (
        REGENERATE
    )


def test_every_row_passed_when_the_table_was_made() -> None:
    rows = parse(DOC.read_text(encoding="utf-8"))
    assert rows, "the table is empty"
    failed = [row.test for row in rows if row.outcome != "passed"]
    assert failed == [], f"rows that did not pass: {failed}"


@pytest.mark.parametrize("text", ["a | b", "line\nbreak", ""])
def test_cells_survive_the_round_trip(text: str) -> None:
    row = Row("tests/security/test_x.py::test_y", text, "input", "expected", "seen", "passed")
    doc = f"intro\n{BEGIN}\n{render([row])}\n{END}\n"
    [back] = parse(doc)
    assert back.attack == " ".join(text.split())
