"""``read_at_most``: a body read within its bound, streamed or already whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx

from loopcommon.bodies import ERROR_PREFIX_BYTES, read_at_most


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    return await read_at_most(response, limit)


def test_a_streamed_body_past_the_bound_gives_its_head_and_says_so() -> None:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * ERROR_PREFIX_BYTES

    response = httpx.Response(200, content=body())
    head, cut = anyio.run(_read, response, 3 * ERROR_PREFIX_BYTES)
    assert cut
    assert head == b"x" * ERROR_PREFIX_BYTES


def test_a_body_already_in_memory_is_read_within_the_same_bound() -> None:
    # A transport that answers with bytes (httpx.MockTransport, a test double) hands over a
    # response already read: its stream cannot be iterated again.
    whole = httpx.Response(200, content=b"[1, 2]")
    assert anyio.run(_read, whole, 100) == (b"[1, 2]", False)
    large = httpx.Response(500, content=b"e" * (2 * ERROR_PREFIX_BYTES))
    head, cut = anyio.run(_read, large, 100)
    assert cut
    assert head == b"e" * 100
