"""An MCP server brokerd runs for the box is confined like a catalogue command.

One ``brokerd serve --only broker`` whose TOML config declares three stdio servers: the real
filesystem server (told it may use the whole test folder, shown only ``shared/``, where
brokerd's token file, audit log and config also lie), the real server-everything, and
tests/mcp/tiny_server.py (written with the SDK) for the network and a flood.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokerd.mcp.config import McpServerConfig
from tests.mcp.support import everything_server, filesystem_server, tiny_server
from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.security.test_confinement import Listener

TOKEN = "xoxb-" + secrets.token_hex(12)
SECRET_VARIABLE = "HOST_SECRET_" + secrets.token_hex(4).upper()
MARKER = "mcp-sec-" + secrets.token_hex(8)  # on the tiny server's command line


class Setup:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.shared = folder / "shared"
        self.private = folder / "private"
        self.token = self.shared / "bot-token"
        self.audit_db = self.shared / "audit.db"
        self.config = self.shared / "brokerd.toml"
        self.running: RunningBrokerd | None = None

    def shown(self, text: str) -> str:
        return " / ".join(text.replace(str(self.folder), "<folder>").strip().splitlines())[:300]


def toml_table(config: McpServerConfig) -> str:
    lines = [
        f"name = {json.dumps(config.name)}",
        f"command = {json.dumps(list(config.command or ()))}",
    ]
    lines += [
        f"paths = {json.dumps(list(config.paths))}",
        f"network = {str(config.network).lower()}",
    ]
    return "[[mcp]]\n" + "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def setup(listener: Listener) -> Iterator[Setup]:
    folder = Path(tempfile.mkdtemp(prefix="secmcp", dir="/tmp"))
    ready = Setup(folder)
    ready.shared.mkdir()
    ready.private.mkdir()
    (ready.shared / "notes.txt").write_text("shared notes\n")
    (ready.private / "secret.txt").write_text("private words\n")
    ready.token.write_text(TOKEN + "\n")
    servers = [
        filesystem_server([folder], [str(ready.shared)]),
        everything_server(),
        tiny_server(MARKER),
    ]
    ready.config.write_text("\n".join(toml_table(server) for server in servers))
    variables = {
        "BROKERD_CONFIG": str(ready.config),
        "BROKERD_MATTERMOST_TOKEN_FILE": str(ready.token),
        "BROKERD_BROKER__AUDIT_DB": str(ready.audit_db),
        SECRET_VARIABLE: "do-not-pass-on",
    }
    try:
        with brokerd(folder, variables, only=["broker"]) as running:
            ready.running = running
            yield ready
    finally:
        _kill_marked()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.sock.close()


@pytest.fixture
def broker(setup: Setup) -> Iterator[BrokerClient]:
    assert setup.running is not None
    client = BrokerClient(setup.running.socket("broker"))
    yield client
    client.close()


@pytest.mark.attack(
    attack="An MCP server reads a host file outside its declared paths",
    input="filesystem server told the whole test folder is allowed, `paths` = its `shared/`; "
    "`read_text_file` of `private/secret.txt`",
    expected="the file does not exist in the server's view",
)
def test_an_mcp_server_sees_only_its_declared_paths(
    broker: BrokerClient, setup: Setup, observed: Callable[[str], None]
) -> None:
    answer = broker.call("files.read_text_file", {"path": str(setup.private / "secret.txt")})
    observed(f"status {answer['status']}: {setup.shown(answer['result'])}")
    assert "private words" not in answer["result"]
    assert "ENOENT" in answer["result"]
    notes = broker.call("files.read_text_file", {"path": str(setup.shared / "notes.txt")})
    assert notes["result"] == "shared notes\n"


@pytest.mark.attack(
    attack="An MCP server reads brokerd's secrets inside its declared folder",
    input="`read_text_file` of the bot token file, the audit log and brokerd's config, all in "
    "the declared folder",
    expected="none is shown: brokerd's own files are masked in every sandbox",
)
def test_an_mcp_server_cannot_read_brokerds_files(
    broker: BrokerClient, setup: Setup, observed: Callable[[str], None]
) -> None:
    seen = []
    for path in (setup.token, setup.audit_db, setup.config):
        answer = broker.call("files.read_text_file", {"path": str(path)})
        last_line = answer["result"].strip().splitlines()[-1]
        seen.append(f"{path.name}: {answer['status']}, {setup.shown(last_line)[:70]}")
        assert TOKEN not in answer["result"]
        assert "SQLite format" not in answer["result"]
        assert "[[mcp]]" not in answer["result"]
    observed("; ".join(seen))


@pytest.mark.attack(
    attack="An MCP stdio server reaches the network",
    input="a server's tool opens TCP to a listening loopback port (`network` not declared)",
    expected="no connection arrives (own network namespace)",
)
def test_an_mcp_server_has_no_network(
    broker: BrokerClient, listener: Listener, observed: Callable[[str], None]
) -> None:
    answer = broker.call("tiny.connect", {"host": "127.0.0.1", "port": listener.port})
    observed(f"{answer['result']}; connections accepted: {listener.accepted}")
    assert answer["result"].startswith("no connection")
    assert listener.accepted == 0


@pytest.mark.attack(
    attack="An MCP server reads brokerd's environment",
    input="server-everything's `get-env`",
    expected="only PATH, LANG and LC_ALL (and what its `env` declares)",
)
def test_an_mcp_server_gets_a_clean_environment(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    answer = broker.call("everything.get-env", {})
    names = sorted(json.loads(answer["result"]))
    observed(", ".join(names))
    assert SECRET_VARIABLE not in answer["result"]
    assert set(names) <= {"LANG", "LC_ALL", "PATH", "PWD"}


@pytest.mark.attack(
    attack="An MCP server floods brokerd with one huge message",
    input="a tool result of 20 MB (one JSON-RPC line)",
    expected="brokerd stops reading at 16 MiB and stops the server (restarted later); the call "
    "fails; brokerd's memory stays bounded",
)
def test_a_huge_message_stops_the_server_not_brokerd(
    broker: BrokerClient, setup: Setup, observed: Callable[[str], None]
) -> None:
    assert setup.running is not None
    before = setup.running.rss_bytes()
    answer = broker.call("tiny.write_bytes", {"count": 20_000_000})
    grown = setup.running.rss_bytes() - before
    shown = setup.shown(answer["result"])[:160]
    observed(f"status {answer['status']}: {shown}; RSS +{grown >> 20} MiB")
    assert answer["status"] == "error"
    assert "sent a message over 16777216 bytes" in answer["result"]
    assert grown < 200 * 1024 * 1024


@pytest.mark.attack(
    attack="An MCP server outlives brokerd",
    input="SIGTERM to brokerd while its servers run",
    expected="no process of any server is left on the host",
)
def test_no_server_outlives_brokerd(setup: Setup, observed: Callable[[str], None]) -> None:
    assert setup.running is not None
    # Another row may have just made the tiny server restart: wait until it runs again.
    assert _marked(wait_s=30.0, present=True), "the tiny server is not running"
    setup.running.process.send_signal(signal.SIGTERM)
    setup.running.process.wait(timeout=30)
    left = _marked(wait_s=5.0)
    observed(f"brokerd exited {setup.running.process.returncode}; processes left: {len(left)}")
    assert left == []


def _marked(wait_s: float, *, present: bool = False) -> list[int]:
    """Host processes with MARKER on their command line, once they had ``wait_s`` to go (or,
    with ``present``, to appear)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if MARKER.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
        if bool(found) == present or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _kill_marked() -> None:
    for pid in _marked(wait_s=0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
