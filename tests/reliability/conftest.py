"""The reliability suite's recording: one row per scenario, written to docs/reliability.md at
the end of a complete run when ``LOOPDTEST_WRITE_RELIABILITY=1`` (see ``write_table``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from loopd_dev import devserver
from tests.reliability.write_table import (
    DOCUMENT,
    WRITE_ENV,
    Row,
    render,
    scenario_of,
)

_ROWS: dict[str, Row] = {}
_NOTES: dict[str, list[str]] = {}
_DESELECTED: list[int] = [0]

Observe = Callable[[str], None]


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Observe:
    """Note what the scenario saw; the notes become its row's result."""
    notes = _NOTES.setdefault(request.node.nodeid, [])
    return notes.append


def _result(report: pytest.TestReport, nodeid: str) -> str:
    notes = "; ".join(_NOTES.get(nodeid, []))
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    if report.passed:
        return f"pass: {notes}" if notes else "pass"
    message = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
    return f"FAIL: {message[:200]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    found = scenario_of(getattr(item, "function", None))
    if found is None:
        return report
    failed_setup = report.when == "setup" and not report.passed and not report.skipped
    if report.when == "call" or failed_setup or hasattr(report, "wasxfail"):
        _ROWS[item.nodeid] = Row(item.name, found, _result(report, item.nodeid))
    return report


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED[0] += len(items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(WRITE_ENV) != "1" or not _ROWS:
        return
    # A partial run (-k, a single file) would write a table that passes for the whole suite.
    scenarios = [i for i in session.items if scenario_of(getattr(i, "function", None))]
    if _DESELECTED[0] or len(_ROWS) != len(scenarios) or len(scenarios) < 30:
        return
    command = "LOOPDTEST_WRITE_RELIABILITY=1 .venv/bin/pytest tests/reliability -q"
    DOCUMENT.parent.mkdir(parents=True, exist_ok=True)
    DOCUMENT.write_text(render(list(_ROWS.values()), command=command))


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    """A real router of this module's own, with room for one model (``--models-max 1``), so a
    scenario may kill it, restart it, or make it unload the model."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lrs") as tmp:
        server = start_real(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


def start_real(workdir: Path) -> devserver.RunningServer:
    try:
        return devserver.start(
            workdir,
            devserver.default_cache_dir(),
            socket_path=workdir / "llama.sock",
            layout=devserver.ServerLayout(models_max=1),
            load=(devserver.PLAIN_MODEL,),
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server is required and could not start: {exc}")
