"""Small upstreams and clients for the proxy tests, served for real on Unix sockets."""

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import anyio
import httpx
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brokerd.serve import Endpoint, serve


@asynccontextmanager
async def serving(socket_dir: Path, apps: dict[str, ASGIApp]) -> AsyncIterator[dict[str, Path]]:
    """Serve each app on ``socket_dir/<name>.sock`` with brokerd's own server; yield the paths."""
    endpoints = [Endpoint(name, socket_dir / f"{name}.sock", app) for name, app in apps.items()]
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(_serve, endpoints, socket_dir, stop)
        try:
            yield {endpoint.name: endpoint.path for endpoint in endpoints}
        finally:
            stop.set()


async def _serve(
    endpoints: Sequence[Endpoint],
    socket_dir: Path,
    stop: anyio.Event,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await serve(endpoints, socket_dir, stop, graceful_shutdown_s=1, task_status=task_status)


def uds_client(path: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(path)), base_url="http://box", timeout=5.0
    )


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


async def raw_request(
    path: Path,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
) -> RawResponse:
    """One HTTP/1.1 request written byte for byte (httpx would normalise odd paths)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: box", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    received = bytearray()
    with anyio.fail_after(5):
        async with await anyio.connect_unix(path) as stream:
            await stream.send(head + body)
            try:
                while True:
                    received += await stream.receive()
            except anyio.EndOfStream:
                pass
    head_bytes, _, rest = bytes(received).partition(b"\r\n\r\n")
    status_line, *header_lines = head_bytes.decode("latin-1").split("\r\n")
    parsed = dict(line.split(": ", 1) for line in header_lines)
    return RawResponse(int(status_line.split()[1]), {k.lower(): v for k, v in parsed.items()}, rest)


@dataclass
class SeenRequest:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v.decode() for k, v in self.headers if k.decode().lower() == name.lower()]


@dataclass
class EchoUpstream:
    """Answers every request with 200 and a small JSON echo; remembers what it was sent."""

    seen: list[SeenRequest] = field(default_factory=list)
    extra_response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        message: Message = await receive()
        body += message.get("body", b"")
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        request = SeenRequest(
            scope["method"], scope["path"], scope["query_string"], scope["headers"], bytes(body)
        )
        self.seen.append(request)
        reply = json.dumps({"path": request.path, "body_bytes": len(body)}).encode()
        headers = [(b"content-type", b"application/json"), *self.extra_response_headers]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", endpoint=self)])


@dataclass
class StreamingUpstream:
    """A llama-server-like SSE endpoint under test control.

    ``hold`` keeps the response (status line included) back until set, as a queued request is
    held. After the scripted events, ``endless`` keeps the stream open. It notes when each event
    was written and when (and whether) the client side of its connection went away.
    """

    events: Sequence[bytes]
    pace_s: float = 0.0
    hold: anyio.Event | None = None
    endless: bool = False
    request_seen: anyio.Event = field(default_factory=anyio.Event)
    disconnected: anyio.Event = field(default_factory=anyio.Event)
    emitted_at: list[float] = field(default_factory=list)
    _complete: bool = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        while message.get("more_body"):
            message = await receive()
        self.request_seen.set()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
            if self.hold is not None:
                await self.hold.wait()
            headers = [(b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for event in self.events:
                await anyio.sleep(self.pace_s)
                self.emitted_at.append(time.monotonic())
                await send({"type": "http.response.body", "body": event, "more_body": True})
            if self.endless:
                await anyio.sleep_forever()
            self._complete = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        message: Message = await receive()
        while message["type"] != "http.disconnect":
            message = await receive()
        if not self._complete:
            self.disconnected.set()
            scope.cancel()

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", endpoint=self)])


def sse_event(n: int) -> bytes:
    return f'data: {{"n":{n}}}\n\n'.encode()


async def asgi_request(
    app: ASGIApp,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
) -> RawResponse:
    """Call an ASGI app in process with the scope an HTTP server would build for ``target``
    (path percent-decoded, query raw): fast, and exact for paths httpx would normalise."""
    raw_path, _, query = target.partition("?")
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
        "client": None,
        "server": None,
    }
    messages: list[Message] = []
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        messages.append(message)

    with anyio.fail_after(5):
        await app(scope, receive, send)
    start = messages[0]
    response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    content = b"".join(m.get("body", b"") for m in messages[1:])
    return RawResponse(start["status"], response_headers, content)
