"""The inference proxy: the box's only way to llama-server, through an allowlist.

The allowlist is one table of (method, path). Paths match exactly, after the ASGI server's
percent-decoding, so no spelling (``//slots``, ``/v1/../slots/0``, ``/slots%2F0``) reaches a route
the table does not name; the path forwarded is the very string that was checked. Query strings
pass through untouched, except that ``GET /slots`` refuses an ``action`` parameter.
"""

import logging
from typing import Final

from starlette.applications import Starlette
from starlette.routing import Route

from brokerd.bodies import BodyRules
from brokerd.proxy.forward import BodyCap, Forwarder, ForwardRules
from brokerd.proxy.headers import FORWARDING_HEADERS, REQUEST_FRAMING, query_keys
from brokerd.proxy.lifespan import closing_lifespan
from brokerd.proxy.relay import json_error
from brokerd.proxy.upstream import Upstream

logger = logging.getLogger(__name__)

ALLOWED_ROUTES: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/chat/completions"),
        ("POST", "/v1/chat/completions/control"),
        ("GET", "/slots"),
        ("GET", "/props"),
        ("GET", "/health"),
        ("GET", "/v1/health"),
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("POST", "/apply-template"),
        ("POST", "/tokenize"),
    }
)

# Credentials the box might send (it has none to send; anything here is stray or hostile), and the
# header that would turn on llama-server's resumable streams, which outlive a client hang-up.
DROPPED_REQUEST_HEADERS: Final = (
    REQUEST_FRAMING
    | FORWARDING_HEADERS
    | frozenset({b"authorization", b"x-api-key", b"cookie", b"x-conversation-id"})
)

DEFAULT_BODY_CAP: Final = 64 * 1024 * 1024
# The routes whose body is a whole conversation (or a prompt) get the configured cap; the others
# carry a few small fields.
LARGE_BODY_ROUTES: Final = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/chat/completions"),
        ("POST", "/apply-template"),
        ("POST", "/tokenize"),
    }
)
SMALL_BODY_CAP: Final = 64 * 1024


def body_cap_for(large_cap: int) -> BodyCap:
    """Each route's body cap: ``large_cap`` for a conversation, 64 KiB for the rest."""

    def cap(method: str, path: str) -> int:
        return large_cap if (method, path) in LARGE_BODY_ROUTES else SMALL_BODY_CAP

    return cap


def refusal(method: str, path: str, query: bytes) -> str | None:
    """Why the inference proxy refuses this request, or None when it may pass."""
    if (method, path) not in ALLOWED_ROUTES:
        return f"brokerd refuses {method} {path}: not in the inference proxy's allowlist"
    if path == "/slots" and "action" in query_keys(query):
        return f"brokerd refuses {method} {path} with an action: slot actions are not allowed"
    return None


def llama_error(status: int, message: str) -> dict[str, dict[str, object]]:
    """llama-server's error envelope, so loopd reads the proxy's refusals like the server's."""
    kinds = {
        400: "invalid_request_error",
        403: "permission_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
        502: "unavailable_error",
        503: "unavailable_error",
    }
    kind = kinds.get(status, "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}


def inference_rules(api_key: str | None) -> ForwardRules:
    """The inference proxy's rules; ``api_key`` (host config) is sent as a bearer token."""
    inject = {b"authorization": b"Bearer " + api_key.encode()} if api_key else {}
    return ForwardRules(
        refusal=refusal,
        error_body=json_error(llama_error),
        drop_request_headers=DROPPED_REQUEST_HEADERS,
        inject_request_headers=inject,
    )


def create_inference_app(
    upstream: Upstream,
    *,
    api_key: str | None = None,
    body_cap: int = DEFAULT_BODY_CAP,
    bodies: BodyRules | None = None,
) -> Starlette:
    """The Starlette app served on ``infer.sock``.

    Every request gets a fresh upstream connection. llama-server's router can drop a kept-alive
    connection without answering the next request sent on it (seen when that request came a few
    milliseconds after another client hung up a stream); a reused connection would turn that into
    a 502, which loopd must read as "server gone". A new connection to the host-local server
    costs well under a millisecond, next to seconds of generation.
    """
    proxy = Forwarder(
        upstream,
        inference_rules(api_key),
        body_cap=body_cap_for(body_cap),
        bodies=bodies,
        logger=logger,
        reuse_connections=False,
    )
    return Starlette(
        routes=[Route("/{path:path}", endpoint=proxy)], lifespan=closing_lifespan(proxy.aclose)
    )
