"""The ASGI side of an HTTP proxy: pass the upstream response through as it arrives.

Both proxies share this. It is written against raw ASGI messages, not a response class, because
three timing promises depend on controlling every send:

- the status line and headers go to the client only when the upstream has sent its own (a request
  queued upstream shows the client no bytes at all, so its first-byte limit keeps its meaning);
- what each read of the upstream brings is written to the client at once (nothing waits for more;
  the chunks one read brought together go on as one);
- a client hang-up, at any point, cancels the upstream request, which closes that connection, which
  is how the upstream learns to stop (for llama-server: free the slot).

Where both ends allow it (an upstream answer with ``PUSH_BODY``, a server with ``CLIENT_WRITES``),
the body goes from the upstream connection's callback straight to the client's connection, and
this task wakes only for what that write could not take (the client's buffer is full) and at the
end: llama-server sends a chunk per token, and waking a task for each cost brokerd about a fifth
of its CPU per token. Such a server also lets the relay cut the client's connection itself when
the upstream breaks mid-answer, so that the log holds one line that says what broke.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import anyio
import httpx
from starlette.types import Message, Receive, Scope, Send

from brokerd.errors import BrokerdError
from brokerd.listen import CLIENT_WRITES, ClientWrites, CountedWrites
from brokerd.proxy.headers import RawHeaders
from brokerd.proxy.oneshot import PUSH_BODY, ChunkWrite

logger = logging.getLogger(__name__)

# How long closing an abandoned upstream response may take before the proxy stops waiting.
UPSTREAM_CLOSE_GRACE_S: Final = 1.0

ErrorBody = Callable[[int, str], bytes]
"""Builds the JSON body of an error the proxy itself answers, in the upstream's own envelope."""


class UpstreamBroke(BrokerdError):
    """The upstream failed after its response began; the client connection is aborted.

    Raised to the ASGI server on purpose: aborting the connection (no final chunk) is the only way
    to tell a streaming client that the body it got is incomplete rather than finished.
    """


class RelayOutcome(StrEnum):
    COMPLETE = "complete"
    CLIENT_GONE = "client_gone"
    UNREACHABLE = "upstream_unreachable"
    BROKE = "upstream_broke"


@dataclass
class RelayResult:
    """What happened to one proxied request, for the log line."""

    outcome: RelayOutcome = RelayOutcome.CLIENT_GONE
    status: int | None = None
    body_bytes: int = 0

    def count(self, size: int) -> None:
        self.body_bytes += size


async def send_json(send: Send, status: int, body: bytes, *, close: bool = False) -> None:
    """A complete JSON response that the proxy answers itself."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        # The request body may be unread (refused early); ending the connection discards it.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def error_message(exc: Exception) -> str:
    """A one-line description of an upstream failure (httpx messages can be empty)."""
    return str(exc) or type(exc).__name__


def client_writes(scope: Scope) -> ClientWrites | None:
    """The server's ``ClientWrites`` for this request, if it offers them."""
    writes: ClientWrites | None = scope.get("extensions", {}).get(CLIENT_WRITES)
    return writes


async def relay(
    client: httpx.AsyncClient,
    request: httpx.Request,
    receive: Receive,
    send: Send,
    *,
    result: RelayResult,
    response_headers: Callable[[RawHeaders], RawHeaders],
    error_body: ErrorBody,
    writes: ClientWrites | None = None,
) -> None:
    """Send ``request`` upstream and pass its response to the ASGI client as it arrives;
    ``writes``: the server's ``ClientWrites``, if it offers them.

    Returns when the response is complete or the client has gone (the upstream request is then
    closed); ``result`` records which. An unreachable upstream gets a 502 in the upstream's
    envelope. When the upstream fails mid-response, the client's connection is cut: by
    ``writes``, or else by raising ``UpstreamBroke``.
    """
    broken: httpx.HTTPError | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_cancel_when_client_leaves, receive, tg.cancel_scope)
        broken = await _pass_through(
            client, request, send, result, response_headers, error_body, writes
        )
        tg.cancel_scope.cancel()
    if broken is None:
        return
    why = f"upstream failed mid-response: {error_message(broken)}"
    if writes is None:
        raise UpstreamBroke(why) from broken
    logger.warning("%s", why)
    writes.abort()


async def _cancel_when_client_leaves(receive: Receive, scope: anyio.CancelScope) -> None:
    # After the body, the next message an ASGI server delivers is http.disconnect: either the
    # client hung up, or the response is complete (then the scope is being cancelled anyway).
    message: Message = await receive()
    while message["type"] != "http.disconnect":
        message = await receive()
    scope.cancel()


async def _pass_through(
    client: httpx.AsyncClient,
    request: httpx.Request,
    send: Send,
    result: RelayResult,
    response_headers: Callable[[RawHeaders], RawHeaders],
    error_body: ErrorBody,
    writes: ClientWrites | None,
) -> httpx.HTTPError | None:
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        result.outcome, result.status = RelayOutcome.UNREACHABLE, 502
        logger.warning("upstream unreachable: %s", error_message(exc))
        await send_json(send, 502, error_body(502, f"upstream unreachable: {error_message(exc)}"))
        return None
    try:
        result.status = response.status_code
        headers = response_headers(list(response.headers.raw))
        start = {"type": "http.response.start", "status": response.status_code, "headers": headers}
        await send(start)
        push_to: Callable[[ChunkWrite], None] | None = response.extensions.get(PUSH_BODY)
        if push_to is not None and writes is not None:
            push_to(CountedWrites(writes, result.count).write_chunk)
        # aiter_raw: the bytes as they came off the wire (no decompression, no re-chunking); with
        # the push, only those the client's connection could not take at once.
        async for chunk in response.aiter_raw():
            result.count(len(chunk))
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        result.outcome = RelayOutcome.COMPLETE
    except httpx.HTTPError as exc:
        result.outcome = RelayOutcome.BROKE
        return exc
    except OSError:
        # Some ASGI servers report a vanished client by failing the send.
        result.outcome = RelayOutcome.CLIENT_GONE
    finally:
        with anyio.move_on_after(UPSTREAM_CLOSE_GRACE_S, shield=True):
            await response.aclose()
    return None


def json_error(envelope: Callable[[int, str], object]) -> ErrorBody:
    """Wrap an envelope builder (status, message -> JSON-able value) as an ``ErrorBody``."""

    def build(status: int, message: str) -> bytes:
        return json.dumps(envelope(status, message), separators=(",", ":")).encode()

    return build
