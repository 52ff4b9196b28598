"""One HTTP forwarding app, configured per upstream by a set of rules.

The inference and chat proxies differ only in their rules (which requests pass, which headers
are stripped or added, which error envelope the proxy answers in); the forwarding is shared.
"""

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx
from starlette.types import Receive, Scope, Send

from brokerd.bodies import BodyRefused, BodyRules, ClientGone, read_body
from brokerd.listen import ClientWrites
from brokerd.observe.metrics import BROKERD_METRICS, body_reason
from brokerd.proxy.headers import RawHeaders, drop_query_params, filter_headers
from brokerd.proxy.relay import ErrorBody, RelayResult, client_writes, relay, send_json
from brokerd.proxy.upstream import Upstream

Refusal = Callable[[str, str, bytes], str | None]
"""(method, path, raw query) -> why the request is refused, or None when it may pass."""

BodyCap = Callable[[str, str], int]
"""(method, path) -> the largest body that route accepts."""


def same_cap(cap: int) -> BodyCap:
    """One cap for every route."""

    def cap_for(_method: str, _path: str) -> int:
        return cap

    return cap_for


@dataclass(frozen=True)
class Refused:
    """A request the proxy answers itself, with ``status`` and why."""

    status: int
    message: str


BodyCheck = Callable[[str, str, bytes, bytes], Awaitable[Refused | None]]
"""(method, path, raw query, body) -> a refusal, or None when the request may pass."""

Forwarding = Callable[[str, str, bytes, bytes], Awaitable[None]]
"""(method, path, raw query, body): called just before a request that passed goes upstream."""

Forwarded = Callable[[str, str, bytes, bytes, int | None], Awaitable[None]]
"""(method, path, raw query, body, status or None): called once the answer is relayed, or
the relay ended without one (the client gone)."""


@dataclass(frozen=True)
class ForwardRules:
    """What one proxy lets through and how it rewrites it. Header names are lower case."""

    refusal: Refusal
    error_body: ErrorBody
    drop_request_headers: frozenset[bytes]
    inject_request_headers: Mapping[bytes, bytes] = field(default_factory=dict)
    drop_response_headers: frozenset[bytes] = frozenset()
    drop_query_params: frozenset[str] = frozenset()
    check_body: BodyCheck | None = None
    before_forward: Forwarding | None = None
    after_forward: Forwarded | None = None


class Forwarder:
    """ASGI app for HTTP requests: check, cap, rewrite, then relay to the upstream."""

    def __init__(
        self,
        upstream: Upstream,
        rules: ForwardRules,
        *,
        body_cap: int | BodyCap,
        bodies: BodyRules | None = None,
        logger: logging.Logger,
        reuse_connections: bool = True,
    ) -> None:
        self.upstream = upstream
        self.rules = rules
        self.body_cap: BodyCap = body_cap if callable(body_cap) else same_cap(body_cap)
        self.bodies = bodies or BodyRules()
        self.logger = logger
        self.client: httpx.AsyncClient = upstream.client(reuse_connections=reuse_connections)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        query = drop_query_params(scope["query_string"], self.rules.drop_query_params)
        reason = self.rules.refusal(method, path, query)
        if reason is not None:
            self.logger.warning("refused %s %s", method, path)
            BROKERD_METRICS.refused("route")
            await send_json(send, 403, self.rules.error_body(403, reason), close=True)
            return
        try:
            body = await read_body(scope, receive, self.body_cap(method, path), self.bodies)
        except BodyRefused as exc:
            self.logger.warning("refused %s %s: %s", method, path, exc)
            BROKERD_METRICS.refused(body_reason(exc.status))
            error = self.rules.error_body(exc.status, str(exc))
            await send_json(send, exc.status, error, close=True)
            return
        except ClientGone:
            return
        try:
            await self._forward(scope, receive, send, query, body.data)
        finally:
            body.release()

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, query: bytes, body: bytes
    ) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if self.rules.check_body is not None:
            refused = await self.rules.check_body(method, path, query, body)
            if refused is not None:
                self.logger.warning("refused %s %s: %s", method, path, refused.message)
                BROKERD_METRICS.refused("policy")
                error = self.rules.error_body(refused.status, refused.message)
                await send_json(send, refused.status, error)
                return
        headers = filter_headers(
            scope["headers"],
            drop=self.rules.drop_request_headers,
            inject=self.rules.inject_request_headers,
        )
        url = self.upstream.url(path, query)
        request = self.client.build_request(method, url, headers=headers, content=body)
        if self.rules.before_forward is not None:
            await self.rules.before_forward(method, path, query, body)
        status = await self._relay(request, receive, send, f"{method} {path}", client_writes(scope))
        if self.rules.after_forward is not None:
            await self.rules.after_forward(method, path, query, body, status)

    async def _relay(
        self,
        request: httpx.Request,
        receive: Receive,
        send: Send,
        what: str,
        writes: ClientWrites | None,
    ) -> int | None:
        """Relay the request and its answer; the status the client got."""
        started = time.monotonic()
        result = RelayResult()
        try:
            await relay(
                self.client,
                request,
                receive,
                send,
                result=result,
                response_headers=self._response_headers,
                error_body=self.rules.error_body,
                writes=writes,
            )
        finally:
            elapsed = time.monotonic() - started
            fields = {
                "status": result.status,
                "outcome": result.outcome.value,
                "bytes": result.body_bytes,
                "duration_ms": round(elapsed * 1000, 1),
            }
            self.logger.info(
                "%s -> %s %s", what, result.status, result.outcome, extra={"fields": fields}
            )
        return result.status

    def _response_headers(self, headers: RawHeaders) -> RawHeaders:
        return filter_headers(headers, drop=self.rules.drop_response_headers)

    async def aclose(self) -> None:
        await self.client.aclose()
