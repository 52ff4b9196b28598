"""An httpx transport of one connection per request, whose answer is read with httptools.

llama-server streams a chunk per token. httpx's own transport reads each chunk with h11, a
state machine in Python that takes two events and two reads per chunk, through httpcore's
layers: about two fifths of brokerd's CPU per token relayed, in a profile of the relay.
Here llhttp (httptools, the parser uvicorn serves with) reads the answer in C as asyncio hands
over what the socket received, and what arrived together, however many chunks, goes on as one
piece.

The inference proxy opens a fresh connection for every request anyway (``create_inference_app``
says why), so this transport keeps no pool: it connects (to a Unix socket, waiting out a full
backlog as ``loopcommon.transport`` does, or over TCP, with TLS for ``https``), writes the request
httpx built, reads the answer's head, streams its body to the end and closes. It raises httpx's
own errors, as httpx's transport does: the connect, write and read failures and timeouts, and
``RemoteProtocolError`` for an answer that is not HTTP/1.1, that ends before its framing says it
does, or whose head is longer than ``MAX_ANSWER_HEAD_BYTES``.

A relay may also take the body without waking a task for each piece: the answer's
``extensions[PUSH_BODY]`` is a function that is given a ``ChunkWrite``, which the connection's own
callback then calls with each piece while the reader waits; a piece the write does not take (it
answers False) is the reader's, as any piece is without one.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Final

import anyio
import httptools
import httpx

from loopcommon.transport import connect_unix

# h11's bound on an answer's head, which the inference proxy's answers had before.
MAX_ANSWER_HEAD_BYTES: Final = 16 * 1024
# Body bytes read but not yet taken before the socket is left unread (the client is slow): what
# asyncio itself buffers before it stops reading.
WAITING_BYTES_LIMIT: Final = 64 * 1024
PUSH_BODY: Final = "brokerd.push_body"
"""The answer's extension by which a relay hands over a ``ChunkWrite`` (see the module's text)."""

ChunkWrite = Callable[[bytes], bool]
"""Writes a piece of the body on at once and answers True, or answers False and writes nothing."""


_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# What may not appear in a request line or header: it would end the line and start another.
_LINE_BREAKING = re.compile(rb"[\r\n\x00]")


class OneShotTransport(httpx.AsyncBaseTransport):
    """Each request on a connection of its own (to ``uds`` when given), closed after its answer."""

    def __init__(
        self, *, uds: str | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.uds = uds
        self.ssl_context = ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        head = request_head(request)
        body = await request.aread()
        exchange = await self._connect(request.url, timeouts.get("connect"))
        try:
            await exchange.send(head, body, timeouts.get("write"))
            await exchange.read_head(timeouts.get("read"))
        except BaseException:
            exchange.close()
            raise
        return httpx.Response(
            exchange.status,
            headers=exchange.headers,
            stream=AnswerBody(exchange, timeouts.get("read")),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": exchange.reason,
                PUSH_BODY: exchange.push_to,
            },
        )

    async def _connect(self, url: httpx.URL, within_s: float | None) -> Exchange:
        loop = asyncio.get_running_loop()
        where = self.uds or f"{url.host}:{url.port}"
        try:
            with anyio.fail_after(within_s):
                if self.uds is not None:
                    sock = await connect_unix(self.uds)
                    try:
                        _, exchange = await loop.create_unix_connection(Exchange, sock=sock)
                    except BaseException:
                        sock.close()
                        raise
                    return exchange
                port = url.port or _DEFAULT_PORTS.get(url.scheme)
                if port is None:
                    raise httpx.UnsupportedProtocol(f"cannot send a request to {url.scheme}://")
                tls = self._tls() if url.scheme == "https" else None
                _, exchange = await loop.create_connection(
                    Exchange,
                    url.host,
                    port,
                    ssl=tls,
                    server_hostname=url.host if tls else None,
                    happy_eyeballs_delay=0.25,
                )
                return exchange
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"timed out connecting to {where}") from exc
        except OSError as exc:  # ssl.SSLError among them
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc

    def _tls(self) -> ssl.SSLContext:
        if self.ssl_context is None:  # once, when first needed: loading the trust store is slow
            self.ssl_context = httpx.create_ssl_context(trust_env=False)
        return self.ssl_context


def request_head(request: httpx.Request) -> bytes:
    """The request line and headers as httpx built them (pure). A body must have its length
    given: this transport sends no chunked requests (the proxies' bodies are read whole). No
    HEAD: llhttp cannot be told that its answer has no body."""
    if request.method == "HEAD":
        raise httpx.LocalProtocolError("this transport does not send HEAD requests")
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if name.lower() == b"transfer-encoding":
            raise httpx.LocalProtocolError("this transport sends bodies of a known length only")
        lines.append(b"%s: %s" % (name, value))
    if any(_LINE_BREAKING.search(line) for line in lines):
        raise httpx.LocalProtocolError("a request line or header holds a line break or NUL")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Exchange(asyncio.Protocol):
    """One request and its answer on one connection: asyncio's protocol for the socket, and
    llhttp's callbacks for the answer. The body's bytes go to the ``push_to`` write, if there is
    one and the reader has sent on all it took, else wait in ``pieces`` until taken."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.head_complete = False
        self.complete = False
        self.sized = False  # a Content-Length or a chunked body: the connection's end is no end
        self.pieces: list[bytes] = []
        self.waiting_bytes = 0
        self.failure: httpx.TransportError | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.request_sent = False
        self.write: ChunkWrite | None = None
        # The reader took pieces and has not asked for more: it may not have sent them on yet,
        # so the write must wait (the body's order).
        self.handed_out = False
        self._wakeup: asyncio.Future[None] | None = None

    async def send(self, head: bytes, body: bytes, within_s: float | None) -> None:
        assert self.transport is not None
        self.transport.write(head)
        self.transport.write(body)
        try:
            with anyio.fail_after(within_s):
                while self.writing_paused and self.failure is None:
                    await self._wait()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out writing the request") from exc
        self.request_sent = True
        if self.failure is not None and not self.head_complete:
            raise self.failure

    async def read_head(self, within_s: float | None) -> None:
        try:
            with anyio.fail_after(within_s):
                while not self.head_complete and self.failure is None:
                    await self._wait()
        except TimeoutError as exc:
            raise httpx.ReadTimeout("timed out waiting for the answer") from exc
        if not self.head_complete:
            assert self.failure is not None
            raise self.failure

    async def next_piece(self, within_s: float | None = None) -> bytes:
        """The body's bytes that arrived since the last call, as one piece; b"" at its end.
        Calling it again says that the last piece has been sent on."""
        self.handed_out = False
        while not self.pieces:
            if self.failure is not None:
                raise self.failure
            if self.complete:
                return b""
            if within_s is None:
                await self._wait()
            else:
                try:
                    with anyio.fail_after(within_s):
                        await self._wait()
                except TimeoutError as exc:
                    raise httpx.ReadTimeout("timed out reading the answer") from exc
        piece = self._take()
        self.handed_out = True
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return piece

    def push_to(self, write: ChunkWrite) -> None:
        """From now on, the connection's callback writes each piece with ``write`` while the
        reader waits for more (``next_piece``)."""
        self.write = write

    def _take(self) -> bytes:
        piece = self._joined()
        self.pieces, self.waiting_bytes = [], 0
        return piece

    def _joined(self) -> bytes:
        return self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)

    def close(self) -> None:
        """Close the connection (at once: the request is written): how the server learns to
        stop, when the answer is not at its end."""
        if self.transport is not None:
            self.transport.close()

    async def _wait(self) -> None:
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            await self._wakeup
        finally:
            self._wakeup = None

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _fail(self, failure: httpx.TransportError) -> None:
        if self.failure is None and not self.complete:
            self.failure = failure
        self.close()

    # asyncio's callbacks.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.head_complete:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols unasked"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the answer is not valid HTTP/1.1: {exc}"))
        else:
            if not self.head_complete and self.head_bytes > MAX_ANSWER_HEAD_BYTES:
                self._fail(
                    httpx.RemoteProtocolError(
                        f"the answer's head is longer than {MAX_ANSWER_HEAD_BYTES:,} bytes"
                    )
                )
            elif self._written() and not self.complete:
                return  # nothing for the reader: it sleeps on
            if self.waiting_bytes > WAITING_BYTES_LIMIT and not self.reading_paused:
                assert self.transport is not None
                self.reading_paused = True
                self.transport.pause_reading()
        self._wake()

    def _written(self) -> bool:
        """Write the waiting pieces on with ``write``, where there is one and it may; True when
        it took them."""
        if not self.pieces or self.write is None or self.handed_out:
            return False
        if not self.write(self._joined()):
            return False
        self.pieces, self.waiting_bytes = [], 0
        return True

    def eof_received(self) -> bool:
        self._ended()
        return False  # close the connection

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            broken = httpx.ReadError if self.request_sent else httpx.WriteError
            self._fail(broken(str(exc) or type(exc).__name__))
        self._ended()
        self.writing_paused = False

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    def _ended(self) -> None:
        """The connection ended: the end of a body framed by it, else a cut."""
        if self.complete or self.failure is not None:
            pass
        elif not self.head_complete:
            self.failure = httpx.RemoteProtocolError(
                "the server closed the connection without answering"
            )
        elif self.sized:
            self.failure = httpx.RemoteProtocolError(
                "the server closed the connection before the answer's end"
            )
        else:
            self.complete = True
        self._wake()

    # llhttp's callbacks.
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        name = name.lower()
        if name == b"content-length" or (
            name == b"transfer-encoding" and value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        ):
            self.sized = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # informational: the answer follows
            self.reason, self.headers, self.sized = b"", [], False
            return
        self.status, self.head_complete = status, True

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        self.waiting_bytes += len(body)

    def on_message_complete(self) -> None:
        if self.head_complete:
            self.complete = True
            self.close()  # at once, not when the reader closes the answer


class AnswerBody(httpx.AsyncByteStream):
    """The body's bytes as they arrive: all that came together, in one piece."""

    def __init__(self, exchange: Exchange, read_s: float | None) -> None:
        self.exchange = exchange
        self.read_s = read_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while piece := await self.exchange.next_piece(self.read_s):
            yield piece

    async def aclose(self) -> None:
        self.exchange.close()
