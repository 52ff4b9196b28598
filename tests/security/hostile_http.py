"""A hostile HTTP server on a Unix socket, for the bounds of what loopd reads: each connection
gets a status line and headers, then a body the test scripts as pieces of bytes (which may never
end, or drip), written until the client hangs up; and a hostile WebSocket server, whose frames
the test gives.

It runs in threads of the test's own process, so a child process that connects to it (the
scenario under ``tests.watch``) pays only for what it reads.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, unix_serve

MIB = 1024 * 1024


class Reset:
    """A body's piece that ends the connection with a reset (TCP's RST), not an orderly close."""


RESET = Reset()
_NO_LINGER = struct.pack("ii", 1, 0)

# A request's path -> the head and the body's pieces; a piece that is a float is a pause.
Script = Callable[[str], tuple[bytes, Iterable[bytes | float | Reset]]]


@dataclass
class Served:
    """What the server wrote, per request (``METHOD /path``), and whether the client hung up
    before the body's end: complete once the server's block has ended (its threads joined)."""

    path: Path
    sent: dict[str, int] = field(default_factory=dict)
    hung_up: dict[str, bool] = field(default_factory=dict)
    port: int | None = None  # served on 127.0.0.1 over TCP, not on ``path``

    @property
    def url(self) -> str:
        return f"unix:{self.path}" if self.port is None else f"http://127.0.0.1:{self.port}"


def head(status: str, content_type: str = "text/plain", extra: str = "") -> bytes:
    """A status line and headers for a body that ends when the connection closes."""
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}Connection: close\r\n\r\n"
    ).encode()


def repeated(piece: bytes, total: int) -> Iterator[bytes]:
    """``piece`` again and again, ``total`` bytes in all (a whole number of pieces)."""
    for _ in range(total // len(piece)):
        yield piece


@contextmanager
def hostile_server(path: Path, script: Script, *, tcp: bool = False) -> Iterator[Served]:
    """Serve ``script`` on the Unix socket ``path`` (or, ``tcp``, a port of 127.0.0.1: a
    ``RESET`` needs TCP) until the block ends."""
    served = Served(path)
    if tcp:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        served.port = listener.getsockname()[1]
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
    listener.listen(16)
    listener.settimeout(0.1)
    stop = threading.Event()
    workers: list[threading.Thread] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            worker = threading.Thread(target=answer, args=(conn,), daemon=True)
            workers.append(worker)
            worker.start()

    def answer(conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            status_and_headers, body = script(request)
            sent, hung_up = 0, False
            try:
                conn.sendall(status_and_headers)
                for piece in body:
                    if stop.is_set():  # the block ended first: did the client go before it?
                        hung_up = _peer_closed(conn)
                        break
                    if isinstance(piece, float):
                        time.sleep(piece)
                        continue
                    if isinstance(piece, Reset):  # closed at once below, with no linger: a reset
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
                        break
                    conn.sendall(piece)
                    sent += len(piece)
            except (BrokenPipeError, ConnectionResetError):
                hung_up = True
            served.sent[request] = served.sent.get(request, 0) + sent
            served.hung_up[request] = hung_up

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    try:
        yield served
    finally:
        stop.set()
        acceptor.join(timeout=10)
        for worker in workers:
            worker.join(timeout=10)
        listener.close()


def _peer_closed(conn: socket.socket) -> bool:
    """Whether the client has closed its end, as a read tells at once (the end of the stream, or
    a reset); the client, its request sent, writes nothing more while it is there."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _read_request(conn: socket.socket) -> str:
    """``METHOD /path`` of the request on ``conn``, its head and body read (by its length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    method, target, *_ = [*lines[0].split(" "), "", ""]
    return f"{method} {target.split('?')[0]}"


@contextmanager
def hostile_websocket(path: Path, frames: Iterable[str]) -> Iterator[None]:
    """A WebSocket server on the Unix socket ``path`` that sends ``frames`` to each client (as
    far as the client lets it), then closes."""

    def handler(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            for frame in frames:
                ws.send(frame)

    server = unix_serve(handler, str(path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        thread.join(timeout=10)
