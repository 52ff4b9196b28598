"""A tiny MCP server for the faults the reference servers cannot be made to show on demand.

Written with the official SDK (``mcp.server.mcpserver``) and run over stdio by brokerd, like any
configured server: it announces a new tool with ``notifications/tools/list_changed`` when asked,
crashes mid-call, sleeps past a timeout, writes more than an output cap, and tries the network.
"""

import os
import socket
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("tiny")


@server.tool()
def process_id() -> str:
    """The server's process id (a restarted server has a new one)."""
    return str(os.getpid())


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` (it echoes its text) and announce it with list_changed."""

    def echo(text: str) -> str:
        return f"{name}: {text}"

    server.add_tool(echo, name=name, description=f"Echo a text, as the tool {name}.")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
def crash() -> str:
    """Exit at once, in the middle of the call."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
async def sleep(seconds: float) -> str:
    """Answer after ``seconds``."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def write_bytes(count: int) -> str:
    """A text of ``count`` characters."""
    return "x" * count


@server.tool()
def connect(host: str, port: int) -> str:
    """Open a TCP connection to host:port and say what happened."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return "connected"
    except OSError as exc:
        return f"no connection: {exc}"


@server.tool()
def read_file(path: str) -> str:
    """A file's text, or why it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError as exc:
        return f"cannot read: {exc}"


if __name__ == "__main__":
    server.run()
