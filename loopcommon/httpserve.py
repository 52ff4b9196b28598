"""Serving an ASGI app inside a daemon's task group, on a Unix socket or a loopback port.

Used for loopd's metrics and status page and for brokerd's metrics address. uvicorn runs the app;
the daemon keeps its signals, and cancelling the task closes the listener (a Unix socket file is
removed) and the connections still open, within ``SHUTDOWN_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterator
from typing import Final

import anyio
import uvicorn
from anyio.abc import TaskStatus
from starlette.types import ASGIApp

from loopcommon.address import Address, TcpAddress, UnixAddress
from loopcommon.errors import DaemonError

log = logging.getLogger(__name__)

SOCKET_MODE: Final = 0o660
SHUTDOWN_S: Final = 2.0


class MetricsServeError(DaemonError):
    """The metrics address cannot be served (taken, not a socket, no permission)."""


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a daemon's task group: the daemon handles signals, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(
    app: ASGIApp,
    address: Address,
    name: str,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` at ``address`` until cancelled; started once it takes connections. A Unix
    socket is made 0660 and removed at the end."""
    sock = bind(address)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=1,
    )
    config.load()
    server = _EmbeddedServer(config)
    server.lifespan = config.lifespan_class(config)
    try:
        await server.startup(sockets=[sock])
        log.info("%s on %s", name, address)
        task_status.started()
        await server.main_loop()
    finally:
        # Cancelled (the daemon stopping): close the listener and open connections, briefly.
        if server.started:
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(SHUTDOWN_S),
                contextlib.suppress(asyncio.CancelledError),
            ):
                await server.shutdown(sockets=[sock])
        sock.close()
        if isinstance(address, UnixAddress):
            with contextlib.suppress(FileNotFoundError):
                address.path.unlink()


def bind(address: Address) -> socket.socket:
    """A listening socket at ``address``; ``MetricsServeError`` naming it when that fails."""
    if isinstance(address, TcpAddress):
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        target: str | tuple[str, int] = (address.host, address.port)
    else:
        _remove_stale_socket(address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target = os.fspath(address.path)
    try:
        sock.bind(target)
        if isinstance(address, UnixAddress):
            address.path.chmod(SOCKET_MODE)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise MetricsServeError(f"cannot serve metrics at {address}: {exc}") from exc
    sock.setblocking(False)
    return sock


def _remove_stale_socket(address: UnixAddress) -> None:
    try:
        mode = address.path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MetricsServeError(f"cannot serve metrics at {address}: {exc}") from exc
    if not stat.S_ISSOCK(mode):
        raise MetricsServeError(f"{address.path} exists and is not a socket; not removing it")
    address.path.unlink()
