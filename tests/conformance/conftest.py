"""The official Mattermost JavaScript client, installed once into the cache (outside the
repository) with the machine's Node and npm (``tests/npm_cache.py``), and the fake it is pointed
at."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from loopd_dev.fakes.mattermost import FakeConfig, RunningFake, serve_fake_mattermost
from tests import npm_cache

CLIENT_VERSION = "11.9.0"
# The client needs its types package at run time (a peer dependency); TypeScript it does not.
PACKAGES = {"@mattermost/client": CLIENT_VERSION, "@mattermost/types": CLIENT_VERSION}
FAST = FakeConfig(auth_timeout_s=2.0, ping_interval_s=5.0, pong_wait_s=10.0)


@pytest.fixture(scope="session")
def node() -> str:
    # WebSocket is global from Node 22; on 20 it is behind --experimental-websocket.
    return npm_cache.node("the conformance tests")


@pytest.fixture(scope="session")
def client_modules(node: str) -> Path:
    """``node_modules`` holding ``@mattermost/client`` (and its types) at the pinned version."""
    return npm_cache.node_modules(npm_cache.cache_dir("npm"), PACKAGES)


@pytest.fixture
async def mm() -> AsyncIterator[RunningFake]:
    """The fake on loopback TCP (Node's fetch and WebSocket speak TCP)."""
    async with (
        anyio.create_task_group() as tg,
        serve_fake_mattermost(tg, config=FAST) as running,
    ):
        yield running
        tg.cancel_scope.cancel()


@pytest.fixture
def scripts() -> Path:
    return Path(__file__).parent / "js"
