"""The chat proxy: Mattermost REST and WebSocket for the box, with the bot token added here.

The box holds no credential. Every request gets ``Authorization: Bearer <bot token>`` from host
config, and every credential the box sends is dropped first: the ``Authorization`` header, cookies
(Mattermost reads the ``MMAUTHTOKEN`` cookie before the header), ``X-Requested-With`` (which makes
Mattermost treat the caller as a browser session) and the ``access_token`` query parameter.
Responses lose ``Set-Cookie`` and ``Token`` so no session credential travels back into the box.

Only the API paths the bot needs pass (``CHAT_ROUTES``); path parameters match a narrow character
class, so no dot segment or encoded slash can slip through one.
"""

import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import anyio
from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from brokerd.proxy.forward import Forwarder, ForwardRules
from brokerd.proxy.headers import REQUEST_FRAMING, drop_query_params
from brokerd.proxy.lifespan import closing_lifespan
from brokerd.proxy.relay import ErrorBody, error_message, json_error
from brokerd.proxy.upstream import Upstream

logger = logging.getLogger(__name__)
UPSTREAM_WS_LOGGER: Final = logging.getLogger(f"{__name__}.upstream_websocket")

WEBSOCKET_PATH: Final = "/api/v4/websocket"

# (method, path template). A ``{name}`` stands for one path segment of id-like characters.
CHAT_ROUTES: Final[tuple[tuple[str, str], ...]] = (
    ("GET", "/api/v4/users/{user_id}"),  # includes users/me
    ("POST", "/api/v4/users/ids"),
    ("GET", "/api/v4/users/{user_id}/channels"),
    ("GET", "/api/v4/users/{user_id}/teams"),
    ("POST", "/api/v4/users/{user_id}/typing"),
    ("GET", "/api/v4/channels/{channel_id}"),
    ("GET", "/api/v4/channels/{channel_id}/posts"),
    ("GET", "/api/v4/channels/{channel_id}/members"),  # is everyone in a group message allowed?
    ("GET", "/api/v4/config/client"),
    ("GET", "/api/v4/system/ping"),
    ("POST", "/api/v4/posts"),
    ("GET", "/api/v4/posts/{post_id}"),
    ("DELETE", "/api/v4/posts/{post_id}"),  # the bot removing its own progress post
    ("PUT", "/api/v4/posts/{post_id}/patch"),
    ("GET", "/api/v4/posts/{post_id}/thread"),
    ("POST", "/api/v4/reactions"),
    ("DELETE", "/api/v4/users/{user_id}/posts/{post_id}/reactions/{emoji_name}"),
    ("POST", "/api/v4/files"),
    ("GET", "/api/v4/files/{file_id}"),
    ("GET", "/api/v4/files/{file_id}/info"),
    ("GET", WEBSOCKET_PATH),  # only as a WebSocket upgrade; see ChatWebSocketProxy
)

# Mattermost ids are 26 lower-case alphanumerics; `me` stands for the bot; emoji names add _ + -.
_SEGMENT: Final = r"[A-Za-z0-9_+\-]+"


def _compile(template: str) -> re.Pattern[str]:
    pieces = re.split(r"\{[a-z_]+\}", template)
    return re.compile(_SEGMENT.join(re.escape(piece) for piece in pieces))


_COMPILED: Final = tuple((method, _compile(template)) for method, template in CHAT_ROUTES)

CREDENTIAL_HEADERS: Final = frozenset(
    {b"authorization", b"cookie", b"x-requested-with", b"x-api-key", b"token"}
)
# Origin too: Mattermost checks it against the site URL, and a non-browser client sends none.
DROPPED_REQUEST_HEADERS: Final = REQUEST_FRAMING | CREDENTIAL_HEADERS | {b"origin"}
DROPPED_RESPONSE_HEADERS: Final = frozenset({b"set-cookie", b"token"})
DROPPED_QUERY_PARAMS: Final = frozenset({"access_token"})

DEFAULT_BODY_CAP: Final = 64 * 1024 * 1024


def route_allowed(method: str, path: str, routes: Sequence[tuple[str, re.Pattern[str]]]) -> bool:
    return any(method == allowed and pattern.fullmatch(path) for allowed, pattern in routes)


def refusal(method: str, path: str, _query: bytes) -> str | None:
    """Why the chat proxy refuses this REST request, or None when it may pass."""
    if path == WEBSOCKET_PATH:
        return f"brokerd refuses {method} {path}: only a WebSocket upgrade may use it"
    if not route_allowed(method, path, _COMPILED):
        return f"brokerd refuses {method} {path}: not in the chat proxy's allowlist"
    return None


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


def chat_rules(bot_token: str) -> ForwardRules:
    return ForwardRules(
        refusal=refusal,
        error_body=mattermost_error_body,
        drop_request_headers=DROPPED_REQUEST_HEADERS,
        inject_request_headers={b"authorization": bearer(bot_token)},
        drop_response_headers=DROPPED_RESPONSE_HEADERS,
        drop_query_params=DROPPED_QUERY_PARAMS,
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
            return await unix_connect(
                self.upstream.uds,
                uri,
                additional_headers=headers,
                open_timeout=timeout,
                max_size=max_size,
                logger=UPSTREAM_WS_LOGGER,
            )
        # proxy=None: a proxy variable in brokerd's environment must not reroute the connection.
        return await connect(
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


def create_chat_app(
    upstream: Upstream, *, bot_token: str, body_cap: int = DEFAULT_BODY_CAP
) -> Starlette:
    """The Starlette app served on ``chat.sock``."""
    rest = Forwarder(upstream, chat_rules(bot_token), body_cap=body_cap, logger=logger)
    websocket = ChatWebSocketProxy(upstream, bot_token)
    return Starlette(
        routes=[
            WebSocketRoute(WEBSOCKET_PATH, endpoint=websocket),
            Route("/{path:path}", endpoint=rest),
        ],
        lifespan=closing_lifespan(rest.aclose),
    )
