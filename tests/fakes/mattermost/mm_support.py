"""Shared helpers for the fake Mattermost tests: a fast-configured server, clients, frames."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from loopd_dev.fakes.mattermost import FakeConfig, ManualClock, RunningFake, serve_fake_mattermost

FAST = FakeConfig(auth_timeout_s=0.3, ping_interval_s=0.2, pong_wait_s=1.0)
WAIT_S = 3.0


@asynccontextmanager
async def running_fake(config: FakeConfig = FAST) -> AsyncIterator[RunningFake]:
    async with (
        anyio.create_task_group() as tg,
        serve_fake_mattermost(tg, config=config, clock=ManualClock()) as running,
    ):
        yield running
        tg.cancel_scope.cancel()


def manual_clock(running: RunningFake) -> ManualClock:
    clock = running.fake.clock
    assert isinstance(clock, ManualClock)
    return clock


def rest(running: RunningFake, token: str | None = "bot") -> httpx.AsyncClient:
    """A REST client; ``token="bot"`` means the bot's token, ``None`` sends no header."""
    headers = {}
    if token is not None:
        value = running.fake.config.bot_token if token == "bot" else token
        headers["Authorization"] = f"Bearer {value}"
    return httpx.AsyncClient(base_url=running.api_url, headers=headers, timeout=WAIT_S)


def open_ws(running: RunningFake, query: str = "", token: str | None = "bot") -> connect:
    headers = {}
    if token is not None:
        value = running.fake.config.bot_token if token == "bot" else token
        headers["Authorization"] = f"Bearer {value}"
    url = running.websocket_url + (f"?{query}" if query else "")
    return connect(url, additional_headers=headers, open_timeout=WAIT_S, ping_interval=None)


async def recv(ws: ClientConnection) -> dict[str, Any]:
    with anyio.fail_after(WAIT_S):
        frame = json.loads(await ws.recv())
    assert isinstance(frame, dict)
    return frame


async def recv_event(ws: ClientConnection, event: str) -> dict[str, Any]:
    """The next frame of kind ``event``, skipping others."""
    with anyio.fail_after(WAIT_S):
        while True:
            frame = await recv(ws)
            if frame.get("event") == event:
                return frame


async def nothing_within(ws: ClientConnection, seconds: float = 0.2) -> bool:
    """True if no frame arrives within ``seconds``."""
    with anyio.move_on_after(seconds):
        await ws.recv()
        return False
    return True


async def wait_inactive(running: RunningFake, connection_id: str) -> None:
    """Until the server has noticed that the socket of ``connection_id`` went away."""
    with anyio.fail_after(WAIT_S):
        # The server offers no event for this; a short poll keeps the fake free of test hooks.
        while any(c.id == connection_id and c.active for c in running.fake.connections()):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def frames_until_closed(ws: ClientConnection) -> int:
    """Read until the server closes the socket; returns how many frames came first."""
    count = 0
    with anyio.fail_after(WAIT_S):
        try:
            while True:
                await ws.recv()
                count += 1
        except ConnectionClosed:
            return count
