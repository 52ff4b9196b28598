"""The Mattermost WebSocket: hello or resume, seq tracking, and an application ping.

The upgrade carries the ``Authorization`` header (the chat proxy adds it; a development token
otherwise), never the authentication challenge, which would put the token in a frame. Every
event's ``seq`` must be one more than the last; a skipped seq closes the socket (4001) so that
the caller reconnects and catches up, a repeated one is dropped. A ping with no reply by the next
ping closes it too (4000): a dead proxy hop looks exactly like that. A message larger than
``MAX_MESSAGE_BYTES`` (far above any event: a post is at most tens of kilobytes) is refused before
it is read, and the socket closed (1009), so the caller reconnects and catches up by REST, whose
answers are bounded too (``loopd.chat.rest``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode

import anyio
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from loopd.errors import LoopdError

log = logging.getLogger("loopd.chat.ws")

SEQ_MISMATCH = 4001
PING_TIMEOUT = 4000
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class SocketLost(LoopdError):
    """The socket closed, broke, or was closed by loopd (gap, ping timeout)."""


class NoHello(SocketLost):
    """The socket opened but the server never said hello: a proxy or token fault."""


@dataclass(frozen=True)
class WsEvent:
    event: str
    seq: int
    data: dict[str, Any]
    broadcast: dict[str, Any] = field(default_factory=dict)


class SeqCheck(StrEnum):
    NEXT = "next"
    REPEAT = "repeat"
    GAP = "gap"


def check_seq(expected: int, seq: int) -> SeqCheck:
    if seq == expected:
        return SeqCheck.NEXT
    return SeqCheck.REPEAT if seq < expected else SeqCheck.GAP


@dataclass(frozen=True)
class Resume:
    connection_id: str
    next_seq: int


def websocket_uri(base_url: str, resume: Resume | None) -> str:
    if base_url.startswith("unix:"):
        root = "ws://localhost"
    else:
        root = base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    uri = f"{root}/api/v4/websocket"
    if resume is not None:
        query = {"connection_id": resume.connection_id, "sequence_number": resume.next_seq}
        uri += "?" + urlencode(query)
    return uri


def parse_frame(text: str | bytes) -> dict[str, Any] | None:
    try:
        frame = json.loads(text)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


class EventSocket:
    """One open socket. ``connection_id`` and ``next_seq`` say where a resume would start;
    ``resumed`` tells whether the server carried the old connection on (no catch-up needed in
    principle, though the adapter catches up anyway: it costs little and trusts nothing)."""

    def __init__(self, ws: ClientConnection, ping_interval_s: float) -> None:
        self.ws = ws
        self.ping_interval_s = ping_interval_s
        self.connection_id = ""
        self.next_seq = 0
        self.resumed = False
        self._action_seq = 0
        self._ping_outstanding: int | None = None
        self._next_ping_at = time.monotonic() + ping_interval_s
        self._early: list[WsEvent] = []

    async def handshake(self, resume: Resume | None, timeout_s: float) -> None:
        """Wait for hello, or for proof that a resume was accepted (a resent event or the
        reply to an immediate ping)."""
        if resume is not None:
            await self._send_ping()
        with anyio.move_on_after(timeout_s):
            while True:
                frame = await self._recv()
                if frame.get("event") == "hello":
                    data = frame.get("data") or {}
                    self.connection_id = str(data.get("connection_id", ""))
                    self.next_seq = int(frame.get("seq", 0)) + 1
                    self.resumed = resume is not None and self.connection_id == resume.connection_id
                    return
                if resume is None:
                    continue  # frames before hello (none expected) are not ours to judge
                self.connection_id, self.resumed = resume.connection_id, True
                self.next_seq = resume.next_seq
                if self._is_ping_reply(frame):
                    return
                event = _event(frame)
                if event is not None:
                    self._early.append(event)
                    return
        raise NoHello(
            f"the Mattermost socket sent no hello within {timeout_s:g} s: the chat proxy did "
            "not add the token, or the token is not valid"
        )

    async def events(self) -> AsyncIterator[WsEvent]:
        """Events in seq order; raises ``SocketLost`` when the socket must be reopened."""
        pending, self._early = self._early, []
        while True:
            for event in pending:
                verdict = check_seq(self.next_seq, event.seq)
                if verdict is SeqCheck.REPEAT:
                    log.info("dropped a repeated event (seq %d)", event.seq)
                    continue
                if verdict is SeqCheck.GAP:
                    await self._close(SEQ_MISMATCH, "sequence mismatch")
                    raise SocketLost(f"events lost: expected seq {self.next_seq}, got {event.seq}")
                self.next_seq = event.seq + 1
                yield event
            pending = []
            frame = await self._recv_or_ping()
            if frame is not None:
                if self._is_ping_reply(frame):
                    continue
                fresh = _event(frame)
                if fresh is not None:
                    pending = [fresh]

    async def _recv_or_ping(self) -> dict[str, Any] | None:
        frame: dict[str, Any] | None = None
        with anyio.move_on_after(max(0.0, self._next_ping_at - time.monotonic())):
            frame = await self._recv()
        if frame is not None:
            return frame
        if self._ping_outstanding is not None:
            await self._close(PING_TIMEOUT, "ping timeout")
            raise SocketLost(f"no reply to a ping within {self.ping_interval_s:g} s")
        await self._send_ping()
        return None

    async def _recv(self) -> dict[str, Any]:
        while True:
            try:
                text = await self.ws.recv()
            except ConnectionClosed as exc:
                raise SocketLost(f"the socket closed ({exc})") from exc
            frame = parse_frame(text)
            if frame is not None:
                return frame
            log.warning("ignored a frame that is not a JSON object: %.200r", text)

    async def _send_ping(self) -> None:
        self._action_seq += 1
        self._ping_outstanding = self._action_seq
        self._next_ping_at = time.monotonic() + self.ping_interval_s
        try:
            await self.ws.send(json.dumps({"action": "ping", "seq": self._action_seq}))
        except ConnectionClosed as exc:
            raise SocketLost(f"the socket closed ({exc})") from exc

    def _is_ping_reply(self, frame: dict[str, Any]) -> bool:
        if "seq_reply" not in frame:
            return False
        if frame.get("seq_reply") == self._ping_outstanding:
            self._ping_outstanding = None
        return True

    async def _close(self, code: int, reason: str) -> None:
        with anyio.move_on_after(1.0, shield=True):
            await self.ws.close(code, reason)


def _event(frame: dict[str, Any]) -> WsEvent | None:
    name, seq = frame.get("event"), frame.get("seq")
    if not isinstance(name, str) or not isinstance(seq, int):
        return None
    data = frame.get("data")
    broadcast = frame.get("broadcast")
    return WsEvent(
        name,
        seq,
        data if isinstance(data, dict) else {},
        broadcast if isinstance(broadcast, dict) else {},
    )


@asynccontextmanager
async def open_socket(
    base_url: str,
    token: str | None,
    resume: Resume | None,
    *,
    ping_interval_s: float = 30.0,
    hello_timeout_s: float = 10.0,
) -> AsyncIterator[EventSocket]:
    """Connect (TCP or the proxy's Unix socket), then hello or resume."""
    uri = websocket_uri(base_url, resume)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    options: dict[str, Any] = {
        "additional_headers": headers,
        "open_timeout": hello_timeout_s,
        "ping_interval": None,  # the server pings; websockets answers them by itself
        "max_size": MAX_MESSAGE_BYTES,
        "origin": None,
    }
    opener = (
        unix_connect(base_url[len("unix:") :], uri, **options)
        if base_url.startswith("unix:")
        else connect(uri, **options)
    )
    async with AsyncExitStack() as stack:
        try:
            ws = await stack.enter_async_context(opener)
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            raise SocketLost(f"cannot open the Mattermost socket at {base_url}: {exc}") from exc
        # Close in a shielded scope before the library's own exit does: a close awaited under a
        # cancelled scope is cancelled again and again (anyio's cancellation is level-triggered)
        # and leaves the protocol's futures in a state asyncio complains about.
        stack.push_async_callback(_close_quietly, ws)
        socket = EventSocket(ws, ping_interval_s)
        await socket.handshake(resume, hello_timeout_s)
        yield socket


async def _close_quietly(ws: ClientConnection) -> None:
    with anyio.move_on_after(1.0, shield=True):
        await ws.close()
