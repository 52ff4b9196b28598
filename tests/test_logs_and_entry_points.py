"""What loopd's and brokerd's entry points share: one log line format, the anyio fix applied by
the entry points (never on import), by loopd's only for a command that runs an event loop."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

from brokerd.proxy.logs import make_handler
from loopcommon.logsetup import JsonLinesFormatter, rfc3339_utc

# 2025-12-01 14:23:07.215 UTC
CREATED = 1764598987.215


def _record() -> logging.LogRecord:
    record = logging.LogRecord(
        "loopd.serve", logging.WARNING, __file__, 1, "hello %s", ("you",), None
    )
    record.created = CREATED
    return record


def test_the_timestamp_is_rfc_3339_utc_with_milliseconds() -> None:
    assert rfc3339_utc(CREATED) == "2025-12-01T14:23:07.215Z"
    assert rfc3339_utc(0) == "1970-01-01T00:00:00.000Z"


def test_loopd_and_brokerd_write_the_same_json_line() -> None:
    loopd_line = JsonLinesFormatter().format(_record())
    brokerd_line = make_handler(io.StringIO(), json_lines=True, secrets=["nothing"]).format(
        _record()
    )
    assert brokerd_line == loopd_line
    assert json.loads(loopd_line) == {
        "ts": "2025-12-01T14:23:07.215Z",
        "level": "warning",
        "logger": "loopd.serve",
        "msg": "hello you",
    }


INSTALLED = (
    "from anyio._backends import _asyncio as a; from loopcommon import anyio_unix_connect as f; "
    "print(a.AsyncIOBackend.connect_unix.__func__ is f._connect_unix)"
)


def _python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout.strip()


def test_importing_the_packages_leaves_anyio_alone() -> None:
    imports = "import loopd, brokerd, loopd.cli.main, brokerd.cli, loopd.sessions, brokerd.serve"
    assert _python(f"{imports}; {INSTALLED}") == "False"


def test_brokerd_s_entry_point_applies_the_anyio_fix() -> None:
    run_main = (
        "from brokerd.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
    )
    assert _python(f"{run_main}{INSTALLED}").splitlines()[-1] == "True"


@pytest.mark.parametrize(("command", "applied"), [("selftest", "True"), ("sessions", "False")])
def test_loopd_applies_the_anyio_fix_for_a_command_that_runs_an_event_loop(
    command: str, applied: str
) -> None:
    # The command's handler, as ``main`` resolves it once the arguments are parsed.
    resolve = (
        "from loopd.cli.parser import build_parser\n"
        f"build_parser().parse_args([{command!r}]).handler.handler()\n"
    )
    assert _python(f"{resolve}{INSTALLED}").splitlines()[-1] == applied
