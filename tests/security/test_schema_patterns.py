"""A tool schema's regular expressions cannot freeze brokerd.

jsonschema matches ``pattern`` and ``patternProperties`` with the regex engine it is given; a
backtracking one takes time exponential in the argument for patterns such as
``^([a-z0-9]+-?)*$``, on the event loop that serves every socket. One ``brokerd serve --only
broker`` serves a catalogue and a fake MCP server (tests/security/fake_mcp.py) whose schemas hold
such patterns; a second brokerd is given a catalogue whose pattern needs backtracking.
"""

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import REPO_ROOT, STARTUP_TIMEOUT_S, RunningBrokerd, brokerd

FAKE_MCP = Path(__file__).with_name("fake_mcp.py")
CATASTROPHIC = "^([a-z0-9]+-?)*$"
WORDS = "^(\\w+\\s?)*$"
# 2**40 backtracking steps for CATASTROPHIC in Python's re: never answered if it runs there.
HOSTILE = "a" * 40 + "!"
# Far beyond what a checked call takes (milliseconds), far below what a backtracking one does.
ANSWER_TIMEOUT_S = 20.0


def clock_tool(name: str, parameters: dict[str, Any]) -> str:
    return json.dumps(
        {
            "name": name,
            "description": f"Current time ({name}).",
            "parameters": parameters,
            "run": {"kind": "builtin", "handler": "clock_now"},
        }
    )


SLUG_SCHEMA = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "pattern": CATASTROPHIC}},
}
NAMED_SCHEMA = {
    "type": "object",
    "patternProperties": {WORDS: {"type": "string"}},
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def running() -> Iterator[RunningBrokerd]:
    folder = Path(tempfile.mkdtemp(prefix="secre", dir="/tmp"))
    catalogue = folder / "catalogue"
    catalogue.mkdir()
    (catalogue / "slug_clock.json").write_text(clock_tool("slug_clock", SLUG_SCHEMA))
    (catalogue / "named_clock.json").write_text(clock_tool("named_clock", NAMED_SCHEMA))
    config = folder / "brokerd.toml"
    config.write_text(
        '[[mcp]]\nname = "fake"\n'
        f"command = {json.dumps([sys.executable, str(FAKE_MCP), 'patterns'])}\n"
        f"paths = {json.dumps([str(FAKE_MCP.parent)])}\n"
    )
    variables = {
        "BROKERD_CONFIG": str(config),
        "BROKERD_BROKER__AUDIT_DB": str(folder / "audit.db"),
        "BROKERD_BROKER__CATALOGUE_DIR": str(catalogue),
    }
    try:
        with brokerd(folder, variables, only=["broker"]) as process:
            yield process
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def broker(running: RunningBrokerd) -> Iterator[BrokerClient]:
    client = BrokerClient(running.socket("broker"), session="re-" + secrets.token_hex(4))
    client.http.timeout = httpx.Timeout(ANSWER_TIMEOUT_S)
    yield client
    client.close()


def timed_call(
    broker: BrokerClient, name: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    answer = broker.call(name, arguments)
    return answer, time.monotonic() - started


@pytest.mark.attack(
    attack="A catalogue schema's pattern freezes brokerd",
    input=f"`pattern` {CATASTROPHIC} (and `patternProperties` {WORDS} with "
    "`additionalProperties: false`), an argument of 40 letters and `!`",
    expected="the call is refused as not matching at once (patterns run on RE2, linear time)",
)
def test_a_catalogue_pattern_cannot_freeze_brokerd(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    slug, slug_s = timed_call(broker, "slug_clock", {"timezone": HOSTILE})
    named, named_s = timed_call(broker, "named_clock", {HOSTILE: "x"})
    observed(
        f"pattern: {slug['status']} in {slug_s:.3f} s; "
        f"patternProperties: {named['status']} in {named_s:.3f} s"
    )
    assert slug["status"] == "invalid"
    assert "does not match" in slug["result"]
    assert named["status"] == "invalid"
    assert "do not match any of the regexes" in named["result"]
    ok = broker.call("slug_clock", {"timezone": "utc"})
    assert ok["status"] != "invalid", ok["result"]


@pytest.mark.attack(
    attack="An MCP server's schema pattern freezes brokerd",
    input=f"a listed tool's inputSchema with `pattern` {CATASTROPHIC} (and one with "
    f"`patternProperties` {WORDS}), an argument of 40 letters and `!`",
    expected="the call is refused as not matching at once",
)
def test_an_mcp_schema_pattern_cannot_freeze_brokerd(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    slug, slug_s = timed_call(broker, "fake.slug", {"slug": HOSTILE})
    words, words_s = timed_call(broker, "fake.words", {HOSTILE: "x"})
    observed(
        f"pattern: {slug['status']} in {slug_s:.3f} s; "
        f"patternProperties: {words['status']} in {words_s:.3f} s"
    )
    assert slug["status"] == "invalid"
    assert "does not match" in slug["result"]
    assert words["status"] == "invalid"
    assert broker.call("fake.slug", {"slug": "a-b-c"})["result"] == "ran"


@pytest.mark.attack(
    attack="An MCP server lists a schema whose pattern needs a backtracking engine",
    input="inputSchema patterns `^(a+)\\1$` (a backreference) and `^(?=.*[0-9]).+$` (lookahead)",
    expected="those tools are not offered; one log line each names the tool and why",
)
def test_an_mcp_pattern_needing_backtracking_is_not_offered(
    running: RunningBrokerd, broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    log = running.log()
    lines = [
        json.loads(line)["msg"]
        for line in log.splitlines()
        if line.startswith("{") and "is not offered" in line
    ]
    observed(" / ".join(line[:160] for line in lines))
    for tool in ("echo_twice", "lookahead"):
        named = [line for line in lines if f"'{tool}'" in line]
        assert len(named) == 1, lines
        assert "linear time" in named[0]
        assert f"fake.{tool}" not in broker.find(tool)


@pytest.mark.attack(
    attack="A catalogue file's pattern needs a backtracking engine",
    input="a catalogue tool whose parameters have `pattern` `^(a+)\\1$`",
    expected="brokerd refuses the catalogue at startup (exit 2), one line naming the file and "
    "the pattern",
)
def test_a_catalogue_pattern_needing_backtracking_is_refused(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    catalogue = short_dir / "catalogue"
    catalogue.mkdir()
    schema = {
        "type": "object",
        "properties": {"timezone": {"type": "string", "pattern": "^(a+)\\1$"}},
    }
    (catalogue / "twice_clock.json").write_text(clock_tool("twice_clock", schema))
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
        "BROKERD_SOCKET_DIR": str(short_dir / "run"),
        "BROKERD_BROKER__AUDIT_DB": str(short_dir / "audit.db"),
        "BROKERD_BROKER__CATALOGUE_DIR": str(catalogue),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "brokerd", "serve", "--only", "broker"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        _, stderr = process.communicate(timeout=STARTUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("brokerd served a catalogue whose pattern needs backtracking")
    lines = stderr.decode().strip().splitlines()
    observed(f"exit {process.returncode}: {lines[-1][:200] if lines else ''}")
    assert process.returncode == 2
    assert len(lines) == 1, lines
    assert "twice_clock.json" in lines[0]
    assert "linear time" in lines[0]
