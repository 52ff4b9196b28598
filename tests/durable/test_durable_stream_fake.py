"""The stream's part in durable sessions, on the llama fake: the first progress event's cache
count is asked once, and a request the server lost is closed there, before any output."""

from __future__ import annotations

import pytest

from loopd.engine.outcome import Failure, RequestResult
from loopd.engine.stream import start_result, stream_into
from tests.engine.engine_support import FAST, SLOT, Served, eventually, served, user_body

pytestmark = pytest.mark.anyio


async def ask_lost(server: Served, answer: bool) -> tuple[RequestResult, list[int]]:
    """One request whose ``lost`` answers ``answer``; the counts it was asked."""
    asked: list[int] = []

    def lost(cache: int) -> bool:
        asked.append(cache)
        return answer

    result = start_result()
    await stream_into(result, server.client, user_body("hello"), slot=SLOT, limits=FAST, lost=lost)
    return result, asked


async def test_a_request_the_server_lost_is_closed_at_its_first_progress_event() -> None:
    async with served() as server:
        result, asked = await ask_lost(server, True)
        # Closing the stream cancels the work on the server: the slot is free again.
        await eventually(lambda: not server.fake.model().slots.slots[SLOT].is_processing)
    assert result.failure is Failure.LOST_BY_SERVER
    assert asked == [0]
    assert not result.output_seen


async def test_a_request_the_server_still_holds_is_read_to_its_end() -> None:
    async with served() as server:
        result, asked = await ask_lost(server, False)
    assert result.complete, result.detail
    assert asked == [0], "asked once, at the first progress event only"
