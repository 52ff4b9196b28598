"""Wire-level faults that ASGI cannot express: cutting TCP, and going silent under pings.

ASGI lets an app close a WebSocket politely, never drop it or stop the server's Ping frames.
The fake runs uvicorn with this protocol class, which puts a ``WireControl`` in the scope's
``extensions`` under ``WIRE_EXTENSION``. Without it (another server) the WebSocket layer falls
back to a close frame and an app-level stall.
"""

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

WIRE_EXTENSION = "loopd.fake.wire"


class WireControl:
    """Per-socket handle on the protocol: abort, or stall (no pings out, no bytes read)."""

    def __init__(self, protocol: "FaultableWebSocketProtocol") -> None:
        self._protocol = protocol

    def abort(self) -> None:
        self._protocol.transport.abort()

    def set_stalled(self, stalled: bool) -> None:
        self._protocol.set_stalled(stalled)


class FaultableWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol plus the ``WireControl`` hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stalled = False
        self._held: list[bytes] = []

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # absent when the handshake was refused
            scope["extensions"][WIRE_EXTENSION] = WireControl(self)

    def set_stalled(self, stalled: bool) -> None:
        if stalled == self._stalled:
            return
        self._stalled = stalled
        if stalled:
            self.stop_keepalive()
            return
        held, self._held = self._held, []
        for chunk in held:
            super().data_received(chunk)
        if not self.close_sent:
            self.start_keepalive()

    def data_received(self, data: bytes) -> None:
        # While stalled, incoming frames (including the client's Pings) wait unread, as they
        # would behind a hung server process.
        if self._stalled:
            self._held.append(data)
            return
        super().data_received(data)
