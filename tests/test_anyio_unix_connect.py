"""The guarded fix of anyio's connect_unix race (see loopcommon/anyio_unix_connect.py)."""

import asyncio
from pathlib import Path

import anyio
import pytest
from anyio._backends import _asyncio as anyio_asyncio

from loopcommon import anyio_unix_connect


def test_the_fix_is_installed_for_the_pinned_anyio() -> None:
    assert anyio_unix_connect.apply()
    connect = anyio_asyncio.AsyncIOBackend.connect_unix
    assert connect.__func__ is anyio_unix_connect._connect_unix  # type: ignore[attr-defined]
    mixin = anyio_asyncio._RawSocketMixin
    assert mixin._wait_until_readable is anyio_unix_connect._wait_until_readable
    assert mixin._wait_until_writable is anyio_unix_connect._wait_until_writable


def test_a_writer_callback_after_cancellation_is_harmless() -> None:
    async def main() -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        anyio_unix_connect._resolve(future)  # anyio's own callback raised InvalidStateError here
        assert future.cancelled()

    asyncio.run(main())


@pytest.mark.anyio
async def test_connecting_sending_and_receiving_still_work(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listener = await anyio.create_unix_listener(path)
    async with (
        listener,
        await anyio.connect_unix(path) as stream,
        await listener.accept() as server_side,
    ):
        await stream.send(b"ping")
        assert await server_side.receive() == b"ping"
        await server_side.send(b"pong")
        assert await stream.receive() == b"pong"
