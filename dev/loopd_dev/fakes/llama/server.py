"""Run the fake under uvicorn, on a Unix socket or a free loopback port.

:func:`serve_fake_llama` is an async context manager: the server runs in a task group inside it
and is gone when the block exits. :meth:`RunningFake.kill` imitates a server process dying:
listeners and open connections close at once, and new connections are refused.
"""

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import uvicorn

from .app import FakeLlamaApp
from .state import FakeLlama


@dataclass
class RunningFake:
    """A fake that is serving: where to reach it, and how to make it die."""

    fake: FakeLlama
    base_url: str
    uds: Path | None
    _server: uvicorn.Server
    _app: FakeLlamaApp
    _dead: anyio.Event = field(default_factory=anyio.Event)

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An httpx client for this fake (over the Unix socket when there is one)."""
        transport = httpx.AsyncHTTPTransport(uds=str(self.uds)) if self.uds else None
        return httpx.AsyncClient(base_url=self.base_url, transport=transport, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """Stop answering entirely: close the listener and every connection, drop all work."""
        if self._dead.is_set():
            return
        self._dead.set()
        for listener in getattr(self._server, "servers", []):
            listener.close()
        for connection in list(self._server.server_state.connections):
            connection.transport.close()
        self._app.abort_all()

    async def wait_dead(self) -> None:
        """Return once the fake was killed (``kill()`` or ``POST /_fake/die``)."""
        await self._dead.wait()


@asynccontextmanager
async def serve_fake_llama(
    fake: FakeLlama,
    *,
    uds: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[RunningFake]:
    """Serve ``fake`` until the block exits; port 0 picks a free one."""
    sock = _bind_unix(Path(uds)) if uds is not None else _bind_tcp(host, port)
    app = FakeLlamaApp(fake)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        date_header=False,
        ws="none",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    if uds is not None:
        base_url = "http://localhost"
    else:
        bound_host, bound_port = sock.getsockname()[:2]
        base_url = f"http://{bound_host}:{bound_port}"
    running = RunningFake(fake, base_url, Path(uds) if uds else None, server, app)
    fake.on_die = running.kill
    try:
        async with anyio.create_task_group() as tg:
            # The socket already listens, so clients may connect before uvicorn starts accepting.
            tg.start_soon(server.serve, [sock])
            try:
                yield running
            finally:
                running.kill()
                server.should_exit = True
    except BaseExceptionGroup as group:
        # The caller's own error (a failed assert, say) should reach it as itself.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        fake.on_die = None
        sock.close()
        if uds is not None:
            await anyio.Path(uds).unlink(missing_ok=True)


def _bind_tcp(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _bind_unix(path: Path) -> socket.socket:
    # A stale socket file from an earlier run would make bind fail; it belongs to nobody now.
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    sock.setblocking(False)
    return sock
