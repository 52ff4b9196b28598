"""The inference relay between brokerd and llama-server: scripted tool rounds and stream faults.

brokerd's inference proxy forwards to this relay, which forwards to the real router, byte for
byte, except:

- a chat request whose turn asks for tool calls (``soak.script``) is answered here with the
  model's tool-call message, streamed in the server's own chunk format;
- a stream fault, when one is armed, applies to the next streamed turn request: *silent* stops
  the stream after a few chunks for longer than loopd's silence limit, *slow* spaces every chunk.

Its counters (rounds scripted, requests forwarded, faults that hit a stream) go into the report.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import uvicorn
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from soak.script import ScriptedCall, next_round

log = logging.getLogger("soak.relay")

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)
SILENT_AFTER_CHUNKS = 3


@dataclass
class StreamFaults:
    silent_s: float
    slow_gap_s: float
    silent_armed: int = 0
    slow_armed: int = 0
    silent_hit: list[float] = field(default_factory=list)  # when each armed fault met a stream
    slow_hit: list[float] = field(default_factory=list)


@dataclass
class RelayCounters:
    forwarded: int = 0
    scripted_rounds: int = 0
    scripted_calls: int = 0
    upstream_errors: int = 0


@dataclass
class Relay:
    upstream_uds: Path
    faults: StreamFaults
    counters: RelayCounters = field(default_factory=RelayCounters)

    def app(self, client: httpx.AsyncClient) -> Starlette:
        async def handle(request: Request) -> Response:
            return await self._handle(client, request)

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", handle, methods=methods)])

    async def _handle(self, client: httpx.AsyncClient, request: Request) -> Response:
        body = await request.body()
        parsed = _json(body) if request.method == "POST" else None
        if request.url.path == "/v1/chat/completions" and parsed is not None:
            calls = next_round(parsed)
            if calls:
                self.counters.scripted_rounds += 1
                self.counters.scripted_calls += len(calls)
                model = str(parsed.get("model", ""))
                return StreamingResponse(
                    scripted_stream(calls, model), media_type="text/event-stream"
                )
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        upstream = client.build_request(request.method, path, headers=headers, content=body)
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            self.counters.upstream_errors += 1
            return Response(f"relay: upstream failed: {exc}\n", status_code=502)
        self.counters.forwarded += 1
        fault = self._take_fault(parsed) if response.status_code == 200 else None
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(
            self._relayed(response, fault),
            status_code=response.status_code,
            headers=out_headers,
        )

    def _take_fault(self, parsed: dict[str, object] | None) -> str | None:
        """An armed fault, for a streamed turn request (not the self-test's probes: a turn's
        last user message is a thread's ``@user: ...``)."""
        if parsed is None or not parsed.get("stream") or not _is_turn(parsed):
            return None
        if self.faults.silent_armed:
            self.faults.silent_armed -= 1
            return "silent"
        if self.faults.slow_armed:
            self.faults.slow_armed -= 1
            return "slow"
        return None

    async def _relayed(self, response: httpx.Response, fault: str | None) -> AsyncIterator[bytes]:
        chunks = 0
        try:
            async for chunk in response.aiter_raw():
                chunks += 1
                if fault == "silent" and chunks == SILENT_AFTER_CHUNKS:
                    self.faults.silent_hit.append(time.time())
                    await anyio.sleep(self.faults.silent_s)
                elif fault == "slow":
                    if chunks == SILENT_AFTER_CHUNKS:
                        self.faults.slow_hit.append(time.time())
                    await anyio.sleep(self.faults.slow_gap_s)
                yield chunk
        except httpx.HTTPError as exc:
            self.counters.upstream_errors += 1
            log.info("upstream stream broke: %s", exc)
        finally:
            await response.aclose()
            if fault == "silent" and chunks < SILENT_AFTER_CHUNKS:
                self.faults.silent_armed += 1  # the stream ended first: the fault waits for another
            if fault == "slow" and chunks < SILENT_AFTER_CHUNKS:
                self.faults.slow_armed += 1


def _json(body: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _is_turn(body: dict[str, object]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return bool(users) and str(users[-1].get("content", "")).startswith("@")


def _chunk(completion_id: str, model: str, created: int, choice: dict[str, object]) -> bytes:
    payload = {
        "choices": [choice],
        "created": created,
        "id": completion_id,
        "model": model,
        "system_fingerprint": "soak-scripted",
        "object": "chat.completion.chunk",
    }
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def scripted_stream(calls: list[ScriptedCall], model: str) -> AsyncIterator[bytes]:
    """A tool-call completion in llama-server's streamed form (tests/data/streams/tool_call.sse):
    the role, each call with its id, name and arguments, the finish, and ``[DONE]``."""
    completion_id = "chatcmpl-soak" + secrets.token_hex(8)
    created = int(time.time())
    yield _chunk(
        completion_id,
        model,
        created,
        {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}},
    )
    for index, call in enumerate(calls):
        await anyio.sleep(0.05)  # a model takes a moment per call
        delta = {
            "tool_calls": [
                {
                    "index": index,
                    "id": secrets.token_hex(16),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ]
        }
        yield _chunk(
            completion_id, model, created, {"finish_reason": None, "index": 0, "delta": delta}
        )
    yield _chunk(
        completion_id, model, created, {"finish_reason": "tool_calls", "index": 0, "delta": {}}
    )
    yield b"data: [DONE]\n\n"


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale file there is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the run's own task group owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve_relay(tg: TaskGroup, relay: Relay, uds: Path) -> AsyncIterator[None]:
    """The relay on ``uds`` until the block ends."""
    # A fresh connection per request, as brokerd's own proxy opens: the router can drop a
    # kept-alive connection without answering the next request on it (a slot save or restore
    # sent right after a stream ended), which would read as the server gone.
    transport = httpx.AsyncHTTPTransport(
        uds=str(relay.upstream_uds), limits=httpx.Limits(max_keepalive_connections=0)
    )
    timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://llama", timeout=timeout
    ) as client:
        config = uvicorn.Config(
            relay.app(client), lifespan="off", log_config=None, access_log=False
        )
        server = _QuietServer(config)
        sock = bind_unix(uds)
        stopped = anyio.Event()

        async def run() -> None:
            try:
                await server.serve(sockets=[sock])
            finally:
                stopped.set()

        tg.start_soon(run)
        try:
            with anyio.fail_after(10):
                while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
                    await anyio.sleep(0.02)
            yield
        finally:
            server.should_exit = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await stopped.wait()
            sock.close()
