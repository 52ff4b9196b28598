"""Run the fake: the Starlette app, and uvicorn on a free loopback port or a Unix socket."""

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import uvicorn
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, WebSocketRoute

from loopd_dev.fakes.mattermost.clock import Clock
from loopd_dev.fakes.mattermost.control import control_routes
from loopd_dev.fakes.mattermost.core import FakeConfig, FakeMattermost
from loopd_dev.fakes.mattermost.errors import AppError
from loopd_dev.fakes.mattermost.rest import (
    RateLimitMiddleware,
    api_routes,
    app_error_response,
    http_error_response,
)
from loopd_dev.fakes.mattermost.wire import FaultableWebSocketProtocol
from loopd_dev.fakes.mattermost.ws import websocket_endpoint

_STARTUP_TIMEOUT_S = 10.0


class FakeStartError(RuntimeError):
    """uvicorn did not come up (port or socket path unusable)."""


def build_app(fake: FakeMattermost, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The fake's routes, and ``extra_routes`` beside them (the demo's page)."""
    app = Starlette(
        routes=[
            *api_routes(),
            WebSocketRoute("/api/v4/websocket", websocket_endpoint),
            *control_routes(),
            *extra_routes,
        ],
        middleware=[Middleware(RateLimitMiddleware, fake=lambda: fake)],
        exception_handlers={AppError: app_error_response, HTTPException: http_error_response},
    )
    app.state.fake = fake
    return app


def uvicorn_config(app: Starlette, fake: FakeMattermost) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        ws=FaultableWebSocketProtocol,
        ws_ping_interval=fake.config.ping_interval_s,
        ws_ping_timeout=fake.config.pong_wait_s,
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: inside a caller's task group, Ctrl-C is theirs."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True)
class RunningFake:
    """A started fake: where to reach it and the handle that drives it."""

    base_url: str  # "http://127.0.0.1:<port>"; for a Unix socket, "http://localhost"
    fake: FakeMattermost
    uds: Path | None = None

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api/v4"

    @property
    def websocket_url(self) -> str:
        return self.base_url.replace("http://", "ws://", 1) + "/api/v4/websocket"


def _remove_socket_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _bind(host: str, uds: Path | None, port: int = 0) -> socket.socket:
    if uds is not None:
        _remove_socket_file(uds)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(os.fspath(uds))
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port just let go of
        sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve_fake_mattermost(
    task_group: TaskGroup,
    *,
    config: FakeConfig | None = None,
    clock: Clock | None = None,
    uds: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_routes: Sequence[BaseRoute] = (),
) -> AsyncIterator[RunningFake]:
    """Start the fake in ``task_group`` (on ``port``, 0 for a free one, or on ``uds``), with
    ``extra_routes`` beside its own; stop it on exit."""
    fake = FakeMattermost(config, clock)
    server = _EmbeddedServer(uvicorn_config(build_app(fake, extra_routes), fake))
    sock = _bind(host, uds, port)
    stopped = anyio.Event()

    async def run() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            stopped.set()

    task_group.start_soon(run)
    try:
        with anyio.fail_after(_STARTUP_TIMEOUT_S):
            while not server.started:
                if stopped.is_set():
                    raise FakeStartError("the fake Mattermost server exited during startup")
                await anyio.sleep(0.005)
        if uds is not None:
            yield RunningFake("http://localhost", fake, uds)
        else:
            port = sock.getsockname()[1]
            yield RunningFake(f"http://{host}:{port}", fake)
    finally:
        fake.hub.forget_all()
        server.should_exit = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(_STARTUP_TIMEOUT_S):
            await stopped.wait()
        sock.close()
        if uds is not None:
            _remove_socket_file(uds)
