"""A catalogue command runs confined: what a tool the operator added (fed by the model) can reach.

One ``brokerd serve --only broker`` whose catalogue holds one tool per attack. The tool files use
only what every catalogue may say (no ``confine`` table), so each tool gets the default view: the
system directories and nothing else of the host.
"""

import contextlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.security.broker_api import BrokerClient
from tests.security.brokerd_run import RunningBrokerd, brokerd

OBJECT: dict[str, object] = {"type": "object", "properties": {}, "additionalProperties": False}
TOKEN = "xoxb-" + secrets.token_hex(12)
LINGER = f"{300 + secrets.randbelow(600)}.{secrets.randbelow(10**6):06d}"  # unique sleep time


def command_tool(folder: Path, name: str, argv: list[str], **extra: object) -> None:
    tool: dict[str, object] = {"name": name, "description": f"Attack tool {name}."}
    tool |= {"parameters": OBJECT, "run": {"kind": "command", "argv": argv}, **extra}
    (folder / f"{name}.json").write_text(json.dumps(tool))


class Listener:
    """A loopback TCP port that counts the connections it accepted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


class Paths:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.token = folder / "bot-token"
        self.audit_db = folder / "state" / "audit.db"
        self.written = folder / "written-by-a-tool"
        self.socket_dir = folder / "run"
        self.running: RunningBrokerd | None = None

    def shown(self, text: str) -> str:
        """Tool output for the table: one line, the test's folder shortened."""
        return " / ".join(text.replace(str(self.folder), "<folder>").strip().splitlines())

    def client(self) -> BrokerClient:
        assert self.running is not None
        return BrokerClient(self.running.socket("broker"))


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.sock.close()


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory, listener: Listener) -> Iterator[Paths]:
    folder = Path(tmp_path_factory.mktemp("confined"))
    paths = Paths(folder)
    paths.token.write_text(TOKEN + "\n")
    paths.token.chmod(0o600)
    catalogue = folder / "catalogue"
    catalogue.mkdir()
    state = f"ls {paths.socket_dir}; head -c 15 {paths.audit_db}"
    command_tool(catalogue, "read_token", ["cat", str(paths.token)])
    command_tool(catalogue, "read_state", ["sh", "-c", state])
    command_tool(catalogue, "write_host", ["sh", "-c", f"echo x > {paths.written}"])
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{listener.port} && echo connected"
    command_tool(catalogue, "reach_network", ["bash", "-c", connect])
    command_tool(catalogue, "show_env", ["env"])
    command_tool(catalogue, "show_limits", ["cat", "/proc/self/limits"])
    linger = f"setsid sleep {LINGER} & echo started; sleep {LINGER}"
    command_tool(catalogue, "outlive_timeout", ["sh", "-c", linger], timeout_s=1)
    variables = {
        "BROKERD_MATTERMOST_TOKEN_FILE": str(paths.token),
        "BROKERD_BROKER__AUDIT_DB": str(paths.audit_db),
        "BROKERD_BROKER__CATALOGUE_DIR": str(catalogue),
    }
    with brokerd(folder, variables, only=["broker"]) as running:
        paths.running = running
        yield paths
    _kill_lingering()


@pytest.fixture
def broker(confined: Paths) -> Iterator[BrokerClient]:
    client = confined.client()
    yield client
    client.close()


@pytest.mark.attack(
    attack="A command tool reads brokerd's bot token file",
    input="catalogue command `cat <mattermost_token_file>`",
    expected="the token file does not exist in the tool's view",
)
def test_a_tool_cannot_read_the_token_file(
    broker: BrokerClient, confined: Paths, observed: Callable[[str], None]
) -> None:
    answer = broker.call("read_token")
    observed(f"status {answer['status']}: {confined.shown(answer['result'])}")
    assert TOKEN not in answer["result"]
    assert answer["status"] == "error"


@pytest.mark.attack(
    attack="A command tool reads brokerd's state (sockets, audit log)",
    input="`ls <socket_dir>; head <audit_db>`",
    expected="neither exists in the tool's view",
)
def test_a_tool_cannot_see_brokerds_state(
    broker: BrokerClient, confined: Paths, observed: Callable[[str], None]
) -> None:
    answer = broker.call("read_state")
    observed(f"status {answer['status']}: {confined.shown(answer['result'])}")
    assert "broker.sock" not in answer["result"]
    assert "SQLite format" not in answer["result"]


@pytest.mark.attack(
    attack="A command tool writes to the host",
    input="`echo x > <a host folder>/written-by-a-tool`",
    expected="nothing is written on the host",
)
def test_a_tool_cannot_write_to_the_host(
    broker: BrokerClient, confined: Paths, observed: Callable[[str], None]
) -> None:
    answer = broker.call("write_host")
    observed(f"status {answer['status']}; file on the host: {confined.written.exists()}")
    assert not confined.written.exists()


@pytest.mark.attack(
    attack="A command tool reaches the network",
    input="bash `/dev/tcp/127.0.0.1:<port>` to a listening loopback port",
    expected="no connection arrives (own network namespace)",
)
def test_a_tool_has_no_network(
    broker: BrokerClient, listener: Listener, observed: Callable[[str], None]
) -> None:
    answer = broker.call("reach_network")
    observed(f"status {answer['status']}; connections accepted: {listener.accepted}")
    assert "connected" not in answer["result"]
    assert listener.accepted == 0


@pytest.mark.attack(
    attack="A command tool reads brokerd's environment",
    input="`env`",
    expected="no variable of brokerd's: only PATH, LANG, LC_ALL (and PWD, set by bubblewrap)",
)
def test_a_tool_gets_a_clean_environment(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    answer = broker.call("show_env")
    names = sorted(line.split("=", 1)[0] for line in answer["result"].splitlines() if "=" in line)
    observed(", ".join(names))
    assert set(names) <= {"LANG", "LC_ALL", "PATH", "PWD"}


@pytest.mark.attack(
    attack="A command tool uses unbounded memory, disk, processes or CPU",
    input="`cat /proc/self/limits`",
    expected="address space, file size, processes, CPU time and open files are limited",
)
def test_a_tool_runs_under_resource_limits(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    answer = broker.call("show_limits")
    limits = _limits(answer["result"])
    wanted = ("Max address space", "Max file size", "Max processes", "Max cpu time")
    shown = {name: limits.get(name, "?") for name in (*wanted, "Max open files")}
    observed(", ".join(f"{name[4:]} {value}" for name, value in shown.items()))
    for name in wanted:
        assert limits.get(name, "unlimited") != "unlimited", name
    assert int(limits["Max open files"]) <= 1024


@pytest.mark.attack(
    attack="A command tool leaves a process behind its timeout",
    input="`setsid sleep N &` then `sleep N`, tool timeout 1 s",
    expected="after the timeout no process of the tool is left on the host",
)
def test_the_whole_tree_dies_at_the_timeout(
    broker: BrokerClient, observed: Callable[[str], None]
) -> None:
    answer = broker.call("outlive_timeout")
    assert answer["status"] == "timeout", answer
    left = _lingering(wait_s=5.0)
    observed(f"status timeout; processes left: {len(left)}")
    assert left == []


def _limits(text: str) -> dict[str, str]:
    limits = {}
    for line in text.splitlines()[1:]:
        name, values = line[:26].strip(), line[26:].split()
        if values:
            limits[name] = values[1]  # the hard limit
    return limits


def _lingering(wait_s: float) -> list[int]:
    """Host processes running our unique sleep, once they had ``wait_s`` to go away (the
    kernel ends a PID namespace's processes after its init has died, not at the same instant)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if LINGER.encode() in argv:
                found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _kill_lingering() -> None:
    for pid in _lingering(wait_s=0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.attack(
    attack="A tool declares a folder that holds brokerd's secrets",
    input="`confine.read_only` = the folder of the token file and the audit log; `cat` both",
    expected="the folder is shown, the token file and the audit log in it are not",
)
def test_brokerds_files_stay_hidden_inside_a_declared_folder(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    shared = short_dir / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("public notes\n")
    token = shared / "bot-token"
    token.write_text(TOKEN + "\n")
    catalogue = short_dir / "catalogue"
    catalogue.mkdir()
    script = f"cat {shared}/notes.txt; cat {token}; head -c 15 {shared}/audit.db"
    command_tool(
        catalogue, "read_shared", ["sh", "-c", script], confine={"read_only": [str(shared)]}
    )
    variables = {
        "BROKERD_MATTERMOST_TOKEN_FILE": str(token),
        "BROKERD_BROKER__AUDIT_DB": str(shared / "audit.db"),
        "BROKERD_BROKER__CATALOGUE_DIR": str(catalogue),
    }
    with brokerd(short_dir, variables, only=["broker"]) as running:
        client = BrokerClient(running.socket("broker"))
        try:
            answer = client.call("read_shared")
        finally:
            client.close()
    observed(" / ".join(answer["result"].replace(str(shared), "<shared>").strip().splitlines()))
    assert "public notes" in answer["result"]
    assert TOKEN not in answer["result"]
    assert "SQLite format" not in answer["result"]
