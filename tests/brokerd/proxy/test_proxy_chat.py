"""The chat proxy: REST allowlist, credential handling, WebSocket relay, redacted logs."""

import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from brokerd.proxy.chat import CHAT_ROUTES, create_chat_app, forwardable_close_code
from brokerd.proxy.chatpolicy import ChatPolicy
from brokerd.proxy.logs import REDACTED, configure_logging
from brokerd.proxy.upstream import parse_upstream
from tests.brokerd.proxy.proxy_support import (
    EchoUpstream,
    asgi_request,
    raw_request,
    serving,
    uds_client,
)

pytestmark = pytest.mark.anyio

TOKEN = "bot-token-7f3a9c"
POST_ID = "p" * 26
EXAMPLE_IDS = {
    "{user_id}": "u" * 26,
    "{channel_id}": "c" * 26,
    "{post_id}": POST_ID,
    "{file_id}": "f" * 26,
    "{emoji_name}": "white_check_mark",
}

REFUSED = [
    ("POST", "/api/v4/users/me/tokens"),
    ("GET", "/api/v4/users/tokens"),
    ("GET", "/api/v4/users/autocomplete"),
    ("GET", "/api/v4/users/stats"),
    ("POST", "/api/v4/users/search"),
    ("GET", "/api/v4/users/search"),
    ("GET", "/api/v4/channels/members"),
    ("GET", f"/api/v4/users/{'U' * 26}"),  # ids are lower case
    ("GET", f"/api/v4/users/{'u' * 25}"),
    ("GET", "/api/v4/system/ping"),  # allowed once, but the adapter never calls it
    ("GET", "/api/v4/users/me/tokens"),
    ("POST", "/api/v4/bots"),
    ("GET", "/api/v4/users"),
    ("POST", "/api/v4/users/login"),
    ("PUT", f"/api/v4/posts/{POST_ID}"),
    ("GET", "/api/v4/config"),
    ("PUT", "/api/v4/config"),
    ("GET", "/api/v4/system/logs"),
    ("POST", "/api/v4/channels"),
    ("POST", f"/api/v4/channels/{'c' * 26}/members"),
    ("GET", f"/api/v4/posts/{POST_ID}/../../users"),
    ("GET", "/api/v4/users/me%2Ftokens"),
    ("GET", "/api/v4/users/../config"),
    ("GET", "/api/v4/websocket"),  # only as an upgrade
    ("GET", "/api/v3/users/me"),
    ("GET", "/"),
]


def concrete(template: str) -> str:
    for placeholder, value in EXAMPLE_IDS.items():
        template = template.replace(placeholder, value)
    return template


# The reads: they pass as they are (writes are checked against the policy, further down).
REST_ROUTES = [
    (route.method, concrete(route.template))
    for route in CHAT_ROUTES
    if not route.template.endswith("/websocket") and route.acts_in is None
]


@dataclass
class WebSocketUpstream:
    """A Mattermost-like socket: says hello, echoes frames, closes with a code on request."""

    upgrade_headers: list[dict[str, str]] = field(default_factory=list)
    upgrade_queries: list[str] = field(default_factory=list)
    close_codes_from_client: list[int] = field(default_factory=list)
    client_closed: anyio.Event = field(default_factory=anyio.Event)
    refuse_with: int | None = None

    async def endpoint(self, websocket: WebSocket) -> None:
        self.upgrade_headers.append(dict(websocket.headers))
        self.upgrade_queries.append(websocket.url.query)
        if self.refuse_with is not None:
            await websocket.close()
            return
        await websocket.accept()
        await websocket.send_text('{"event":"hello","seq":0}')
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                self.close_codes_from_client.append(message.get("code", 1000))
                self.client_closed.set()
                return
            if message.get("text") == "close-4001":
                await websocket.close(4001, "sequence mismatch")
                return
            if message.get("text") is not None:
                await websocket.send_text("echo:" + message["text"])
            else:
                await websocket.send_bytes(b"echo:" + message["bytes"])


@asynccontextmanager
async def chat_proxy(
    sock_dir: Path, rest: EchoUpstream, ws: WebSocketUpstream | None = None
) -> AsyncIterator[Path]:
    ws = ws or WebSocketUpstream()
    upstream = Starlette(
        routes=[
            WebSocketRoute("/api/v4/websocket", ws.endpoint),
            Route("/{path:path}", endpoint=rest),
        ]
    )
    async with serving(sock_dir, {"mm": upstream}) as up:
        upstream_url = parse_upstream(f"unix:{up['mm']}")
        proxy = create_chat_app(upstream_url, bot_token=TOKEN, policy=ChatPolicy.everyone())
        async with serving(sock_dir, {"chat": proxy}) as socks:
            yield socks["chat"]


@pytest.mark.parametrize(("method", "path"), REST_ROUTES)
async def test_allowed_rest_calls_pass_with_the_bot_token(
    sock_dir: Path, method: str, path: str
) -> None:
    rest = EchoUpstream()
    async with chat_proxy(sock_dir, rest) as chat:
        body = b""
        response = await raw_request(chat, method, f"{path}?since=17&per_page=200", body=body)
    assert response.status == 200
    [seen] = rest.seen
    assert (seen.method, seen.path, seen.query, seen.body) == (
        method,
        path,
        b"since=17&per_page=200",
        body,
    )
    assert seen.header("authorization") == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize(("method", "path"), REFUSED)
async def test_other_paths_are_refused_in_mattermosts_envelope(
    sock_dir: Path, method: str, path: str
) -> None:
    upstream = parse_upstream(f"unix:{sock_dir}/nothing.sock")
    proxy = create_chat_app(upstream, bot_token=TOKEN, policy=ChatPolicy.everyone())
    response = await asgi_request(proxy, method, path, body=b"{}" if method != "GET" else b"")
    assert response.status == 403
    error = response.json()
    assert isinstance(error, dict)
    assert error["status_code"] == 403
    assert method in str(error["message"])


async def test_box_credentials_are_stripped_and_session_headers_dropped(sock_dir: Path) -> None:
    rest = EchoUpstream(
        extra_response_headers=[(b"set-cookie", b"MMAUTHTOKEN=s"), (b"token", b"t")]
    )
    async with chat_proxy(sock_dir, rest) as chat, uds_client(chat) as client:
        response = await client.get(
            "/api/v4/users/me?access_token=box&x=1&access_token=again",
            headers={
                "Authorization": "Bearer box",
                "Cookie": "MMAUTHTOKEN=box",
                "X-Requested-With": "XMLHttpRequest",
                "Origin": "http://evil.invalid",
                "X-Request-Id": "kept",
            },
        )
    assert response.status_code == 200
    assert "set-cookie" not in response.headers
    assert "token" not in response.headers
    [seen] = rest.seen
    assert seen.query == b"x=1"
    assert seen.header("authorization") == [f"Bearer {TOKEN}"]
    for dropped in ("cookie", "x-requested-with", "origin"):
        assert seen.header(dropped) == [], dropped
    assert seen.header("x-request-id") == ["kept"]


async def test_websocket_frames_pass_both_ways_with_the_token_added_at_upgrade(
    sock_dir: Path,
) -> None:
    ws = WebSocketUpstream()
    async with chat_proxy(sock_dir, EchoUpstream(), ws) as chat:
        uri = "ws://box/api/v4/websocket?connection_id=abc&sequence_number=5&access_token=box"
        headers = {"Authorization": "Bearer box", "Cookie": "MMAUTHTOKEN=box"}
        async with unix_connect(str(chat), uri, additional_headers=headers) as box:
            with anyio.fail_after(5):
                assert await box.recv() == '{"event":"hello","seq":0}'
                await box.send('{"action":"ping","seq":1}')
                assert await box.recv() == 'echo:{"action":"ping","seq":1}'
                await box.send(b"\x00\x01")
                assert await box.recv() == b"echo:\x00\x01"
                await box.close(4000, "ping timeout")
                await ws.client_closed.wait()
    [upgrade] = ws.upgrade_headers
    assert upgrade["authorization"] == f"Bearer {TOKEN}"
    assert "cookie" not in upgrade
    assert ws.upgrade_queries == ["connection_id=abc&sequence_number=5"]
    assert ws.close_codes_from_client == [4000]


async def test_upstream_close_code_reaches_the_box(sock_dir: Path) -> None:
    async with (
        chat_proxy(sock_dir, EchoUpstream()) as chat,
        unix_connect(str(chat), "ws://box/api/v4/websocket") as box,
    ):
        with anyio.fail_after(5):
            await box.recv()
            await box.send("close-4001")
            with pytest.raises(ConnectionClosed) as closed:
                await box.recv()
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "sequence mismatch")


async def test_an_upgrade_refused_upstream_is_refused_to_the_box(sock_dir: Path) -> None:
    ws = WebSocketUpstream(refuse_with=403)
    async with chat_proxy(sock_dir, EchoUpstream(), ws) as chat:
        with pytest.raises(InvalidStatus) as refused:
            await unix_connect(str(chat), "ws://box/api/v4/websocket")
    assert refused.value.response.status_code == 403


def test_close_codes_that_cannot_be_sent_become_1011() -> None:
    assert [forwardable_close_code(c) for c in (1000, 4001, 1005, 1006, None)] == [
        1000,
        4001,
        1011,
        1011,
        1011,
    ]


@pytest.fixture
def log_output(restored_logging: None) -> io.StringIO:
    """brokerd's logging at DEBUG (library debug output included) into a buffer."""
    buffer = io.StringIO()
    configure_logging(secrets=[TOKEN], level=logging.DEBUG, stream=buffer)
    return buffer


async def test_the_token_never_reaches_the_log(sock_dir: Path, log_output: io.StringIO) -> None:
    async with chat_proxy(sock_dir, EchoUpstream()) as chat:
        await raw_request(chat, "GET", "/api/v4/users/me")
        await raw_request(chat, "POST", "/api/v4/users/me/tokens", body=b"{}")
        async with unix_connect(str(chat), "ws://box/api/v4/websocket") as box:
            await box.recv()
    logged = log_output.getvalue()
    assert "GET /api/v4/users/me -> 200" in logged
    # The WebSocket client logs its upgrade headers at DEBUG: the line is there, redacted.
    assert f"Authorization: Bearer {REDACTED}" in logged
    assert TOKEN not in logged
