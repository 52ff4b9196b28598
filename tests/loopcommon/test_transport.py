"""The daemons' HTTP client transport (``loopcommon/transport.py``): httpx over asyncio's own
streams, against real sockets: the clients that stream tokens read through it, it fails with
httpx's errors, it waits out a full backlog, and closing a response closes the socket at once."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from brokerd.proxy.upstream import parse_upstream
from loopcommon import transport
from loopcommon.transport import AsyncioTransport
from loopd.engine.client import InferenceClient
from loopd.errors import StreamCut

pytestmark = pytest.mark.anyio

LIMITS = httpx.Limits(max_keepalive_connections=0)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def chunked(*parts: bytes) -> bytes:
    """A chunked HTTP/1.1 200 whose body is ``parts``, each one chunk."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request's head and its body (a Content-Length's worth), and nothing more."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return head + await reader.readexactly(int(value))
    return head


@asynccontextmanager
async def unix_server(path: Path, handler: Handler) -> AsyncIterator[None]:
    server = await asyncio.start_unix_server(handler, path=str(path))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the reads that came through ``AsyncioStream.read``."""
    seen: list[int] = []
    original = transport.AsyncioStream.read

    async def counted(self: transport.AsyncioStream, max_bytes: int, **more: Any) -> bytes:
        data = await original(self, max_bytes, **more)
        seen.append(len(data))
        return data

    monkeypatch.setattr(transport.AsyncioStream, "read", counted)
    return seen


EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(5)]


async def answer_events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(chunked(*EVENTS))
    await writer.drain()
    writer.close()


async def test_the_inference_client_streams_through_asyncio_streams(
    tmp_path: Path, reads: list[int]
) -> None:
    sock = tmp_path / "s.sock"
    async with (
        unix_server(sock, answer_events),
        InferenceClient(f"unix:{sock}", "m") as client,
        client.stream_chat(b"{}") as answer,
    ):
        body = b"".join([chunk async for chunk in answer.aiter_raw()])
    assert body == b"".join(EVENTS)
    assert sum(reads) >= len(chunked(*EVENTS)), "the whole answer came through AsyncioStream.read"


async def test_brokerds_pooled_upstream_client_reads_through_asyncio_streams(
    tmp_path: Path, reads: list[int]
) -> None:
    # The chat proxy's (the inference proxy's, one connection per request, reads with httptools:
    # tests/brokerd/proxy/test_oneshot.py).
    sock = tmp_path / "s.sock"
    async with (
        unix_server(sock, answer_events),
        parse_upstream(f"unix:{sock}").client(reuse_connections=True) as client,
    ):
        response = await client.post("http://localhost/v1/chat/completions", content=b"{}")
    assert response.content == b"".join(EVENTS)
    assert sum(reads) >= len(chunked(*EVENTS))


def client_for(uds: Path | None = None, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=AsyncioTransport(limits=LIMITS, uds=None if uds is None else str(uds), **kwargs),
        timeout=httpx.Timeout(1.0),
    )


async def test_nothing_listening_is_a_connect_error(tmp_path: Path) -> None:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed below: nothing listens there
    async with client_for() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")
    async with client_for(tmp_path / "none.sock") as client:
        with pytest.raises(httpx.ConnectError, match="No such file"):
            await client.get("http://x/")


@pytest.fixture
def full_listener(tmp_path: Path) -> Iterator[tuple[Path, socket.socket, int]]:
    """A Unix listener whose backlog is full (a connect to it fails with EAGAIN until it accepts),
    and how many connections fill it."""
    path = tmp_path / "full.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(0)
    fillers: list[socket.socket] = []
    try:
        while True:  # one connection on Linux, for a backlog of 0
            one = socket.socket(socket.AF_UNIX)
            one.setblocking(False)
            try:
                one.connect(str(path))
            except BlockingIOError:
                one.close()
                break
            fillers.append(one)
        yield path, listener, len(fillers)
    finally:
        for one in fillers:
            one.close()
        listener.close()


async def test_a_backlog_that_stays_full_is_a_connect_timeout(
    full_listener: tuple[Path, socket.socket, int],
) -> None:
    # asyncio's own connect would take the socket for connected once it is writable.
    path, _, _ = full_listener
    client = httpx.AsyncClient(
        transport=AsyncioTransport(limits=LIMITS, uds=str(path)), timeout=httpx.Timeout(0.2)
    )
    async with client:
        with pytest.raises(httpx.ConnectTimeout):
            await client.get("http://x/")


async def test_a_backlog_that_frees_lets_the_request_through(
    full_listener: tuple[Path, socket.socket, int],
) -> None:
    path, listener, filled = full_listener
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    answers: list[httpx.Response] = []

    async def ask(client: httpx.AsyncClient) -> None:
        answers.append(await client.get("http://x/"))

    async with client_for(path) as client, anyio.create_task_group() as tg:
        tg.start_soon(ask, client)  # it connects while the backlog is full
        await anyio.lowlevel.checkpoint()
        for _ in range(filled):  # the queued connections first: room for the client's
            conn, _ = await loop.sock_accept(listener)
            conn.close()
        conn, _ = await loop.sock_accept(listener)
        with conn:
            conn.setblocking(False)
            await loop.sock_recv(conn, 65536)
            await loop.sock_sendall(conn, chunked(b"through"))
    assert answers[0].content == b"through"


async def test_a_server_that_never_answers_is_a_read_timeout(tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    held = anyio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await held.wait()
        writer.close()

    async with unix_server(sock, silent):
        client = httpx.AsyncClient(
            transport=AsyncioTransport(limits=LIMITS, uds=str(sock)),
            timeout=httpx.Timeout(5.0, read=0.2),
        )
        async with client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get("http://x/")
        held.set()


async def test_a_body_cut_off_is_a_stream_cut_for_loopd(tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        whole = chunked(*EVENTS)
        writer.write(whole[: len(whole) // 2])
        await writer.drain()
        writer.close()

    async with (
        unix_server(sock, cut),
        InferenceClient(f"unix:{sock}", "m") as client,
        client.stream_chat(b"{}") as answer,
    ):
        with pytest.raises(StreamCut, match="broke mid-stream"):
            async for _chunk in answer.aiter_raw():
                pass


async def test_closing_a_streamed_response_closes_the_socket_at_once(tmp_path: Path) -> None:
    # What stops a generation on the server: it sees the connection end while it still streams.
    sock = tmp_path / "s.sock"
    hung_up = anyio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        assert await reader.read(1) == b""  # the client's end of the connection, nothing else
        hung_up.set()
        writer.close()

    async with unix_server(sock, endless), InferenceClient(f"unix:{sock}", "m") as client:
        async with client.stream_chat(b"{}") as answer:
            assert await answer.receive() == b"data: "
        await hung_up.wait()


async def test_https_is_verified_and_read_through_asyncio_streams(
    certificate: tuple[Path, Path], reads: list[int]
) -> None:
    cert, key = certificate
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    server = await asyncio.start_server(answer_events, "127.0.0.1", 0, ssl=server_side)
    port = server.sockets[0].getsockname()[1]
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        async with client_for(verify=trusting) as client:
            response = await client.get(f"https://localhost:{port}/")
        assert response.content == b"".join(EVENTS)
        assert reads, "the TLS answer came through AsyncioStream.read"
        async with client_for() as client:  # the usual trust store does not know this one
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"https://localhost:{port}/")
    finally:
        server.close()
        await server.wait_closed()
