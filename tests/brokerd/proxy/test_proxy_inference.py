"""The inference proxy against small upstreams served on Unix sockets."""

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from starlette.types import ASGIApp

from brokerd.proxy.inference import ALLOWED_ROUTES, create_inference_app, refusal
from brokerd.proxy.upstream import parse_upstream
from tests.brokerd.proxy.proxy_support import (
    EchoUpstream,
    StreamingUpstream,
    asgi_request,
    raw_request,
    serving,
    sse_event,
    uds_client,
)

pytestmark = pytest.mark.anyio

RAW_COMPLETION_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: box\r\nContent-Length: 2\r\n\r\n{}"
)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

# Routes llama-server has that change its state, leak its internals, or outlive a hang-up.
DANGEROUS = [
    ("POST", "/slots/0?action=save"),
    ("POST", "/slots/0?action=restore"),
    ("POST", "/slots/0?action=erase"),
    ("POST", "/slots/1"),
    ("POST", "/slots"),
    ("POST", "/slots?action=erase"),
    ("GET", "/slots?action=erase"),
    ("GET", "/slots?model=m&action=save"),
    ("GET", "/slots?model=m&act%69on=save"),
    ("GET", "/slots/0"),
    ("POST", "/models/load"),
    ("POST", "/models/unload"),
    ("POST", "/models"),
    ("DELETE", "/models"),
    ("GET", "/models/sse"),
    ("POST", "/props"),
    ("GET", "/metrics"),
    ("GET", "/v1/stream?conv_id=c&from=0"),
    ("DELETE", "/v1/stream?conv_id=c"),
    ("POST", "/completion"),
    ("POST", "/v1/completions"),
    ("POST", "/infill"),
    ("POST", "/embedding"),
    ("POST", "/v1/embeddings"),
    ("POST", "/detokenize"),
    ("GET", "/lora-adapters"),
    ("POST", "/lora-adapters"),
    ("GET", "/cors-proxy?url=http://example.invalid/"),
    ("POST", "/tools"),
    ("GET", "/"),
    ("GET", "/index.html"),
    # Other spellings of allowed or refused paths.
    ("GET", "//slots"),
    ("GET", "/slots/"),
    ("GET", "/SLOTS"),
    ("GET", "/v1/../slots/0"),
    ("GET", "/health/../slots/0"),
    ("POST", "/slots%2F0?action=erase"),
    ("POST", "/v1/chat/completions/"),
    ("POST", "/v1/chat/completions/control/../../../slots/0"),
]


def wrong_methods() -> list[tuple[str, str]]:
    """Every table path with each method the table does not pair it with."""
    paths = sorted({path for _, path in ALLOWED_ROUTES})
    return [(m, p) for p in paths for m in METHODS if (m, p) not in ALLOWED_ROUTES]


@asynccontextmanager
async def proxied(
    sock_dir: Path, upstream: ASGIApp, *, api_key: str | None = None, body_cap: int = 1 << 20
) -> AsyncIterator[Path]:
    """The upstream on llama.sock and the proxy (pointed at it) on infer.sock."""
    async with serving(sock_dir, {"llama": upstream}) as up:
        proxy = create_inference_app(
            parse_upstream(f"unix:{up['llama']}"), api_key=api_key, body_cap=body_cap
        )
        async with serving(sock_dir, {"infer": proxy}) as socks:
            yield socks["infer"]


@pytest.mark.parametrize(("method", "target"), DANGEROUS + wrong_methods())
async def test_refused_requests_get_403_and_are_not_forwarded(
    sock_dir: Path, method: str, target: str
) -> None:
    # Nothing listens upstream: a request the proxy forwarded would come back 502, not 403.
    proxy = create_inference_app(parse_upstream(f"unix:{sock_dir}/nothing.sock"))
    response = await asgi_request(proxy, method, target, body=b"{}" if method == "POST" else b"")
    assert response.status == 403
    error = response.json()
    assert isinstance(error, dict)
    assert error["error"]["code"] == 403
    assert error["error"]["type"] == "permission_error"
    assert f"{method} /" in error["error"]["message"]


async def test_a_refused_request_over_the_socket_never_reaches_upstream(sock_dir: Path) -> None:
    upstream = EchoUpstream()
    async with proxied(sock_dir, upstream.app()) as infer:
        refused = await raw_request(infer, "POST", "/slots/0?action=erase", body=b"{}")
        dotted = await raw_request(infer, "GET", "/v1/../slots/0")
        allowed = await raw_request(infer, "GET", "/slots?model=m")
    assert (refused.status, dotted.status, allowed.status) == (403, 403, 200)
    assert [(seen.method, seen.path) for seen in upstream.seen] == [("GET", "/slots")]


@pytest.mark.parametrize(("method", "path"), sorted(ALLOWED_ROUTES))
async def test_allowed_requests_pass_with_their_query_strings(
    sock_dir: Path, method: str, path: str
) -> None:
    upstream = EchoUpstream()
    query = "model=ornith%2F1.5&autoload=false&x=a+b"
    async with proxied(sock_dir, upstream.app()) as infer:
        body = b'{"model":"m"}' if method == "POST" else b""
        response = await raw_request(infer, method, f"{path}?{query}", body=body)
    assert response.status == 200
    [seen] = upstream.seen
    assert (seen.method, seen.path, seen.query, seen.body) == (method, path, query.encode(), body)


def test_refusal_table_is_pure() -> None:
    assert refusal("GET", "/slots", b"model=m&fail_on_no_slot=1") is None
    assert refusal("GET", "/slots", b"model=m&action=erase") is not None
    assert refusal("POST", "/slots", b"") is not None
    assert refusal("POST", "/v1/chat/completions", b"") is None


async def test_box_credentials_and_conversation_id_are_stripped_and_key_added(
    sock_dir: Path,
) -> None:
    upstream = EchoUpstream()
    sent = {
        "Authorization": "Bearer from-the-box",
        "X-Api-Key": "box-key",
        "Cookie": "session=1",
        "X-Conversation-Id": "conv-1",
        "Keep-Alive": "timeout=5",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "named by Connection",
        "X-Trace": "kept",
    }
    async with (
        proxied(sock_dir, upstream.app(), api_key="host-key") as infer,
        uds_client(infer) as client,
    ):
        response = await client.post("/v1/chat/completions", content=b"{}", headers=sent)
    assert response.status_code == 200
    [seen] = upstream.seen
    assert seen.header("authorization") == ["Bearer host-key"]
    for dropped in ("x-api-key", "cookie", "x-conversation-id", "keep-alive", "x-hop"):
        assert seen.header(dropped) == [], dropped
    assert seen.header("x-trace") == ["kept"]


async def test_without_a_key_no_authorization_reaches_upstream(sock_dir: Path) -> None:
    upstream = EchoUpstream()
    async with proxied(sock_dir, upstream.app()) as infer, uds_client(infer) as client:
        await client.get("/health", headers={"Authorization": "Bearer from-the-box"})
    assert upstream.seen[0].header("authorization") == []


def json_of_size(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes."""
    return b'{"content":"' + b"x" * (size - 14) + b'"}'


async def test_body_over_the_cap_gets_413(sock_dir: Path) -> None:
    upstream = EchoUpstream()
    async with proxied(sock_dir, upstream.app(), body_cap=1000) as infer:
        at_cap = await raw_request(infer, "POST", "/tokenize", body=json_of_size(1000))
        over = await raw_request(infer, "POST", "/tokenize", body=json_of_size(1001))
        async with uds_client(infer) as client:

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: caught while read
                for _ in range(3):
                    yield b"y" * 600

            streamed = await client.post("/tokenize", content=chunks())
    assert at_cap.status == 200
    assert over.status == 413
    assert streamed.status_code == 413
    error = over.json()
    assert isinstance(error, dict)
    assert error["error"]["code"] == 413
    assert [len(seen.body) for seen in upstream.seen] == [1000]


async def test_stream_events_reach_the_client_as_the_upstream_emits_them(sock_dir: Path) -> None:
    pace = 0.2
    upstream = StreamingUpstream(events=[sse_event(n) for n in range(4)], pace_s=pace)
    arrived_at: list[float] = []
    async with (
        proxied(sock_dir, upstream.app()) as infer,
        uds_client(infer) as client,
        client.stream("POST", "/v1/chat/completions", content=b"{}") as response,
    ):
        received = b""
        async for chunk in response.aiter_raw():
            received += chunk
            while received.count(b"\n\n") > len(arrived_at):
                arrived_at.append(time.monotonic())
    assert received == b"".join(sse_event(n) for n in range(4))
    assert len(arrived_at) == len(upstream.emitted_at) == 4
    for n, (emitted, arrived) in enumerate(zip(upstream.emitted_at, arrived_at, strict=True)):
        assert arrived - emitted < pace / 2, f"event {n} waited {arrived - emitted:.3f} s"
        if n + 1 < len(upstream.emitted_at):
            assert arrived < upstream.emitted_at[n + 1]


async def test_no_bytes_reach_the_client_while_the_upstream_holds_the_response(
    sock_dir: Path,
) -> None:
    hold = anyio.Event()
    upstream = StreamingUpstream(events=[sse_event(0)], hold=hold)
    async with (
        proxied(sock_dir, upstream.app()) as infer,
        await anyio.connect_unix(infer) as stream,
    ):
        await stream.send(RAW_COMPLETION_REQUEST)
        with anyio.fail_after(2):
            await upstream.request_seen.wait()
        early = b""
        with anyio.move_on_after(0.3):
            early = await stream.receive()
        assert early == b""
        hold.set()
        with anyio.fail_after(2):
            first = await stream.receive()
    assert first.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("while_held", [True, False], ids=["queued", "streaming"])
async def test_client_hang_up_closes_the_upstream_request_within_a_second(
    sock_dir: Path, while_held: bool
) -> None:
    hold = anyio.Event()
    upstream = StreamingUpstream(
        events=[sse_event(0)], hold=hold if while_held else None, endless=True
    )
    async with proxied(sock_dir, upstream.app()) as infer:
        async with await anyio.connect_unix(infer) as stream:
            await stream.send(RAW_COMPLETION_REQUEST)
            with anyio.fail_after(2):
                await upstream.request_seen.wait()
                received = b""
                while not while_held and sse_event(0) not in received:
                    received += await stream.receive()
        assert not upstream.disconnected.is_set()
        with anyio.fail_after(1):
            await upstream.disconnected.wait()


async def test_unreachable_upstream_gets_502_in_the_servers_envelope(sock_dir: Path) -> None:
    proxy = create_inference_app(parse_upstream(f"unix:{sock_dir}/absent.sock"))
    async with serving(sock_dir, {"infer": proxy}) as socks:
        response = await raw_request(socks["infer"], "GET", "/slots?model=m")
    assert response.status == 502
    error = response.json()
    assert isinstance(error, dict)
    assert error["error"]["type"] == "unavailable_error"
