"""MCP servers as tool sources, against the MCP project's real reference servers.

Every test runs a broker app (on a Unix socket, as brokerd serves it) whose catalogue includes
one or more confined stdio servers: mcp-server-time, mcp-server-git, server-filesystem and
server-everything (installed by ``make mcp-servers``), and tests/mcp/tiny_server.py (written
with the SDK) for the faults the others cannot show on demand.
"""

import json
import re
import socket
import subprocess
import threading
from pathlib import Path

import anyio
import pytest

from brokerd.mcp.config import McpServerConfig
from brokerd.mcp.server import McpServer
from tests.mcp.support import (
    broker_with,
    everything_server,
    filesystem_server,
    git_repo,
    git_server,
    servers_dir,
    time_server,
    tiny_server,
)

pytestmark = pytest.mark.anyio


def is_up(server: McpServer) -> bool:
    return server.state == "up"


async def test_find_tool_ranks_mcp_tools_with_the_catalogues(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    servers = [time_server(), git_server(repo), everything_server()]
    async with broker_with(tmp_path, servers) as broker:
        found = await broker.find("current time in a timezone")
        assert "time.get_current_time" in found["names"]
        assert (
            'How to call: call_tool(name="time.get_current_time", arguments={"timezone": <string>})'
            in found["result"]
        )
        # The shipped catalogue's clock_now ranks among them: one catalogue, one ranking.
        clock = await broker.find("clock now current time")
        assert {"clock_now", "time.get_current_time"} <= set(clock["names"])
        assert "git.git_log" in (await broker.find("git log commits"))["names"]
        # server-everything's names have hyphens: they are kept as they are.
        assert "everything.get-sum" in (await broker.find("sum of two numbers"))["names"]


async def test_calls_with_valid_and_invalid_arguments(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    async with broker_with(
        tmp_path, [time_server(), git_server(repo), everything_server()]
    ) as broker:
        now = await broker.call("time.get_current_time", {"timezone": "Europe/Paris"})
        assert now["status"] == "ok", now
        assert json.loads(now["result"])["timezone"] == "Europe/Paris"

        missing = await broker.call("time.get_current_time", {})
        assert missing["status"] == "invalid"
        assert "'timezone' is a required property" in missing["result"]
        assert "Nothing was run" in missing["result"]

        # server-everything's schemas are draft-07: a string is not a number there either.
        wrong = await broker.call("everything.get-sum", {"a": "two", "b": 3})
        assert wrong["status"] == "invalid"
        assert "at arguments.a: 'two' is not of type 'number'" in wrong["result"]
        total = await broker.call("everything.get-sum", {"a": 2, "b": 3})
        assert total == {"result": "The sum of 2 and 3 is 5.", "status": "ok"}

        log = await broker.call("git.git_log", {"repo_path": str(repo), "max_count": 5})
        assert log["status"] == "ok", log
        assert "First notes" in log["result"]

        # The server's own refusal is a tool error the model reads (an unknown timezone).
        bad_zone = await broker.call("time.get_current_time", {"timezone": "Mars/Olympus"})
        assert bad_zone["status"] == "error"
        assert "Mars/Olympus" in bad_zone["result"]


async def test_a_repeated_call_id_replays_without_running_again(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [tiny_server()]) as broker:
        first = await broker.call("tiny.process_id", {}, call_id="same-id")
        server = broker.server("tiny")
        attempts = server.attempts
        again = await broker.call("tiny.process_id", {}, call_id="same-id")
        assert first["status"] == "ok"
        assert again == {"result": first["result"], "status": "replayed", "recorded_status": "ok"}
        assert server.attempts == attempts
        other = await broker.http.post(
            "/v1/call_tool",
            json={
                "session": broker.session,
                "call_id": "same-id",
                "name": "tiny.crash",
                "arguments": {},
            },
        )
        assert other.status_code == 409
        assert server.state == "up"  # the conflicting call did not run


async def test_results_map_to_text_lines(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [everything_server()]) as broker:
        image = await broker.call("everything.get-tiny-image", {})
        assert image["status"] == "ok"
        assert re.search(r'^\[image: "image/png", \d+ bytes, not shown\]$', image["result"], re.M)
        structured = await broker.call("everything.get-structured-content", {"location": "Chicago"})
        assert json.loads(structured["result"]).keys() >= {"temperature", "conditions"}
        reference = await broker.call(
            "everything.get-resource-reference", {"resourceType": "Text", "resourceId": 1}
        )
        assert re.search(
            r'^\[resource: ".+", "text/plain", \d+ bytes of text, not shown\]$',
            reference["result"],
            re.M,
        ), reference
        links = await broker.call("everything.get-resource-links", {"count": 2})
        assert len(re.findall(r'^\[resource link: ".+" at ".+"', links["result"], re.M)) == 2, links


async def test_a_server_that_crashes_mid_call_comes_back(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [tiny_server()]) as broker:
        server = broker.server("tiny")
        before = await broker.call("tiny.process_id", {})
        crashed = await broker.call("tiny.crash", {})
        assert crashed["status"] == "error"
        assert "stopped during the call (exited with status 3" in crashed["result"]
        await server.wait_for(lambda server: server.state == "down")
        meanwhile = await broker.call("tiny.process_id", {})
        assert meanwhile["status"] == "error"
        assert "the MCP server tiny is not running (exited with status 3" in meanwhile["result"]
        assert "brokerd restarts it in 1 s" in meanwhile["result"]
        await server.wait_for(is_up)
        after = await broker.call("tiny.process_id", {})
        assert after["status"] == "ok"
        assert server.attempts == 2
        assert before["status"] == "ok"


async def test_list_changed_refreshes_the_catalogue(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [tiny_server()]) as broker:
        server = broker.server("tiny")
        assert "tiny.shout" not in (await broker.find("shout"))["names"]
        added = await broker.call("tiny.add_tool", {"name": "shout"})
        assert added == {"result": "added shout", "status": "ok"}
        await server.wait_for(lambda server: any(s.name == "tiny.shout" for s in server.tools))
        assert "tiny.shout" in (await broker.find("shout"))["names"]
        echoed = await broker.call("tiny.shout", {"text": "hi"})
        assert echoed == {"result": "shout: hi", "status": "ok"}


async def test_output_over_the_cap_is_cut(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [tiny_server()]) as broker:
        answer = await broker.call("tiny.write_bytes", {"count": 200_000})
        assert answer["status"] == "ok"
        body, _, note = answer["result"].rpartition("\n")
        assert body == "x" * 65536
        assert note == "[output cut at 65536 bytes; the tool produced more]"


async def test_a_slow_tool_is_stopped_at_its_timeout(tmp_path: Path) -> None:
    async with broker_with(tmp_path, [everything_server(timeout_s=1)]) as broker:
        answer = await broker.call(
            "everything.trigger-long-running-operation", {"duration": 30, "steps": 3}
        )
        assert answer["status"] == "timeout"
        assert answer["result"].startswith(
            "everything.trigger-long-running-operation timed out after 1 s and was stopped."
        )
        # The server is still up and answers the next call.
        assert (await broker.call("everything.echo", {"message": "still here"}))["status"] == "ok"


async def test_the_filesystem_server_sees_only_its_declared_path(tmp_path: Path) -> None:
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    private.mkdir()
    (shared / "notes.txt").write_text("shared notes\n")
    (private / "secret.txt").write_text("private words\n")
    # The server is told the whole test folder is its own; the sandbox shows it only "shared".
    server = filesystem_server([tmp_path], [str(shared)])
    async with broker_with(tmp_path, [server]) as broker:
        notes = await broker.call("files.read_text_file", {"path": str(shared / "notes.txt")})
        assert notes == {"result": "shared notes\n", "status": "ok"}
        secret = await broker.call("files.read_text_file", {"path": str(private / "secret.txt")})
        assert secret["status"] == "error"
        assert "private words" not in secret["result"]
        assert "ENOENT" in secret["result"] or "no such file" in secret["result"].lower()
        written = await broker.call(
            "files.write_file", {"path": str(shared / "new.txt"), "content": "x"}
        )
        assert written["status"] == "error"  # declared read-only
        assert not (shared / "new.txt").exists()


async def test_a_path_declared_rw_is_writable(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    # A :rw path makes its tools ask for approval (docs/approvals.md); this test is about the
    # sandbox.
    server = filesystem_server([shared], [f"{shared}:rw"], approval="auto")
    async with broker_with(tmp_path, [server]) as broker:
        written = await broker.call(
            "files.write_file", {"path": str(shared / "new.txt"), "content": "made"}
        )
        assert written["status"] == "ok", written
        assert (shared / "new.txt").read_text() == "made"


class Listener:
    """A loopback TCP port counting the connections it accepted."""

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


@pytest.mark.parametrize("network", [False, True])
async def test_a_stdio_server_reaches_the_network_only_when_declared(
    tmp_path: Path, network: bool
) -> None:
    listener = Listener()
    try:
        # approval = "auto": a server that may reach the network would ask (docs/approvals.md).
        server = tiny_server(network=network, approval="auto")
        async with broker_with(tmp_path, [server]) as broker:
            answer = await broker.call("tiny.connect", {"host": "127.0.0.1", "port": listener.port})
    finally:
        listener.sock.close()
    if network:
        assert answer["result"] == "connected"
        assert listener.accepted == 1
    else:
        assert answer["result"].startswith("no connection")
        assert listener.accepted == 0


class HttpEverything:
    """server-everything serving streamable HTTP on a loopback port, started and killed at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        program = servers_dir() / "node" / "node_modules" / ".bin" / "mcp-server-everything"
        env = {"PATH": "/usr/bin:/bin", "PORT": str(self.port)}
        self.process = subprocess.Popen(
            [str(program), "streamableHttp"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:  # it says when it listens
            if f"listening on port {self.port}" in line:
                return
        raise AssertionError(f"server-everything exited: {self.process.wait()}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_a_streamable_http_server_is_used_and_reconnected(tmp_path: Path) -> None:
    served = HttpEverything(free_port())
    served.start()
    try:
        url = f"http://127.0.0.1:{served.port}/mcp"
        config = McpServerConfig(name="web", url=url, approval="auto")  # a URL would ask
        async with broker_with(tmp_path, [config]) as broker:
            echoed = await broker.call("web.echo", {"message": "over http"})
            assert echoed == {"result": "Echo: over http", "status": "ok"}
            served.kill()
            lost = await broker.call("web.echo", {"message": "lost"})
            assert lost["status"] == "error"
            assert "the MCP server web" in lost["result"]
            server = broker.server("web")
            await server.wait_for(lambda server: server.state == "down")
            served.start()
            with anyio.fail_after(60):
                await server.wait_for(is_up)
            again = await broker.call("web.echo", {"message": "back"})
            assert again == {"result": "Echo: back", "status": "ok"}
    finally:
        served.kill()
