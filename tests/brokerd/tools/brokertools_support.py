"""Helpers shared by the tool broker's tests: catalogues written on the fly and a real uvicorn
server on a Unix socket or a loopback TCP socket."""

import json
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp

OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def write_tool(
    directory: Path,
    name: str,
    *,
    description: str = "A tool for tests.",
    parameters: Mapping[str, Any] = OBJECT_SCHEMA,
    run: Mapping[str, Any] | None = None,
    **limits: Any,
) -> Path:
    """Write ``<name>.json`` into ``directory`` and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = {
        "name": name,
        "description": description,
        "parameters": dict(parameters),
        "run": dict(run) if run is not None else {"kind": "builtin", "handler": "clock_now"},
        **limits,
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(tool), encoding="utf-8")
    return path


def python_tool(
    directory: Path,
    name: str,
    code: str,
    *args: str,
    writable: Path | None = None,
    **limits: Any,
) -> Path:
    """A host command tool that runs ``code`` with this Python (argv, no shell), confined like
    every command tool: it declares the interpreter's installation, and ``writable`` if given."""
    interpreter = Path(sys.executable).resolve()
    argv = [str(interpreter), "-I", "-c", code, *args]
    confine: dict[str, Any] = {"read_only": [sys.base_prefix]}
    if writable is not None:
        confine["read_write"] = [str(writable)]
    run = {"kind": "command", "argv": argv}
    return write_tool(directory, name, run=run, confine=confine, **limits)


def loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server with an event for "listening", instead of polling ``started``."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = anyio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


@asynccontextmanager
async def serving(
    app: ASGIApp, *, uds: Path | None = None, sock: socket.socket | None = None
) -> AsyncIterator[None]:
    """Serve ``app`` with uvicorn (lifespan on) until the block ends."""
    config = uvicorn.Config(
        app,
        uds=str(uds) if uds is not None else None,
        lifespan="on",
        log_level="warning",
        http="h11",
        ws="none",
    )
    server = _Server(config)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock] if sock is not None else None)
        with anyio.fail_after(10):
            await server.listening.wait()
        try:
            yield
        finally:
            server.should_exit = True
