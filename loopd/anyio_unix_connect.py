"""A guarded fix for a race in anyio 4.16's ``connect_unix`` on asyncio.

When a Unix-socket connect has to wait (the listener's backlog is full: llama-server's is small,
and loopd opens one connection per request) and the waiting task is cancelled just as the socket
becomes writable, anyio's writer callback calls ``set_result`` on the already-cancelled future.
asyncio then reports ``InvalidStateError`` from a callback: harmless to the connection (it was
abandoned and closed) but noise in the logs, and a failure under anyio's test runner. The fixed
version below is anyio's own code with the callback made idempotent. It is applied only to the
pinned anyio version it was written against; any other version is left untouched.
"""

from __future__ import annotations

import asyncio
import socket
from importlib.metadata import version
from typing import Any

from anyio._backends import _asyncio as anyio_asyncio

FIXED_VERSION = "4.16.0"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # the waiting task may have been cancelled meanwhile
        future.set_result(None)


async def _connect_unix(cls: Any, path: str | bytes, kind: socket.SocketKind) -> Any:
    await cls.checkpoint()
    loop = asyncio.get_running_loop()
    raw_socket = socket.socket(socket.AF_UNIX, kind)
    raw_socket.setblocking(False)
    while True:
        try:
            raw_socket.connect(path)
        except BlockingIOError:
            future: asyncio.Future[None] = asyncio.Future()
            loop.add_writer(raw_socket, _resolve, future)
            future.add_done_callback(lambda _: loop.remove_writer(raw_socket))
            await future
        except BaseException:
            raw_socket.close()
            raise
        else:
            return anyio_asyncio.UNIXSocketStream(raw_socket)


def apply() -> bool:
    """Install the fix when running the anyio version it was written for; True if installed."""
    if version("anyio") != FIXED_VERSION:
        return False
    backend: Any = anyio_asyncio.AsyncIOBackend
    backend.connect_unix = classmethod(_connect_unix)
    return True
