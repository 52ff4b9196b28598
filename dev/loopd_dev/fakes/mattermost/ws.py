"""``/api/v4/websocket``: authentication, hello, the writer and reader of one socket.

The hub decides what a connect means (fresh, resume A-E); this module moves frames. The writer
stamps each event with the connection's seq just before sending it, as ``writePump`` does, so
an event stamped but cut off in transit is in the dead queue and a resume can resend it.
"""

import json
from typing import Any, cast

import anyio
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from loopd_dev.fakes.mattermost.core import FakeMattermost
from loopd_dev.fakes.mattermost.errors import AppError
from loopd_dev.fakes.mattermost.events import WsReply
from loopd_dev.fakes.mattermost.hub import Connection, Hub, Outcome
from loopd_dev.fakes.mattermost.model import User
from loopd_dev.fakes.mattermost.wire import WIRE_EXTENSION, WireControl

_CLOSE_WAIT_S = 1.0


class LiveSocket:
    """The hub's handle on one open socket (``hub.SocketControl``)."""

    def __init__(self, websocket: WebSocket) -> None:
        wire = websocket.scope.get("extensions", {}).get(WIRE_EXTENSION)
        self._wire: WireControl | None = wire if isinstance(wire, WireControl) else None
        self.cancel_scope = anyio.CancelScope()
        self.close_code = 1000

    def drop(self) -> None:
        if self._wire is not None:
            self._wire.abort()
        else:  # no wire access: the nearest an ASGI app gets is an error close
            self.close_code = 1011
            self.cancel_scope.cancel()

    def close_going_away(self) -> None:
        self.close_code = 1001
        self.cancel_scope.cancel()

    def set_stalled(self, stalled: bool) -> None:
        if self._wire is not None:
            self._wire.set_stalled(stalled)


def token_from_headers(websocket_or_request_headers: Any) -> str:
    """``Authorization: Bearer <t>`` (or ``Token <t>``); empty when absent."""
    value = str(websocket_or_request_headers.get("authorization", ""))
    scheme, _, token = value.partition(" ")
    if scheme.lower() in ("bearer", "token"):
        return token.strip()
    return ""


def client_key(scope: Any) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unix"


async def websocket_endpoint(websocket: WebSocket) -> None:
    fake = cast(FakeMattermost, websocket.app.state.fake)
    decision = fake.admit(client_key(websocket.scope))
    if not decision.allowed:
        await websocket.send_denial_response(
            PlainTextResponse("limit exceeded\n", 429, headers=decision.headers)
        )
        return
    await websocket.accept()  # the real server upgrades first and authenticates after
    user = fake.world.user_by_token(token_from_headers(websocket.headers))
    if user is None:
        user = await _await_challenge(fake, websocket)
        if user is None:
            await _close(websocket, 1000)
            return
    hub = fake.hub
    params = websocket.query_params
    plan = hub.connect(user.id, params.get("connection_id", ""), params.get("sequence_number"))
    if plan.outcome is Outcome.E_REJECTED or plan.connection is None:
        await _close(websocket, 1000)
        return
    await _serve_connection(fake, hub, user, plan.connection, plan.first_frames, websocket)


async def _serve_connection(
    fake: FakeMattermost,
    hub: Hub,
    user: User,
    conn: Connection,
    first_frames: tuple[str, ...],
    websocket: WebSocket,
) -> None:
    live = LiveSocket(websocket)
    conn.socket = live
    if fake.faults.stalled:
        live.set_stalled(True)
    try:
        with live.cancel_scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_write_loop, fake, hub, conn, first_frames, websocket, live)
                await _read_loop(fake, hub, user, conn, websocket)
                tg.cancel_scope.cancel()
    finally:
        hub.deactivate(conn)
        if not hub.is_registered(conn):
            conn.receive_stream.close()
        with anyio.CancelScope(shield=True):
            await _close(websocket, live.close_code)


async def _write_loop(
    fake: FakeMattermost,
    hub: Hub,
    conn: Connection,
    first_frames: tuple[str, ...],
    websocket: WebSocket,
    live: LiveSocket,
) -> None:
    for text in first_frames:
        await websocket.send_text(text)
    while True:
        if not conn.held:
            try:
                conn.held.append(await conn.receive_stream.receive())
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                break  # the hub removed this connection (overflow, restart)
        await fake.faults.stall_gate.wait_open()
        item = conn.held.pop(0)
        if isinstance(item, WsReply):
            await websocket.send_text(item.render())
            continue
        frame = conn.stamp(item)
        await websocket.send_text(frame.text)
        if conn.take_duplicate():
            await websocket.send_text(frame.text)
    live.cancel_scope.cancel()


async def _read_loop(
    fake: FakeMattermost, hub: Hub, user: User, conn: Connection, websocket: WebSocket
) -> None:
    while True:
        request = await _receive_request(websocket)
        if request is None:
            return  # disconnected, or a frame that is not a JSON object: the server hangs up
        reply = _handle_action(fake, user, request)
        if reply is not None:
            hub.enqueue(conn, reply)


async def _receive_request(websocket: WebSocket) -> dict[str, Any] | None:
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    raw = message.get("text") or (message.get("bytes") or b"").decode("utf-8", "replace")
    try:
        request = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return request if isinstance(request, dict) else None


def _handle_action(fake: FakeMattermost, user: User, request: dict[str, Any]) -> WsReply | None:
    seq = request.get("seq")
    action = request.get("action")
    raw_data = request.get("data")
    data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    if not isinstance(seq, int) or isinstance(seq, bool) or seq <= 0:
        return _fail(0, "api.web_socket_router.bad_seq.app_error", "Invalid sequence number.")
    if isinstance(action, str) and action.startswith("custom_"):
        return None  # plugin actions: no reply from the core server
    if action == "ping":
        pong = {
            "text": "pong",
            "version": fake.config.server_version,
            "server_time": fake.clock.now_ms(),
            "node_id": "",
        }
        return WsReply(seq, data=pong)
    if action == "user_typing":
        try:
            fake.user_typing(user, str(data.get("channel_id", "")), str(data.get("parent_id", "")))
        except AppError as exc:
            return _fail(seq, exc.error_id, exc.message)
        return WsReply(seq)
    if action == "get_statuses":
        return WsReply(seq, data={uid: "online" for uid in fake.world.users})
    if action == "authentication_challenge":
        # The socket is authenticated already (by header, or by an earlier challenge): the real
        # router drops the action without a reply.
        return None
    return _fail(seq, "api.web_socket_router.no_action.app_error", f"Unknown action {action!r}.")


def _fail(seq: int, error_id: str, message: str) -> WsReply:
    return WsReply(seq, status="FAIL", error={"id": error_id, "message": message})


async def _await_challenge(fake: FakeMattermost, websocket: WebSocket) -> User | None:
    """Upgrade without credentials: wait for ``authentication_challenge`` until the auth
    timeout; the reply (``OK``) precedes hello. A bad token or silence means no hello."""
    with anyio.move_on_after(fake.config.auth_timeout_s):
        while True:
            request = await _receive_request(websocket)
            if request is None:
                return None
            seq = request.get("seq")
            seq_reply = seq if isinstance(seq, int) else 0
            if request.get("action") != "authentication_challenge":
                reply = _fail(
                    seq_reply,
                    "api.web_socket_router.not_authenticated.app_error",
                    "Not authenticated.",
                )
                await websocket.send_text(reply.render())
                continue
            data = request.get("data")
            token = str(data.get("token", "")) if isinstance(data, dict) else ""
            user = fake.world.user_by_token(token)
            if user is not None:
                await websocket.send_text(WsReply(seq_reply).render())
            return user
    return None


async def _close(websocket: WebSocket, code: int) -> None:
    """Close unless the socket is already gone; closing a dead socket is not an error here."""
    if websocket.application_state is not WebSocketState.CONNECTED:
        return
    if websocket.client_state is not WebSocketState.CONNECTED:
        return
    with anyio.move_on_after(_CLOSE_WAIT_S):
        try:
            await websocket.close(code)
        except (WebSocketDisconnect, RuntimeError, OSError):
            return
