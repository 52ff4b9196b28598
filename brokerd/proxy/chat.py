"""The chat proxy: Mattermost REST and WebSocket for the box, with the bot token added here.

The box holds no credential. Every request gets ``Authorization: Bearer <bot token>`` from host
config, and every credential the box sends is dropped first: the ``Authorization`` header, cookies
(Mattermost reads the ``MMAUTHTOKEN`` cookie before the header), ``X-Requested-With`` (which makes
Mattermost treat the caller as a browser session) and the ``access_token`` query parameter.
Responses lose ``Set-Cookie`` and ``Token`` so no session credential travels back into the box,
and the upstream client keeps no cookies, so none is replayed on a later request. Forwarding and
method-override headers from the box are dropped too, and the WebSocket upgrade follows no
redirect.

Only the calls loopd's Mattermost adapter makes pass (``CHAT_ROUTES``; a test keeps the two in
step); each ``{id}`` matches Mattermost's id shape (26 lower-case letters and digits) and nothing
else, so ``/users/tokens`` or ``/channels/members`` cannot pass as an id. Posting and editing are
allowed only where brokerd's config lets the box act (``brokerd.proxy.chatpolicy``).
"""

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Final, Literal

import anyio
from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from brokerd.bodies import BodyRules
from brokerd.proxy.chatpolicy import ChannelGuard, ChatPolicy
from brokerd.proxy.forward import BodyCheck, Forwarder, ForwardRules, Refused
from brokerd.proxy.headers import FORWARDING_HEADERS, REQUEST_FRAMING, drop_query_params
from brokerd.proxy.lifespan import closing_lifespan
from brokerd.proxy.relay import ErrorBody, error_message, json_error
from brokerd.proxy.upstream import Upstream

logger = logging.getLogger(__name__)
UPSTREAM_WS_LOGGER: Final = logging.getLogger(f"{__name__}.upstream_websocket")

WEBSOCKET_PATH: Final = "/api/v4/websocket"


@dataclass(frozen=True)
class ChatRoute:
    """One call the adapter makes. ``acts_in`` says where a write names its channel."""

    method: str
    template: str  # each ``{name}`` is one Mattermost id
    acts_in: Literal["body", "post"] | None = None


# The calls of loopd/chat/rest.py and loopd/chat/ws.py, and nothing else.
CHAT_ROUTES: Final[tuple[ChatRoute, ...]] = (
    ChatRoute("GET", "/api/v4/users/me"),
    ChatRoute("GET", "/api/v4/users/{user_id}"),
    ChatRoute("GET", "/api/v4/users/me/channels"),
    ChatRoute("GET", "/api/v4/users/me/teams"),
    ChatRoute("GET", "/api/v4/channels/{channel_id}"),
    ChatRoute("GET", "/api/v4/channels/{channel_id}/posts"),
    ChatRoute("GET", "/api/v4/channels/{channel_id}/members"),  # who is in a group message
    ChatRoute("GET", "/api/v4/config/client"),
    ChatRoute("GET", "/api/v4/posts/{post_id}/thread"),
    ChatRoute("GET", "/api/v4/files/{file_id}/info"),  # a text attachment's name and size
    ChatRoute("GET", "/api/v4/files/{file_id}"),
    ChatRoute("POST", "/api/v4/users/{user_id}/typing", acts_in="body"),
    ChatRoute("POST", "/api/v4/posts", acts_in="body"),
    ChatRoute("PUT", "/api/v4/posts/{post_id}/patch", acts_in="post"),
    ChatRoute("DELETE", "/api/v4/posts/{post_id}", acts_in="post"),  # a finished progress post
    ChatRoute("GET", WEBSOCKET_PATH),  # only as a WebSocket upgrade; see ChatWebSocketProxy
)

_ID: Final = "([a-z0-9]{26})"


def _compile(template: str) -> re.Pattern[str]:
    pieces = re.split(r"\{[a-z_]+\}", template)
    return re.compile(_ID.join(re.escape(piece) for piece in pieces))


_COMPILED: Final = tuple((route, _compile(route.template)) for route in CHAT_ROUTES)


def match_route(method: str, path: str) -> tuple[ChatRoute, tuple[str, ...]] | None:
    """The route a request takes, with the ids in its path; None when it takes none."""
    for route, pattern in _COMPILED:
        if route.method == method and (found := pattern.fullmatch(path)):
            return route, found.groups()
    return None


CREDENTIAL_HEADERS: Final = frozenset(
    {b"authorization", b"cookie", b"x-requested-with", b"x-api-key", b"token"}
)
# Origin too: Mattermost checks it against the site URL, and a non-browser client sends none.
DROPPED_REQUEST_HEADERS: Final = (
    REQUEST_FRAMING | CREDENTIAL_HEADERS | FORWARDING_HEADERS | {b"origin"}
)
DROPPED_RESPONSE_HEADERS: Final = frozenset({b"set-cookie", b"token"})
DROPPED_QUERY_PARAMS: Final = frozenset({"access_token"})

# A post is at most 16,383 characters, a JSON body a few times that at worst.
DEFAULT_BODY_CAP: Final = 1024 * 1024


def refusal(method: str, path: str, _query: bytes) -> str | None:
    """Why the chat proxy refuses this REST request, or None when it may pass."""
    if path == WEBSOCKET_PATH:
        return f"brokerd refuses {method} {path}: only a WebSocket upgrade may use it"
    if match_route(method, path) is None:
        return f"brokerd refuses {method} {path}: not in the chat proxy's allowlist"
    return None


def policy_check(guard: ChannelGuard) -> BodyCheck:
    """The check of a write against where the box may act (reads pass)."""

    async def check(method: str, path: str, _query: bytes, body: bytes) -> Refused | None:
        matched = match_route(method, path)
        if matched is None or matched[0].acts_in is None:
            return None
        route, ids = matched
        if route.acts_in == "body":
            return await guard.check_post(body)
        return await guard.check_edit(ids[0])

    return check


def mattermost_error(status: int, message: str) -> dict[str, object]:
    """Mattermost's error envelope, so the chat adapter reads proxy refusals like the server's."""
    return {
        "id": f"brokerd.chat_proxy.{status}",
        "message": message,
        "detailed_error": "",
        "request_id": "",
        "status_code": status,
    }


mattermost_error_body: Final = json_error(mattermost_error)


def bearer(token: str) -> bytes:
    return b"Bearer " + token.encode()


def chat_rules(bot_token: str, guard: ChannelGuard | None = None) -> ForwardRules:
    return ForwardRules(
        refusal=refusal,
        error_body=mattermost_error_body,
        drop_request_headers=DROPPED_REQUEST_HEADERS,
        inject_request_headers={b"authorization": bearer(bot_token)},
        drop_response_headers=DROPPED_RESPONSE_HEADERS,
        drop_query_params=DROPPED_QUERY_PARAMS,
        check_body=policy_check(guard) if guard is not None else None,
    )


# Close codes that only describe a local event and may not be sent in a close frame (RFC 6455
# 7.4.1): 1005 "no code", 1006 "abnormal", 1015 "TLS failure". Each is passed on as 1011.
_UNSENDABLE_CLOSE_CODES: Final = frozenset({1005, 1006, 1015})
ABNORMAL_CLOSE: Final = 1011


def forwardable_close_code(code: int | None) -> int:
    """The close code to send on the other leg for one received (or observed) on this leg."""
    if code is None or code in _UNSENDABLE_CLOSE_CODES:
        return ABNORMAL_CLOSE
    return code


@dataclass(frozen=True)
class WebSocketSettings:
    open_timeout_s: float = 10.0
    # Mattermost events are small, but a post's JSON is embedded in one; 16 MiB leaves headroom.
    max_frame_bytes: int = 16 * 1024 * 1024


class ChatWebSocketProxy:
    """ASGI app for ``/api/v4/websocket``: one upstream connection per box connection.

    The upstream is opened first, with the bot token on its upgrade request, and the box's upgrade
    is accepted only once that succeeded; a refusal upstream is passed back as an HTTP response,
    so the box can tell "auth or proxy fault" from a dropped connection. Then text and binary
    frames flow both ways until either side closes, and the close code crosses with them. Ping
    and pong are answered on each leg by its own WebSocket implementation.
    """

    def __init__(
        self,
        upstream: Upstream,
        bot_token: str,
        error_body: ErrorBody = mattermost_error_body,
        settings: WebSocketSettings | None = None,
    ) -> None:
        self.upstream = upstream
        self._authorization = bearer(bot_token).decode()
        self.error_body = error_body
        self.settings = settings or WebSocketSettings()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = drop_query_params(scope["query_string"], DROPPED_QUERY_PARAMS)
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        try:
            upstream = await self._open_upstream(query)
        except InvalidStatus as exc:
            status = exc.response.status_code
            logger.warning("websocket upgrade refused upstream: HTTP %d", status)
            if 300 <= status < 400:
                reason = f"upstream answered the upgrade with a redirect ({status}); not followed"
                await self._deny(send, 502, self.error_body(502, reason), "application/json")
                return
            body = bytes(exc.response.body) or self.error_body(status, str(exc))
            content_type = exc.response.headers.get("Content-Type", "application/json")
            await self._deny(send, status, body, content_type)
            return
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            logger.warning("websocket upstream unreachable: %s", error_message(exc))
            reason = f"upstream unreachable: {error_message(exc)}"
            await self._deny(send, 502, self.error_body(502, reason), "application/json")
            return
        async with upstream:
            await send({"type": "websocket.accept"})
            logger.info("websocket open")
            await self._pump(upstream, receive, send)
        logger.info("websocket closed (upstream code %s)", upstream.close_code)

    async def _open_upstream(self, query: bytes) -> ClientConnection:
        uri = self.upstream.websocket_url(WEBSOCKET_PATH, query)
        headers = {"Authorization": self._authorization}
        timeout, max_size = self.settings.open_timeout_s, self.settings.max_frame_bytes
        # The handshake (with the token) is logged at DEBUG under brokerd's own logger name, so
        # it goes through brokerd's redacting handler and is never mistaken for the box's logs.
        if self.upstream.uds is not None:
            return await NoRedirectConnect(
                uri,
                unix=True,
                path=self.upstream.uds,
                additional_headers=headers,
                open_timeout=timeout,
                max_size=max_size,
                logger=UPSTREAM_WS_LOGGER,
            )
        # proxy=None: a proxy variable in brokerd's environment must not reroute the connection.
        return await NoRedirectConnect(
            uri,
            additional_headers=headers,
            open_timeout=timeout,
            max_size=max_size,
            proxy=None,
            logger=UPSTREAM_WS_LOGGER,
        )

    async def _deny(self, send: Send, status: int, body: bytes, content_type: str) -> None:
        headers = [(b"content-type", content_type.encode("latin-1"))]
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})

    async def _pump(self, upstream: ClientConnection, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._box_to_upstream, upstream, receive, tg.cancel_scope)
            await self._upstream_to_box(upstream, send)
            tg.cancel_scope.cancel()

    async def _box_to_upstream(
        self, upstream: ClientConnection, receive: Receive, done: anyio.CancelScope
    ) -> None:
        try:
            while True:
                message: Message = await receive()
                if message["type"] == "websocket.disconnect":
                    code = forwardable_close_code(message.get("code"))
                    await upstream.close(code, message.get("reason") or "")
                    break
                text, data = message.get("text"), message.get("bytes")
                await upstream.send(text if text is not None else data or b"")
        except ConnectionClosed:
            pass  # the upstream leg closed; _upstream_to_box passes its close code on
        else:
            done.cancel()

    async def _upstream_to_box(self, upstream: ClientConnection, send: Send) -> None:
        try:
            async for frame in upstream:
                if isinstance(frame, str):
                    await send({"type": "websocket.send", "text": frame})
                else:
                    await send({"type": "websocket.send", "bytes": frame})
        except ConnectionClosed:
            pass  # closed without a clean close frame; the code below says so
        except OSError:
            return  # the box has gone; _box_to_upstream closes the upstream leg
        code = forwardable_close_code(upstream.close_code)
        with contextlib.suppress(OSError):  # the box may have left at the same moment
            await send({"type": "websocket.close", "code": code, "reason": upstream.close_reason})


class NoRedirectConnect(connect):
    """websockets' ``connect``, which answers a redirect as the refusal it is: the bot token
    goes only to the configured upstream, never to wherever a redirect points."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def create_chat_app(
    upstream: Upstream,
    *,
    bot_token: str,
    policy: ChatPolicy,
    body_cap: int = DEFAULT_BODY_CAP,
    bodies: BodyRules | None = None,
) -> Starlette:
    """The Starlette app served on ``chat.sock``; ``policy`` says where the box may post."""
    lookups = upstream.client()
    guard = ChannelGuard(policy, upstream, lookups, bot_token)
    rules = chat_rules(bot_token, guard)
    rest = Forwarder(upstream, rules, body_cap=body_cap, bodies=bodies, logger=logger)
    websocket = ChatWebSocketProxy(upstream, bot_token)

    async def close() -> None:
        await rest.aclose()
        await lookups.aclose()

    return Starlette(
        routes=[
            WebSocketRoute(WEBSOCKET_PATH, endpoint=websocket),
            Route("/{path:path}", endpoint=rest),
        ],
        lifespan=closing_lifespan(close),
    )
