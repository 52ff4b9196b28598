"""Small ASGI helpers: reading a body, JSON answers, and the SSE writer with pings and faults."""

from collections.abc import Awaitable, Callable, MutableMapping
from enum import Enum
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream

from loopcommon.jsonbytes import dumps

from .chunks import PING
from .errors import ApiError
from .faults import FaultBoard, StreamFaults, Trigger

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

BEGIN = b""  # the frame that means "the slot started: send status and headers now"
_MALFORMED = b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":\n\n'
_ERROR_EVENT = ApiError(500, "fake fault: error in the middle of the stream").envelope()


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def json_bytes(value: Any) -> bytes:
    return dumps(value).encode()


async def send_json(send: Send, status: int, value: Any) -> None:
    body = json_bytes(value)
    headers = [
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class StreamEnd(Enum):
    DONE = "ok"
    ERROR_EVENT = "error-event"
    DROPPED = "dropped"


class SseWriter:
    """Writes frames to the client: headers on BEGIN, pings in silences, injected faults."""

    def __init__(
        self, send: Send, board: FaultBoard, faults: StreamFaults, ping_interval: float
    ) -> None:
        self._send = send
        self._board = board
        self._faults = faults
        self._ping_interval = ping_interval
        self.headers_sent = False
        self.finished = False
        self._events = 0

    async def begin(self) -> None:
        if self.headers_sent:
            return
        self.headers_sent = True
        headers = [(b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self) -> None:
        self.finished = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def pump(self, frames: ObjectReceiveStream[bytes]) -> StreamEnd:
        """Copy frames to the wire until the producer closes its end, or a fault ends it."""
        while True:
            try:
                frame = await self._next_frame(frames)
            except anyio.EndOfStream:
                await self.end()
                return StreamEnd.DONE
            if frame is None:
                await self.write(PING)
                continue
            if frame == BEGIN:
                await self.begin()
            else:
                await self.write(frame)
                if not frame.startswith(b"data:"):
                    continue
                self._events += 1
            # Faults fire right after the Nth event, before any ping could fill the silence.
            end = await self._fire_faults()
            if end is not None:
                return end

    async def _next_frame(self, frames: ObjectReceiveStream[bytes]) -> bytes | None:
        """The next frame, or None when a ping is due."""
        if not self.headers_sent or self._ping_interval <= 0:
            return await frames.receive()
        with anyio.move_on_after(self._ping_interval):
            return await frames.receive()
        return None

    async def _fire_faults(self) -> StreamEnd | None:
        f = self._faults
        if _due(f.stall, self._events):
            await self._board.wait_until(lambda now: now.stall_mid_stream is None)
        if _due(f.malformed, self._events):
            await self.write(_MALFORMED)
        if _due(f.error, self._events):
            await self.write(b"data: " + json_bytes(_ERROR_EVENT) + b"\n\n")
            await self.end()
            return StreamEnd.ERROR_EVENT
        if _due(f.drop, self._events):
            return StreamEnd.DROPPED
        return None


def _due(trigger: Trigger | None, events_written: int) -> bool:
    return trigger is not None and trigger.after == events_written
