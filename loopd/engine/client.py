"""The I/O shell towards llama-server: one httpx client over TCP or a Unix socket.

It knows HTTP and the server's error envelope, nothing about turns. Foreign errors become loopd's
own (``loopd.errors``) here, with the URL the operator configured named in every message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx

from loopd.errors import ServerRejected, ServerUnreachable, StreamBroken

CHAT_PATH = "/v1/chat/completions"
CONTROL_PATH = "/v1/chat/completions/control"


def make_async_client(url: str, connect_s: float) -> httpx.AsyncClient:
    """An httpx client for ``http(s)://host:port`` or ``unix:/path``.

    Reads have no httpx timeout: the turn engine owns the first-byte and silence limits, which
    differ by phase and which a single read timeout cannot express.

    Connections are not kept alive: the router sometimes closes a kept-alive connection after
    proxying a stream without saying so, and the next request on it fails with "Server
    disconnected without sending a response" (measured on build 11434). A fresh connection per
    request costs nothing on a Unix socket or loopback, and a request that then fails that way
    means the server really hung up.
    """
    timeout = httpx.Timeout(connect=connect_s, read=None, write=connect_s, pool=connect_s)
    limits = httpx.Limits(max_keepalive_connections=0)
    if url.startswith("unix:"):
        transport = httpx.AsyncHTTPTransport(uds=url[len("unix:") :], limits=limits)
        return httpx.AsyncClient(
            transport=transport, base_url="http://llama-server", timeout=timeout
        )
    return httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)


def error_message(body: bytes) -> tuple[str, str]:
    """(message, type) from the server's ``{"error": {...}}`` envelope, or the raw text."""
    try:
        obj = json.loads(body)
        err = obj["error"]
        return str(err.get("message", "")), str(err.get("type", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:300] or "(empty body)"), ""


class InferenceClient:
    """Calls to one llama-server (or brokerd's inference proxy in front of it)."""

    def __init__(self, url: str, model: str, *, connect_s: float = 5.0) -> None:
        self.url = url
        self.model = model
        self.connect_s = connect_s
        self._http = make_async_client(url, connect_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _unreachable(self, exc: Exception) -> ServerUnreachable:
        reason = str(exc) or type(exc).__name__
        return ServerUnreachable(self.url, reason)

    async def _get_json(self, path: str, params: dict[str, str], wait_s: float) -> Any:
        try:
            response = await self._http.get(path, params=params, timeout=wait_s)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code != 200:
            message, kind = error_message(response.content)
            raise ServerRejected(self.url, response.status_code, message, kind)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerRejected(self.url, 200, f"{path} answered non-JSON") from exc

    async def health(self, wait_s: float | None = None) -> bool:
        """True when ``/health`` answers 200 (the router's own health in router mode)."""
        try:
            response = await self._http.get("/health", timeout=wait_s or self.connect_s)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        return response.status_code == 200

    async def slots(self, wait_s: float | None = None) -> list[dict[str, Any]]:
        """``GET /slots?model=`` without autoload: polling must never load a model."""
        data = await self._get_json(
            "/slots", {"model": self.model, "autoload": "false"}, wait_s or self.connect_s
        )
        if not isinstance(data, list):
            raise ServerRejected(self.url, 200, "/slots answered something other than a list")
        return [s for s in data if isinstance(s, dict)]

    async def slot_busy(self, slot: int, wait_s: float | None = None) -> bool:
        """Whether ``/slots`` shows ``slot`` processing a request (anyone's)."""
        slots = await self.slots(wait_s)
        return any(s.get("id") == slot and s.get("is_processing") for s in slots)

    async def props(self, wait_s: float | None = None) -> dict[str, Any]:
        data = await self._get_json("/props", {"model": self.model}, wait_s or self.connect_s)
        if not isinstance(data, dict):
            raise ServerRejected(self.url, 200, "/props answered something other than an object")
        return data

    async def models(self, wait_s: float | None = None) -> dict[str, Any]:
        data = await self._get_json("/models", {}, wait_s or self.connect_s)
        return data if isinstance(data, dict) else {}

    async def post_json(self, path: str, body: dict[str, Any], wait_s: float) -> Any:
        try:
            response = await self._http.post(path, json=body, timeout=wait_s)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code != 200:
            message, kind = error_message(response.content)
            raise ServerRejected(self.url, response.status_code, message, kind)
        return response.json()

    async def control_reasoning_end(self, completion_id: str) -> dict[str, Any]:
        """Ask the server to end the running completion's thinking (seed finding (k))."""
        body = {"id": completion_id, "action": "reasoning_end", "model": self.model}
        data = await self.post_json(CONTROL_PATH, body, self.connect_s)
        return data if isinstance(data, dict) else {}

    @asynccontextmanager
    async def stream_chat(self, body: bytes) -> AsyncIterator[httpx.Response]:
        """POST a chat request and yield the response once its headers arrived.

        Entering blocks until the server sends the status line, which for a request queued behind
        another on its slot is only when the slot frees (seed finding (j)). Errors raised before a
        slot starts arrive as plain JSON with a 4xx/5xx status: ServerRejected. A connection
        that could not be made is ServerUnreachable; one the server closed before answering
        (it died while the request waited) is StreamBroken.
        """
        request = self._http.build_request(
            "POST", CHAT_PATH, content=body, headers={"Content-Type": "application/json"}
        )
        try:
            response = await self._http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(exc) from exc
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise StreamBroken(
                f"llama-server at {self.url} closed the connection before answering: {reason}"
            ) from exc
        try:
            if response.status_code != 200:
                content = await response.aread()
                message, kind = error_message(content)
                raise ServerRejected(self.url, response.status_code, message, kind)
            yield response
        finally:
            # Closing the connection is what cancels generation on the server (finding (l)), so
            # it must happen even when the request is being cancelled.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.connect_s):
                await response.aclose()
