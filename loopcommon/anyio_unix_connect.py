"""A guarded fix for a race in anyio 4.16's Unix-socket streams on asyncio.

The upstream code covered, all in ``anyio/_backends/_asyncio.py`` of anyio 4.16.0:

- ``AsyncIOBackend.connect_unix`` (behind ``anyio.connect_unix``, which httpx's Unix-socket
  transport uses for ``unix:`` URLs): the ``except BlockingIOError`` branch, taken when the
  listener's backlog is full, waits with ``loop.add_writer(raw_socket, f.set_result, None)``;
- ``_RawSocketMixin._wait_until_readable`` and ``_wait_until_writable``, which
  ``UNIXSocketStream.receive``, ``send``, ``receive_fds`` and ``send_fds`` await (and the
  Unix datagram sockets' ``receive`` and ``send``, which loopd does not use), each waiting with
  ``loop.add_reader``/``add_writer(raw_socket, f.set_result, None)``.

When the waiting task is cancelled in the same loop iteration as the socket becomes ready, that
selector callback runs ``set_result`` on the already-cancelled future and asyncio reports
``InvalidStateError`` from a callback: harmless to the connection (the wait was abandoned) but
noise in the logs, and a failure under pytest, which turns such reports into errors. The versions
below are anyio's own code with the callback made idempotent (``_resolve``). Not covered:
``create_unix_datagram_socket``'s connect and ``UNIXSocketListener.accept``, which neither daemon
uses (brokerd's sockets are served by uvicorn on asyncio's own server).

``apply()`` is called by the entry points (``loopd.cli.main``, ``brokerd.cli.main``) and by the
tests' set-up (tests/conftest.py), never on import; it installs the fix only on the pinned anyio
version it was written against and leaves any other version untouched.
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


def _wait_until_readable(self: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    raw_socket = self._raw_socket

    def callback(f: object) -> None:
        del self._receive_future
        loop.remove_reader(raw_socket)

    future: asyncio.Future[None] = asyncio.Future()
    self._receive_future = future
    loop.add_reader(raw_socket, _resolve, future)
    future.add_done_callback(callback)
    return future


def _wait_until_writable(self: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
    raw_socket = self._raw_socket

    def callback(f: object) -> None:
        del self._send_future
        loop.remove_writer(raw_socket)

    future: asyncio.Future[None] = asyncio.Future()
    self._send_future = future
    loop.add_writer(raw_socket, _resolve, future)
    future.add_done_callback(callback)
    return future


def apply() -> bool:
    """Install the fix when running the anyio version it was written for; True if installed."""
    if version("anyio") != FIXED_VERSION:
        return False
    backend: Any = anyio_asyncio.AsyncIOBackend
    backend.connect_unix = classmethod(_connect_unix)
    mixin: Any = anyio_asyncio._RawSocketMixin
    mixin._wait_until_readable = _wait_until_readable
    mixin._wait_until_writable = _wait_until_writable
    return True
