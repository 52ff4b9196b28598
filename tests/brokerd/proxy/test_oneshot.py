"""The inference proxy's upstream reads (``brokerd.proxy.oneshot``) and the server's direct writes
(``brokerd.listen.CycleWrites``): a streamed answer reaches the box byte for byte however the
upstream's bytes are split, in order whether the body goes by the callback or by the task, and
the reads and writes stay bounded."""

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from brokerd.listen import MAX_HEAD_BYTES, CycleWrites
from brokerd.observe.metrics import BrokerdMetrics
from brokerd.observe.middleware import Instrumented
from brokerd.proxy.inference import create_inference_app
from brokerd.proxy.oneshot import WAITING_BYTES_LIMIT, Exchange, OneShotTransport
from brokerd.proxy.upstream import parse_upstream
from tests.brokerd.proxy.proxy_support import EchoUpstream, raw_request, serving
from tests.loopcommon.test_transport import Handler, read_request, unix_server

pytestmark = pytest.mark.anyio

EVENTS = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % n for n in range(6)]
BODY = b"".join(EVENTS)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ANSWER = HEAD + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


class FakeTransport(asyncio.Transport):
    """What an ``Exchange`` or a response cycle does to its connection, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.reading = True
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def exchange_on(transport: FakeTransport) -> Exchange:
    exchange = Exchange()
    exchange.connection_made(transport)
    return exchange


class Taking:
    """A write that takes every piece (or, ``refusing_every_other``, every second one)."""

    def __init__(self, *, refusing_every_other: bool = False) -> None:
        self.taken: list[bytes] = []
        self.refusing = refusing_every_other
        self.calls = 0

    def __call__(self, piece: bytes) -> bool:
        self.calls += 1
        if self.refusing and self.calls % 2:
            return False
        self.taken.append(piece)
        return True


def split(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


# -- the answer read with llhttp ----------------------------------------------------------------


def test_an_answer_split_at_every_size_is_read_whole_by_the_callback() -> None:
    for size in range(1, len(ANSWER) + 1):
        exchange = exchange_on(FakeTransport())
        write = Taking()
        exchange.push_to(write)
        for piece in split(ANSWER, size):
            exchange.data_received(piece)
        assert exchange.complete, size
        assert exchange.status == 200
        assert b"".join(write.taken) + b"".join(exchange.pieces) == BODY, size


async def test_an_answer_split_at_every_size_keeps_its_order_when_the_write_refuses() -> None:
    # The client's buffer is full every other time: what the write refused goes to the task,
    # which sends it before the callback writes anything newer.
    for size in range(1, len(ANSWER) + 1):
        exchange = exchange_on(FakeTransport())
        write = Taking(refusing_every_other=True)  # what it takes goes to the same list
        exchange.push_to(write)
        reader_turn = True
        for piece in split(ANSWER, size):
            exchange.data_received(piece)
            if reader_turn and exchange.pieces:  # the task takes what was refused, sends it
                write.taken.append(await exchange.next_piece())
            reader_turn = not reader_turn
        while piece := await exchange.next_piece():
            write.taken.append(piece)
        assert b"".join(write.taken) == BODY, size


async def test_the_callback_waits_while_the_task_holds_pieces_it_has_not_sent() -> None:
    exchange = exchange_on(FakeTransport())
    write = Taking()
    exchange.data_received(HEAD + b"5\r\nfirst\r\n")  # with the head: the task's
    exchange.push_to(write)
    assert await exchange.next_piece() == b"first"
    exchange.data_received(b"6\r\nsecond\r\n")  # "first" may not be sent yet
    assert write.taken == []
    assert await exchange.next_piece() == b"second"  # asking again: "first" was sent
    ends: list[bytes] = []

    async def read_on() -> None:  # "second" sent, the task waits for more
        ends.append(await exchange.next_piece())

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_on)
        await anyio.wait_all_tasks_blocked()
        exchange.data_received(b"5\r\nthird\r\n0\r\n\r\n")
    assert write.taken == [b"third"]
    assert ends == [b""]


async def test_reading_pauses_while_the_body_waits_for_a_slow_client() -> None:
    transport = FakeTransport()
    exchange = exchange_on(transport)
    exchange.push_to(lambda piece: False)  # the client's buffer stays full
    exchange.data_received(HEAD)
    piece = b"x" * 4096
    while transport.reading:
        exchange.data_received(b"%x\r\n%s\r\n" % (len(piece), piece))
    assert WAITING_BYTES_LIMIT < exchange.waiting_bytes <= WAITING_BYTES_LIMIT + len(piece)
    taken = await exchange.next_piece()
    assert transport.reading
    assert len(taken) == WAITING_BYTES_LIMIT // len(piece) * len(piece) + len(piece)


def test_an_answer_body_framed_by_the_connections_end_is_whole_there() -> None:
    exchange = exchange_on(FakeTransport())
    exchange.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
    exchange.eof_received()
    assert exchange.complete
    assert exchange.failure is None
    assert exchange.pieces == [b"all of it"]


# -- the transport, against real sockets --------------------------------------------------------


def answer_in_pieces(*sizes: int) -> Handler:
    """Answers each request with ``ANSWER`` written in pieces of the next of ``sizes``."""
    next_size = iter(sizes)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in split(ANSWER, next(next_size)):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()

    return answer


async def test_the_transport_sends_the_request_httpx_built_and_streams_the_answer(
    sock_dir: Path,
) -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(ANSWER)
        writer.close()

    async with (
        unix_server(sock_dir / "up.sock", answer),
        httpx.AsyncClient(transport=OneShotTransport(uds=str(sock_dir / "up.sock"))) as client,
    ):
        response = await client.post("http://localhost/v1/chat/completions?a=b", content=b"{}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.content == BODY
    [request] = seen
    assert request.startswith(b"POST /v1/chat/completions?a=b HTTP/1.1\r\nHost: localhost\r\n")
    assert request.endswith(b"Content-Length: 2\r\n\r\n{}")


async def test_the_transport_fails_with_httpxs_errors(sock_dir: Path) -> None:
    absent = OneShotTransport(uds=str(sock_dir / "absent.sock"))
    async with httpx.AsyncClient(transport=absent) as client:
        with pytest.raises(httpx.ConnectError, match="No such file"):
            await client.get("http://localhost/health")
        with pytest.raises(httpx.LocalProtocolError, match="HEAD"):
            await client.head("http://localhost/health")
        with pytest.raises(httpx.LocalProtocolError, match="line break"):
            await client.get("http://localhost/health", headers={"x-a": "1\r\nx-b: 2"})

    hung_up = anyio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client closes
        writer.close()
        hung_up.set()

    async with (
        unix_server(sock_dir / "up.sock", silent),
        httpx.AsyncClient(
            transport=OneShotTransport(uds=str(sock_dir / "up.sock")),
            timeout=httpx.Timeout(5.0, read=0.2),
        ) as client,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await client.get("http://localhost/health")
        with anyio.fail_after(5):
            await hung_up.wait()  # the connection closed with the timeout


async def test_https_is_verified(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ANSWER)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_side)
    url = f"https://localhost:{server.sockets[0].getsockname()[1]}/health"
    try:
        trusting = OneShotTransport(ssl_context=ssl.create_default_context(cafile=str(cert)))
        async with httpx.AsyncClient(transport=trusting) as client:
            assert (await client.get(url)).content == BODY
        async with httpx.AsyncClient(transport=OneShotTransport()) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(url)
    finally:
        server.close()
        await server.wait_closed()


# -- through brokerd's server --------------------------------------------------------------------


@asynccontextmanager
async def relaying(
    sock_dir: Path,
    answer: Handler,
    metrics: BrokerdMetrics | None = None,
) -> AsyncIterator[Path]:
    """``answer`` as the upstream of an instrumented inference proxy served by brokerd."""
    async with unix_server(sock_dir / "up.sock", answer):
        app = create_inference_app(parse_upstream(f"unix:{sock_dir}/up.sock"))
        instrumented = Instrumented("infer", app, metrics or BrokerdMetrics())
        async with serving(sock_dir, {"infer": instrumented}) as socks:
            yield socks["infer"]


async def test_the_box_gets_the_answer_byte_for_byte_however_the_upstream_splits_it(
    sock_dir: Path,
) -> None:
    sizes = range(1, len(ANSWER) + 1)
    async with relaying(sock_dir, answer_in_pieces(*sizes)) as infer:
        for size in sizes:
            response = await raw_request(infer, "POST", "/v1/chat/completions", body=b"{}")
            assert response.status == 200, size
            assert dechunked(response.body) == BODY, size


def dechunked(body: bytes) -> bytes:
    """A chunked body's content; AssertionError unless it ends with the last chunk."""
    content, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", "not the end of a chunked body"
            return content
        content, rest = content + rest[:size], rest[size + 2 :]


async def test_the_bytes_written_from_the_callback_are_counted(sock_dir: Path) -> None:
    metrics = BrokerdMetrics()
    async with relaying(sock_dir, answer_in_pieces(len(ANSWER) // 3), metrics) as infer:
        response = await raw_request(infer, "POST", "/v1/chat/completions", body=b"{}")
    assert dechunked(response.body) == BODY
    assert metrics.bytes.labels("infer", "to_box")._value.get() == len(BODY)


async def test_a_request_head_over_the_bound_gets_431(sock_dir: Path) -> None:
    async with serving(sock_dir, {"any": EchoUpstream().app()}) as socks:
        padded = [("X-Pad", "a" * (MAX_HEAD_BYTES - 200))]
        within = await raw_request(socks["any"], "GET", "/health", headers=padded)
        over = await raw_request(socks["any"], "GET", "/health", headers=padded * 2)
    assert within.status == 200
    assert over.status == 431


# -- the server's direct writes ------------------------------------------------------------------


def cycle_on(transport: FakeTransport, method: str = "POST") -> RequestResponseCycle:
    scope = {"type": "http", "method": method, "http_version": "1.1", "headers": []}
    return RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type]
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


START = {"type": "http.response.start", "status": 200, "headers": []}


async def test_a_chunk_written_directly_is_the_chunk_uvicorn_sends() -> None:
    sent, direct = FakeTransport(), FakeTransport()
    by_send, by_write = cycle_on(sent), cycle_on(direct)
    await by_send.send(START)  # type: ignore[arg-type]
    await by_write.send(START)  # type: ignore[arg-type]
    for event in EVENTS:
        await by_send.send({"type": "http.response.body", "body": event, "more_body": True})
        assert CycleWrites(by_write).write_chunk(event)
    assert CycleWrites(by_write).write_chunk(b"")  # nothing: an empty chunk would end the body
    assert direct.written == sent.written
    assert dechunked(bytes(direct.written).partition(b"\r\n\r\n")[2] + b"0\r\n\r\n") == BODY


async def test_a_direct_write_is_refused_wherever_send_would_do_more() -> None:
    transport = FakeTransport()
    cycle = cycle_on(transport)
    writes = CycleWrites(cycle)
    assert not writes.write_chunk(b"x")  # before the start
    await cycle.send(START)  # type: ignore[arg-type]
    cycle.flow.pause_writing()
    assert not writes.write_chunk(b"x")  # the client's buffer is full: send would wait
    cycle.flow.resume_writing()
    assert writes.write_chunk(b"x")
    await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert not writes.write_chunk(b"x")  # after the end

    sized = cycle_on(FakeTransport())
    length = {**START, "headers": [(b"content-length", b"1")]}
    await sized.send(length)  # type: ignore[arg-type]
    assert not CycleWrites(sized).write_chunk(b"x")  # not a chunked body

    gone = cycle_on(FakeTransport())
    await gone.send(START)  # type: ignore[arg-type]
    gone.disconnected = True
    assert not CycleWrites(gone).write_chunk(b"x")


async def test_an_abort_cuts_the_connection_and_leaves_uvicorn_nothing_to_say() -> None:
    transport = FakeTransport()
    cycle = cycle_on(transport)
    await cycle.send(START)  # type: ignore[arg-type]
    CycleWrites(cycle).abort()
    assert transport.closed
    assert cycle.disconnected  # run_asgi logs nothing for a disconnected client
    await cycle.send({"type": "http.response.body", "body": b"late", "more_body": False})
    assert b"late" not in transport.written
    assert not transport.written.endswith(b"0\r\n\r\n")
