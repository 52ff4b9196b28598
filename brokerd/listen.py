"""Accepting connections so that no socket starves the others and no client holds one idle.

brokerd serves its three sockets from one process, so they share one limit on open files and one
event loop. Left to itself, uvicorn accepts every connection the kernel offers and waits for a
request head for ever: 1,100 idle connections to infer.sock used every descriptor, after which
no socket could accept anything, and asyncio logged each failed accept with its traceback
(~100 MB in 10 s). Here:

- each socket has at most ``max_connections`` open at once; further connections wait in the
  kernel's listen backlog, which costs brokerd nothing, until one of its connections closes;
- a connection must deliver a complete request head within ``header_timeout_s`` of opening, and
  again after each response it was given, or it is closed;
- accept failures and cut connections are logged at most once per interval, with a count.
"""

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

# How long to wait before accepting again after a failed accept (out of descriptors, memory).
ACCEPT_RETRY_S: Final = 0.5
LOG_INTERVAL_S: Final = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Per socket: open connections at once, and the time a client has to send a request head."""

    max_connections: int = 100
    header_timeout_s: float = 10.0


class ThrottledLog:
    """Logs one kind of event at most once per ``interval_s``, saying how many it did not log."""

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None
        self._unlogged = 0

    def warning(self, message: str, *args: object) -> bool:
        """Log ``message`` unless one was logged less than ``interval_s`` ago; True if logged."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._unlogged += 1
            return False
        if self._unlogged:
            message += f" (and {self._unlogged} more like it in the last %.0f s)"
            args = (*args, now - self._last if self._last is not None else 0.0)
        self.log.warning(message, *args)
        self._last, self._unlogged = now, 0
        return True


class WatchedConnections(set[Any]):
    """uvicorn's set of open connections, which wakes a waiter whenever one leaves it.

    uvicorn adds each connection (HTTP or WebSocket) when it opens and discards it when it
    closes, so its size is the number of connections this socket holds open.
    """

    def __init__(self) -> None:
        super().__init__()
        self._left = asyncio.Event()

    def discard(self, element: Any) -> None:
        super().discard(element)
        self._left.set()

    def remove(self, element: Any) -> None:
        super().remove(element)
        self._left.set()

    async def wait_below(self, limit: int) -> None:
        while len(self) >= limit:
            self._left.clear()
            await self._left.wait()


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head.

    The clock starts when the connection opens and again when a response has been sent; it stops
    when h11 has a complete request head. A connection still without one at the deadline is
    closed, as uvicorn closes an idle keep-alive connection.
    """

    head_timeout_s: float = ConnectionLimits.header_timeout_s
    cut_log: ThrottledLog = ThrottledLog(logger)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_overdue)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.cut_log.warning(
            "closed a connection that sent no request head within %g s", self.head_timeout_s
        )
        self.transport.close()


def head_deadline_protocol(name: str, timeout_s: float) -> type[H11Protocol]:
    """The protocol class for one socket (uvicorn builds one instance per connection)."""

    class Protocol(HeadDeadlineProtocol):
        head_timeout_s = timeout_s
        cut_log = ThrottledLog(logging.getLogger(f"{__name__}.{name}"))

    return Protocol


class GuardedListener:
    """Accepts connections on one listening socket, never more than ``max_connections`` open.

    Each accepted socket gets a protocol from ``protocol_factory`` (uvicorn's, built as its own
    server would); ``connections`` is that server's set of open connections.
    """

    def __init__(
        self,
        name: str,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        connections: WatchedConnections,
        max_connections: int,
    ) -> None:
        self.name = name
        self.sock = sock
        self.protocol_factory = protocol_factory
        self.connections = connections
        self.max_connections = max_connections
        self.failures = ThrottledLog(logging.getLogger(f"{__name__}.{name}"))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sock.setblocking(False)
        self._task = asyncio.get_running_loop().create_task(self._accept_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.connections.wait_below(self.max_connections)
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:
                # Out of descriptors or memory: the connection stays queued; try again soon.
                self.failures.warning("%s: cannot accept a connection: %s", self.name, exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            try:
                await loop.connect_accepted_socket(self.protocol_factory, conn)
            except OSError as exc:
                conn.close()
                self.failures.warning("%s: cannot serve a connection: %s", self.name, exc)
