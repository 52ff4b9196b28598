"""Accepting and serving connections so that no socket starves the others, no client holds one
idle, and a streamed answer costs little per chunk.

brokerd serves its three sockets from one process, so they share one limit on open files and one
event loop. Left to itself, uvicorn accepts every connection the kernel offers and waits for a
request head for ever: 1,100 idle connections to infer.sock used every descriptor, after which
no socket could accept anything, and asyncio logged each failed accept with its traceback
(~100 MB in 10 s). Here:

- each socket has at most ``max_connections`` open at once; further connections wait in the
  kernel's listen backlog, which costs brokerd nothing, until one of its connections closes;
- a connection must deliver a complete request head, of at most ``MAX_HEAD_BYTES``, within
  ``header_timeout_s`` of opening, and again after each response it was given, or it is closed;
- accept failures and cut connections are logged at most once per interval, with a count;
- requests are parsed and answers written with httptools (uvicorn's own choice for speed), and a
  relay may write a streamed answer's chunks to the connection from a callback, or cut it
  (``ClientWrites``).
"""

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

logger = logging.getLogger(__name__)

# How long to wait before accepting again after a failed accept (out of descriptors, memory).
ACCEPT_RETRY_S: Final = 0.5
LOG_INTERVAL_S: Final = 10.0
CLIENT_WRITES: Final = "brokerd.client_writes"
"""The ASGI scope extension (``scope["extensions"][CLIENT_WRITES]``, a ``ClientWrites``) by which
a relay writes a streamed answer's body to the client from a callback, or cuts it."""
# The longest request head (request line and headers) a connection may send: h11's bound, which
# brokerd's sockets had before they were served with httptools. The box's heads are a few
# hundred bytes.
MAX_HEAD_BYTES: Final = 16 * 1024
_TOO_LARGE_TEXT: Final = b"Request head too large.\n"
HEAD_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(_TOO_LARGE_TEXT), _TOO_LARGE_TEXT)
)


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


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size bound for each request head.

    httptools (llhttp, uvicorn's own choice for speed) rather than h11: a streamed answer is a
    chunk per token, and h11's state machine cost brokerd about a tenth of its CPU per token
    (``make bench``, the relay section).

    The clock starts when the connection opens and again when a response has been sent; it stops
    when the parser has a complete request head. A connection still without one at the deadline
    is closed, as uvicorn closes an idle keep-alive connection. A head longer than
    ``MAX_HEAD_BYTES`` is answered 431 and the connection closed: llhttp itself holds no bound.
    """

    head_timeout_s: float = ConnectionLimits.header_timeout_s
    cut_log: ThrottledLog = ThrottledLog(logger)
    _head_timer: asyncio.TimerHandle | None = None
    # The head under way: the bytes read since it began (for a head that spans reads: right
    # within one read), and the size of its target and headers (for a head one read brought).
    _in_head: bool = True
    _head_bytes: int = 0
    _head_fields: int = 0
    _refused: bool = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        too_long = self._in_head and self._head_bytes > MAX_HEAD_BYTES
        if (self._refused or too_long) and not self.transport.is_closing():
            self.cut_log.warning("refused a request head of more than %d bytes", MAX_HEAD_BYTES)
            self.transport.write(HEAD_TOO_LARGE)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_fields = 0

    def on_url(self, url: bytes) -> None:
        self._head_fields += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += len(name) + len(value)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._cancel_head_timer()
        if self._head_fields > MAX_HEAD_BYTES:
            self._refused = True  # no request starts: refused once this read is parsed
            return
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:  # not an upgrade
            extensions: dict[str, object] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[CLIENT_WRITES] = CycleWrites(self.cycle)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()
            self._in_head = True

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # its head is complete already
        super().on_response_complete()
        if not self.transport.is_closing() and not pipelined:
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
        if self.transport.is_closing():
            return
        self.cut_log.warning(
            "closed a connection that sent no request head within %g s", self.head_timeout_s
        )
        self.transport.close()


class ClientWrites(Protocol):
    """What a relay may do to the client's connection besides ASGI's ``send``."""

    def write_chunk(self, body: bytes) -> bool:
        """Write ``body`` as a chunk of the response's body and answer True, or write nothing
        and answer False: the caller then sends it through ``send``."""

    def abort(self) -> None:
        """End the connection with the body unfinished, so that the client sees it was cut."""


class CycleWrites:
    """``ClientWrites`` for one request served by uvicorn's httptools protocol.

    ASGI's ``send`` is a coroutine: a relay that had only it would wake a task for every chunk it
    passes on, about a fifth of brokerd's CPU per token. ``write_chunk`` writes
    from whatever callback holds the bytes (the upstream connection's) the bytes uvicorn's
    ``send`` writes for a chunk of a chunked body, and only where that is all ``send`` would do:
    it answers False before the response has started or after it has ended, for a body that is
    not chunked, once the client has gone, or while the connection's buffer is full (``send``
    would wait).

    ``abort`` closes the connection as uvicorn does for an app that fails mid-response, without
    uvicorn's line and traceback for it: the relay says what broke in its own line.
    """

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle

    def write_chunk(self, body: bytes) -> bool:
        cycle = self.cycle
        if (
            cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.response_started
            or cycle.response_complete
            or not cycle.chunked_encoding
        ):
            return False
        if body:  # an empty chunk would end the body
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    def abort(self) -> None:
        # What uvicorn's own connection_lost sets: the app's sends are dropped from now on, and
        # its return is not taken for an unfinished response.
        self.cycle.disconnected = True
        self.cycle.transport.close()


class CountedWrites:
    """``writes`` that calls ``count`` with the size of each chunk it wrote."""

    def __init__(self, writes: ClientWrites, count: Callable[[int], None]) -> None:
        self.writes = writes
        self.count = count

    def write_chunk(self, body: bytes) -> bool:
        if not self.writes.write_chunk(body):
            return False
        self.count(len(body))
        return True

    def abort(self) -> None:
        self.writes.abort()


def head_deadline_protocol(name: str, timeout_s: float) -> type[HttpToolsProtocol]:
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
