"""The daemons' HTTP client transport: httpx and httpcore's pool over asyncio's own streams.

llama-server sends a chunk per token, so a streamed answer is a socket read per token, in loopd's
inference client and again in brokerd's inference proxy, and what a read costs is most of what a
token costs either daemon. httpx reads through httpcore's anyio backend: per read, httpcore opens a
cancel scope and an exception-mapping context manager, and anyio's socket stream tries ``recv``,
registers the socket with the selector, waits, unregisters it and reads again. On the fake
streaming 4,000 tokens a second, that path is about two fifths of a bare httpx client's CPU per
token (``make bench``'s scale section prints both). asyncio's ``StreamReader`` keeps the socket
registered and buffers what arrives, so a read is a slice of its buffer and, when that is empty,
one future.

Only the network layer changes: HTTP/1.1 (h11), the pool, TLS settings and the mapping of errors to
httpx's are httpx's and httpcore's own, through httpcore's ``AsyncNetworkBackend`` interface.
Errors raised here are httpcore's (``ConnectError``, ``ReadError``, ...), which httpx maps as it
does its own backend's; each daemon maps httpx's on to its own. Both daemons' event loops are
asyncio's (anyio's asyncio backend); anyio's cancel scopes reach these awaits as they reach any
asyncio future.
"""

# The ``timeout`` parameters are httpcore's interface (ASYNC109 would have a scope instead).
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Iterable
from typing import Any

import anyio
import httpcore
import httpx

# A Unix socket whose listener's backlog is full refuses ``connect`` with EAGAIN instead of waiting:
# try again this often until the connect timeout.
_BACKLOG_RETRY_S = 0.01
# What asyncio buffers before it stops reading the socket (its own default): httpcore reads
# 64 KiB at a time.
_BUFFER_LIMIT = 64 * 1024


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection, read through asyncio's ``StreamReader``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        # A streamed body is read without a timeout (loopd's own limits watch it), so that path
        # costs no scope; a small call's read has httpx's timeout.
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            with anyio.fail_after(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "timed out reading") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            with anyio.fail_after(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "timed out writing") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        """Close the socket before returning: closing it is what stops a generation on the
        server (``loopd.engine.client.InferenceClient.stream_chat``)."""
        self._writer.close()
        with contextlib.suppress(OSError):  # broken already: closed all the same
            await self._writer.wait_closed()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            self._writer.close()
            raise httpcore.ConnectTimeout(str(exc) or "timed out in the TLS handshake") from exc
        except OSError as exc:  # ssl.SSLError among them
            self._writer.close()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        match info:
            case "ssl_object":
                return self._writer.get_extra_info("ssl_object")
            case "client_addr":
                return self._writer.get_extra_info("sockname")
            case "server_addr":
                return self._writer.get_extra_info("peername")
            case "socket":
                return self._writer.get_extra_info("socket")
            case "is_readable":
                # What the pool asks of an idle kept-alive connection: has the server closed it?
                # asyncio has already read what arrived, so the answer is in the reader.
                return self._reader.at_eof() or self._writer.is_closing()
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections for httpcore's pool, over asyncio's streams."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        opening = asyncio.open_connection(
            host, port, local_addr=local, limit=_BUFFER_LIMIT, happy_eyeballs_delay=0.25
        )
        return await _connected(opening, f"{host}:{port}", timeout, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await _connected(_open_unix(path), path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


async def _open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = await connect_unix(path)
    try:
        return await asyncio.open_unix_connection(sock=sock, limit=_BUFFER_LIMIT)
    except BaseException:
        sock.close()
        raise


async def connect_unix(path: str) -> socket.socket:
    """A non-blocking socket connected to the Unix socket ``path``: asyncio's own connect would
    wait for the socket to be writable after EAGAIN and take it as connected, but on a Unix socket
    EAGAIN means the listener's backlog was full and nothing was connected, so this tries again
    (until the caller's deadline)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        while True:
            try:
                sock.connect(path)
            except BlockingIOError:
                await anyio.sleep(_BACKLOG_RETRY_S)
            else:
                return sock
    except BaseException:
        sock.close()
        raise


async def _connected(
    opening: Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    where: str,
    timeout: float | None,
    options: Iterable[httpcore.SOCKET_OPTION] | None,
) -> AsyncioStream:
    """The stream ``opening`` opens within ``timeout``, with httpcore's errors for a connect."""
    try:
        with anyio.fail_after(timeout):
            reader, writer = await opening
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(str(exc) or f"timed out connecting to {where}") from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
    sock = writer.get_extra_info("socket")
    for option in options or ():
        sock.setsockopt(*option)
    return AsyncioStream(reader, writer)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport on ``AsyncioBackend``: the same HTTP, a cheaper read."""

    def __init__(
        self,
        *,
        limits: httpx.Limits,
        uds: str | None = None,
        verify: ssl.SSLContext | bool = True,
        trust_env: bool = True,
    ) -> None:
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=trust_env)
        super().__init__(verify=ssl_context, limits=limits, uds=uds, trust_env=trust_env)
        # httpx builds its pool without a way to name the network backend: the same pool, with
        # it (httpx is pinned; tests/loopcommon/test_transport.py checks that the clients read
        # through it).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            uds=uds,
            network_backend=AsyncioBackend(),
        )
