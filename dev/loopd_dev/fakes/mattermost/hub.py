"""The connection registry: per-connection seq counters, send queues, dead queues and resume.

Mirrors ``app/platform/web_conn.go`` and ``web_hub.go``:

- An event gets its ``seq`` when it is *written* (by the socket's writer), not when queued.
- Every written event also goes into a 128-slot ring (the dead queue).
- When a socket closes, its connection stays registered, inactive, and keeps queueing events
  (up to 256) until the reaper removes it. A full queue removes the connection at once.
- A reconnect with ``connection_id`` and ``sequence_number`` resumes it (cases A-E).

No sockets here: the WebSocket layer attaches a ``SocketControl`` and runs the writer.
"""

import enum
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from loopd_dev.fakes.mattermost.events import WsEvent, WsReply, hello
from loopd_dev.fakes.mattermost.model import is_valid_id, new_id

Outgoing = WsEvent | WsReply


class SocketControl(Protocol):
    """What the hub may do to the socket currently attached to a connection."""

    def drop(self) -> None:
        """Lose the connection abruptly, as a network failure would."""

    def close_going_away(self) -> None:
        """Close it as a shutting-down server does."""

    def set_stalled(self, stalled: bool) -> None:
        """Stop (or resume) protocol-level traffic: pings out, frames in."""


class Outcome(enum.Enum):
    """How a connect request ended (``reference/mattermost.md`` §2.3)."""

    FRESH = "fresh"  # no resume parameters: new id, hello
    A_REPLAYED = "A"  # kept, seq in the dead queue: resend from there, no hello
    B_NOTHING_MISSED = "B"  # kept, nothing missed: no hello, numbering continues
    C_BUFFER_LOST = "C"  # kept, seq fell out of the buffer: new id, counter reset, hello
    D_UNKNOWN = "D"  # not kept (reaped, restart, overflow): new id, hello
    E_REJECTED = "E"  # bad parameters: the socket is closed right after the upgrade


@dataclass(frozen=True)
class SentFrame:
    seq: int
    text: str


@dataclass
class Connection:
    id: str
    user_id: str
    send_stream: MemoryObjectSendStream[Outgoing]
    receive_stream: MemoryObjectReceiveStream[Outgoing]
    dead_queue: deque[SentFrame]
    next_seq: int = 0
    active: bool = True
    inactive_since: float = 0.0
    socket: SocketControl | None = None
    held: list[Outgoing] = field(default_factory=list)  # taken from the queue, not yet written
    skip_before_next: int = 0  # fault: seqs to leave out before the next event
    duplicate_next: int = 0  # fault: events to write twice

    def stamp(self, event: WsEvent) -> SentFrame:
        """Give ``event`` this connection's next seq, record it in the dead queue."""
        seq = self.next_seq + self.skip_before_next
        self.skip_before_next = 0
        self.next_seq = seq + 1
        frame = SentFrame(seq, event.render(seq, self.user_id))
        self.dead_queue.append(frame)
        return frame

    def take_duplicate(self) -> bool:
        if self.duplicate_next <= 0:
            return False
        self.duplicate_next -= 1
        return True


@dataclass(frozen=True)
class ConnectPlan:
    """What the socket must write before its live loop, and how the connect was decided."""

    outcome: Outcome
    connection: Connection | None
    first_frames: tuple[str, ...] = ()


@dataclass
class Hub:
    server_version: str
    now: Callable[[], float]
    reaper_timeout_s: float = 300.0
    dead_queue_size: int = 128
    send_queue_size: int = 256
    _connections: dict[str, Connection] = field(default_factory=dict)

    def is_registered(self, conn: Connection) -> bool:
        return self._connections.get(conn.id) is conn

    def connections(self, user_id: str | None = None) -> list[Connection]:
        self.reap()
        return [c for c in self._connections.values() if user_id in (None, c.user_id)]

    # ----- connecting -----

    def connect(self, user_id: str, connection_id: str, sequence_number: str | None) -> ConnectPlan:
        """Decide a connect request; ``connection_id`` empty means a fresh connection."""
        self.reap()
        if not connection_id:
            return self._fresh(user_id, Outcome.FRESH)
        seq = _parse_seq(sequence_number)
        if not is_valid_id(connection_id) or seq is None:
            return ConnectPlan(Outcome.E_REJECTED, None)
        kept = self._connections.get(connection_id)
        if kept is None or kept.active or kept.user_id != user_id:
            return self._fresh(user_id, Outcome.D_UNKNOWN)
        return self._resume(kept, seq)

    def _fresh(self, user_id: str, outcome: Outcome) -> ConnectPlan:
        send, receive = anyio.create_memory_object_stream[Outgoing](self.send_queue_size)
        conn = Connection(new_id(), user_id, send, receive, deque(maxlen=self.dead_queue_size))
        self._connections[conn.id] = conn
        frame = conn.stamp(hello(self.server_version, conn.id, user_id))
        return ConnectPlan(outcome, conn, (frame.text,))

    def _resume(self, conn: Connection, seq: int) -> ConnectPlan:
        conn.active = True
        # Sequence 0 skips the resume logic on the real server (writePump checks Sequence != 0).
        if seq == 0:
            conn.next_seq = 0
            return ConnectPlan(Outcome.B_NOTHING_MISSED, conn)
        kept = list(conn.dead_queue)
        index = next((i for i, f in enumerate(kept) if f.seq == seq), None)
        if index is not None:
            replay = tuple(f.text for f in kept[index:])
            conn.next_seq = seq + len(replay)
            return ConnectPlan(Outcome.A_REPLAYED, conn, replay)
        if not kept or kept[-1].seq == seq - 1:
            conn.next_seq = seq
            return ConnectPlan(Outcome.B_NOTHING_MISSED, conn)
        # Message loss: same queues, new identity, counter reset, hello.
        del self._connections[conn.id]
        conn.id = new_id()
        self._connections[conn.id] = conn
        conn.dead_queue.clear()
        conn.next_seq = 0
        frame = conn.stamp(hello(self.server_version, conn.id, conn.user_id))
        return ConnectPlan(Outcome.C_BUFFER_LOST, conn, (frame.text,))

    def deactivate(self, conn: Connection) -> None:
        """The socket went away: keep the connection for resume until the reaper runs."""
        if conn.active:
            conn.active = False
            conn.inactive_since = self.now()
        conn.socket = None

    # ----- removing -----

    def reap(self) -> None:
        """Drop inactive connections older than the reaper timeout."""
        deadline = self.now() - self.reaper_timeout_s
        for conn in list(self._connections.values()):
            if not conn.active and conn.inactive_since <= deadline:
                self.remove(conn)

    def remove(self, conn: Connection) -> None:
        """Forget a connection; closing its send stream ends its writer, which closes the
        socket (``closeAndRemoveConn``)."""
        if self._connections.get(conn.id) is conn:
            del self._connections[conn.id]
        conn.send_stream.close()
        if conn.socket is None:  # no writer will drain it
            conn.receive_stream.close()

    def forget_all(self) -> None:
        """A server restart: every socket closes, no connection can be resumed."""
        for conn in list(self._connections.values()):
            if conn.socket is not None:
                conn.socket.close_going_away()
            self.remove(conn)

    # ----- sending -----

    def broadcast(self, event: WsEvent, members_of: Callable[[str], set[str]]) -> int:
        """Queue ``event`` for every connection it is addressed to; returns how many."""
        self.reap()
        sent = 0
        for conn in list(self._targets(event, members_of)):
            sent += self.enqueue(conn, event)
        return sent

    def _targets(
        self, event: WsEvent, members_of: Callable[[str], set[str]]
    ) -> Iterator[Connection]:
        target = event.broadcast
        for conn in self._connections.values():
            if conn.user_id in target.omit_users:
                continue
            if target.connection_id:
                if conn.id == target.connection_id:
                    yield conn
            elif target.user_id:
                if conn.user_id == target.user_id:
                    yield conn
            elif target.channel_id:
                if conn.user_id in members_of(target.channel_id):
                    yield conn
            else:
                yield conn

    def enqueue(self, conn: Connection, item: Outgoing) -> int:
        """Queue without waiting; a full queue costs the connection (the hub cannot block)."""
        try:
            conn.send_stream.send_nowait(item)
        except anyio.WouldBlock:
            self.remove(conn)
            return 0
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return 0
        return 1


def _parse_seq(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
