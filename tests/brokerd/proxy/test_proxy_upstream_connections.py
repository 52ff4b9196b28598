"""The inference proxy opens a fresh upstream connection per request.

llama-server's router was seen to drop a kept-alive connection without answering the request
sent on it, a few milliseconds after another client hung up a stream. A proxy that reused
connections answered that request 502 ("upstream unreachable"), which loopd reads as a dead
server. The upstream here does the same on purpose: it answers the first request on each
connection and drops the connection when a second one arrives.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from starlette.applications import Starlette
from starlette.routing import Route

from brokerd.proxy.forward import Forwarder
from brokerd.proxy.inference import create_inference_app, inference_rules
from brokerd.proxy.upstream import parse_upstream
from tests.brokerd.proxy.proxy_support import raw_request, serving

pytestmark = pytest.mark.anyio

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class OneRequestPerConnection:
    """A raw HTTP upstream that answers only the first request of each connection."""

    connections: int = 0
    dropped: int = 0

    async def handle(self, stream: SocketStream) -> None:
        self.connections += 1
        async with stream:
            await _read_head(stream)
            await stream.send(ANSWER)
            try:
                await _read_head(stream)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return  # the client closed it: what a fresh-connection client does
            self.dropped += 1  # a second request on a kept-alive connection: no answer


async def _read_head(stream: SocketStream) -> None:
    received = b""
    while b"\r\n\r\n" not in received:
        received += await stream.receive()


@asynccontextmanager
async def upstream_on(path: Path, upstream: OneRequestPerConnection) -> AsyncIterator[str]:
    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, upstream.handle)
        try:
            yield f"unix:{path}"
        finally:
            tg.cancel_scope.cancel()
    await listener.aclose()


async def test_each_request_gets_its_own_upstream_connection(sock_dir: Path) -> None:
    upstream = OneRequestPerConnection()
    async with upstream_on(sock_dir / "llama.sock", upstream) as url:
        proxy = create_inference_app(parse_upstream(url))
        async with serving(sock_dir, {"infer": proxy}) as socks:
            statuses = [
                (await raw_request(socks["infer"], "GET", "/slots?model=m")).status
                for _ in range(3)
            ]
    assert statuses == [200, 200, 200]
    assert (upstream.connections, upstream.dropped) == (3, 0)


async def test_a_reusing_proxy_would_answer_502_here(sock_dir: Path) -> None:
    """The control: this upstream does break a proxy that keeps connections alive."""
    upstream = OneRequestPerConnection()
    async with upstream_on(sock_dir / "llama.sock", upstream) as url:
        forwarder = Forwarder(
            parse_upstream(url),
            inference_rules(None),
            body_cap=1 << 20,
            logger=logging.getLogger("test"),
            reuse_connections=True,
        )
        reusing = Starlette(routes=[Route("/{path:path}", endpoint=forwarder)])
        async with serving(sock_dir, {"infer": reusing}) as socks:
            first = await raw_request(socks["infer"], "GET", "/slots?model=m")
            second = await raw_request(socks["infer"], "GET", "/slots?model=m")
        await forwarder.aclose()
    assert (first.status, second.status) == (200, 502)
    assert upstream.dropped == 1
