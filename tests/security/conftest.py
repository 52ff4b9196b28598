"""tests/security: each attack on the box's edges is one test, and one row of docs/security.md.

A test declares its row with ``@pytest.mark.attack(attack=..., input=..., expected=...)`` and
says what it saw with the ``observed`` fixture (a test that records nothing shows its outcome).
A test without the mark still gets a row, from its docstring: the first line is the attack, and
lines starting ``Input:`` and ``Expected:`` fill those columns.

With ``SECURITY_TABLE=<file.json>`` set, a run writes every row with its outcome to that file;
``python -m tests.security.table <file.json>`` then rewrites the table in docs/security.md.
With ``SECURITY_ROWS=<file.json>`` set, collection alone writes the declared rows (no outcome):
test_security_doc.py uses it to keep the document in step with the tests.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.security.table import Row, declared_row

TABLE_VARIABLE = "SECURITY_TABLE"
ROWS_VARIABLE = "SECURITY_ROWS"

_declared: dict[str, Row] = {}
_results: dict[str, Row] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "attack(attack, input, expected): one row of docs/security.md's table"
    )


# The checker of the table itself is not a row of it.
NOT_ROWS = frozenset({"test_security_doc.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if (
            here in item.path.parents
            and item.path.name not in NOT_ROWS
            and isinstance(item, pytest.Function)
        ):
            _declared[item.nodeid] = declared_row(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    if target := os.environ.get(ROWS_VARIABLE):
        rows = [row.as_json() for row in _declared.values()]
        Path(target).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    row = _declared.get(item.nodeid)
    if row is None or (report.when != "call" and report.passed):
        return
    seen = [str(value) for name, value in item.user_properties if name == "observed"]
    result = "passed" if report.passed else ("skipped" if report.skipped else "failed")
    _results[item.nodeid] = row.with_outcome("; ".join(seen), result)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(TABLE_VARIABLE)
    if not target or not _results:
        return
    rows = [_results[nodeid].as_json() for nodeid in _declared if nodeid in _results]
    Path(target).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


@pytest.fixture
def observed(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record what the attack met (one short line each); shown in the table's Observed column."""

    def record(text: str) -> None:
        request.node.user_properties.append(("observed", text))

    return record


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder for sockets (a Unix socket path must stay under about 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sec", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
