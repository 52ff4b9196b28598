"""The real MCP servers of tests/mcp, and a broker serving them on a Unix socket.

The servers are the MCP project's reference servers, installed by ``make mcp-servers``
(``scripts/mcp-servers.sh``) into the cache outside the repository. When they are missing the
tests that need them fail naming the command; they are never skipped.
"""

import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from brokerd.mcp.config import McpServerConfig
from brokerd.mcp.server import McpServer
from brokerd.mcp.servers import McpServers
from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import DEFAULT_CATALOGUE_DIR, BrokerSettings
from tests.brokerd.tools.brokertools_support import serving

REPO_ROOT = Path(__file__).parents[2]
TINY_SERVER = Path(__file__).with_name("tiny_server.py")
INSTALL = "make mcp-servers (scripts/mcp-servers.sh)"


def servers_dir() -> Path:
    cache = Path(os.environ.get("LOOPDEV_CACHE_DIR", Path.home() / ".cache" / "loopd"))
    folder = cache / "mcp"
    for program in (
        folder / "python" / "bin" / "mcp-server-time",
        folder / "python" / "bin" / "mcp-server-git",
        folder / "node" / "node_modules" / ".bin" / "mcp-server-filesystem",
        folder / "node" / "node_modules" / ".bin" / "mcp-server-everything",
    ):
        if not os.access(program, os.X_OK):
            pytest.fail(f"the real MCP server {program.name} is missing: run {INSTALL}")
    return folder


def time_server(**extra: Any) -> McpServerConfig:
    program = servers_dir() / "python" / "bin" / "mcp-server-time"
    return McpServerConfig(name="time", command=(str(program), "--local-timezone", "UTC"), **extra)


def git_server(repo: Path, **extra: Any) -> McpServerConfig:
    program = servers_dir() / "python" / "bin" / "mcp-server-git"
    return McpServerConfig(
        name="git",
        command=(str(program), "--repository", str(repo)),
        paths=(str(repo),),
        **extra,
    )


def filesystem_server(
    allowed: Sequence[Path], paths: Sequence[str], **extra: Any
) -> McpServerConfig:
    """The filesystem server told it may use ``allowed``; the sandbox shows it ``paths``."""
    program = servers_dir() / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
    return McpServerConfig(
        name="files",
        command=(str(program), *(str(folder) for folder in allowed)),
        paths=tuple(paths),
        **extra,
    )


def everything_server(**extra: Any) -> McpServerConfig:
    program = servers_dir() / "node" / "node_modules" / ".bin" / "mcp-server-everything"
    return McpServerConfig(name="everything", command=(str(program),), **extra)


def tiny_server(marker: str = "", **extra: Any) -> McpServerConfig:
    """tests/mcp/tiny_server.py with this Python; ``marker`` goes on its command line."""
    command = (sys.executable, str(TINY_SERVER), *([marker] if marker else []))
    return McpServerConfig(name="tiny", command=command, paths=(str(TINY_SERVER.parent),), **extra)


def git_repo(folder: Path) -> Path:
    """A repository with one commit, made by the host's git."""
    folder.mkdir(parents=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.org",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.org",
    }
    (folder / "notes.txt").write_text("first notes\n")
    for argv in (
        ["init", "-q", "-b", "main"],
        ["add", "notes.txt"],
        ["commit", "-q", "-m", "First notes"],
    ):
        subprocess.run(["git", "-C", str(folder), *argv], env=env, check=True)
    return folder


@dataclass
class Broker:
    """A broker app with MCP servers, served on a Unix socket, and a client of it."""

    http: httpx.AsyncClient
    servers: McpServers
    url: str  # the broker's URL for loopd: unix:<socket>
    session: str = "mcp-tests"

    def server(self, name: str) -> McpServer:
        return self.servers.servers[name]

    async def find(self, query: str) -> dict[str, Any]:
        response = await self.http.post(
            "/v1/find_tool", json={"session": self.session, "query": query}
        )
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    async def call(
        self, name: str, arguments: Any, *, call_id: str | None = None, find: bool = True
    ) -> dict[str, Any]:
        """``call_tool`` as loopd sends it (after ``find_tool`` has shown ``name``)."""
        if find:
            assert name in (await self.find(name))["names"], f"find_tool does not offer {name}"
        body = {
            "session": self.session,
            "call_id": call_id or "call-" + secrets.token_hex(6),
            "name": name,
            "arguments": arguments,
        }
        response = await self.http.post("/v1/call_tool", json=body, timeout=120)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer


@asynccontextmanager
async def broker_with(
    folder: Path, servers: Sequence[McpServerConfig], *, catalogue: Path | None = None
) -> AsyncIterator[Broker]:
    """A broker whose catalogue is ``catalogue`` (default: the shipped one) plus ``servers``;
    they are up (or have failed once) when the block starts, and stopped when it ends."""
    settings = BrokerSettings(
        audit_db=folder / "audit.db", catalogue_dir=catalogue or DEFAULT_CATALOGUE_DIR
    )
    app = create_broker_app(settings, mcp=servers)
    sock = folder / "broker.sock"
    async with serving(app, uds=sock):
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as http:
            mcp = app.state.broker.mcp
            assert mcp is not None
            yield Broker(http, mcp, f"unix:{sock}")
