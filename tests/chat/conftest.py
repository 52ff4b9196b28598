"""Fixtures for the chat scenario tests: short socket paths and the fake llama-server."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from loopd_dev.fakes.llama import FakeLlama, ModelSpec, RunningFake, serve_fake_llama

FAKE_MODEL = "fake-model"


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for Unix sockets (``tmp_path`` may pass the 108-byte limit)."""
    with tempfile.TemporaryDirectory(prefix="lc") as tmp:
        yield Path(tmp)


@pytest.fixture
def fake_llama() -> FakeLlama:
    return FakeLlama([ModelSpec(FAKE_MODEL, n_slots=2, n_ctx=32768)])


@pytest.fixture
async def llama(fake_llama: FakeLlama) -> AsyncIterator[RunningFake]:
    # On loopback TCP: a turn cancelled while its client connects over a Unix socket can hit a
    # race in anyio's connect_unix (a writer callback sets a future already cancelled), which
    # surfaces as an InvalidStateError from the event loop. The fake Mattermost keeps the Unix
    # socket, the form used in the box.
    async with serve_fake_llama(fake_llama) as running:
        yield running
