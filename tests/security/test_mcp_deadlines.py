"""An MCP server cannot make brokerd wait for ever or hold an unbounded listing.

One ``brokerd serve --only broker`` with the default bounds and three hostile stdio servers
(tests/security/fake_mcp.py): one never answers ``initialize``, one never answers ``tools/list``,
one lists page after page of 2 MB tools.
"""

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokerd.mcp.config import McpServerConfig
from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import RunningBrokerd, brokerd

FAKE_MCP = Path(__file__).with_name("fake_mcp.py")
DEFAULTS = McpServerConfig(name="defaults", command=("true",))
# Waiting for brokerd's own deadlines (the defaults above) to pass, twice, with room to spare.
LOG_WAIT_S = 4 * max(DEFAULTS.handshake_timeout_s, DEFAULTS.list_page_timeout_s) + 30
SERVERS = {"silent": "silent", "stalled": "stalled-list", "huge": "huge-pages"}


@pytest.fixture(scope="module")
def running() -> Iterator[RunningBrokerd]:
    folder = Path(tempfile.mkdtemp(prefix="secmcpd", dir="/tmp"))
    config = folder / "brokerd.toml"
    config.write_text(
        "".join(
            f'[[mcp]]\nname = "{name}"\n'
            f"command = {json.dumps([sys.executable, str(FAKE_MCP), mode])}\n"
            f"paths = {json.dumps([str(FAKE_MCP.parent)])}\n"
            for name, mode in SERVERS.items()
        )
    )
    variables = {
        "BROKERD_CONFIG": str(config),
        "BROKERD_BROKER__AUDIT_DB": str(folder / "audit.db"),
    }
    try:
        with brokerd(folder, variables, only=["broker"]) as process:
            yield process
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def down_lines(running: RunningBrokerd, server: str, count: int) -> list[str]:
    """The log's "is down" lines of ``server``, once there are ``count`` (or the wait is over)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        lines = [
            json.loads(line)["msg"]
            for line in running.log().splitlines()
            if line.startswith("{") and f"mcp server {server} is down" in line
        ]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


@pytest.mark.attack(
    attack="An MCP server never answers initialize",
    input="a stdio server that reads its input and never answers",
    expected=f"marked down after {DEFAULTS.handshake_timeout_s:g} s (`handshake_timeout_s`), "
    "one log line, restarted with backoff",
)
def test_a_server_that_never_answers_initialize_is_down_and_retried(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    lines = down_lines(running, "silent", 2)
    observed(" / ".join(lines[:2]))
    assert len(lines) >= 2, f"not marked down and retried: {lines}"
    assert "did not answer initialize within" in lines[0]


@pytest.mark.attack(
    attack="An MCP server never sends its tool listing",
    input="a server that answers initialize and never answers tools/list",
    expected=f"marked down after {DEFAULTS.list_page_timeout_s:g} s (`list_page_timeout_s`), "
    "one log line, restarted with backoff",
)
def test_a_server_that_never_lists_is_down_and_retried(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    lines = down_lines(running, "stalled", 2)
    observed(" / ".join(lines[:2]))
    assert len(lines) >= 2, f"not marked down and retried: {lines}"
    assert "did not send page 1 of tools/list within" in lines[0]


@pytest.mark.attack(
    attack="An MCP server lists page after page of huge tools",
    input="every tools/list page one tool with a 2 MB description, and a next cursor",
    expected=f"brokerd stops at {DEFAULTS.list_max_bytes >> 20} MiB of tools (`list_max_bytes`), "
    "offers none of them, marks the server down; its memory stays bounded",
)
def test_a_huge_listing_is_bounded(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    lines = down_lines(running, "huge", 1)
    rss = running.rss_bytes()
    client = BrokerClient(running.socket("broker"))
    try:
        offered = client.find("page0")
    finally:
        client.close()
    observed(f"{lines[0] if lines else 'no down line'}; brokerd RSS {rss >> 20} MiB")
    assert lines, "the huge listing was not refused"
    assert "listed over" in lines[0]
    assert not any(name.startswith("huge.") for name in offered)
    assert rss < 200 * 1024 * 1024
