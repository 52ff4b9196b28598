"""Helpers for the end-to-end tests: child processes, a recording TCP tap, and the timing maths.

The tap sits between brokerd and the real llama-server on loopback. Everything brokerd sends
upstream and everything the server answers crosses it, stamped with the time it arrived, so a test
can tell whether a request reached the server at all, and how much later than the server's bytes
each event reached the client on the far side of brokerd.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

TimedBytes = tuple[float, bytes]
"""Bytes and the ``time.monotonic()`` at which their last byte arrived."""


class ChildFailed(RuntimeError):
    """A child process exited or stayed silent before it said it was ready; carries its log."""


@dataclass
class Child:
    """A child process whose stdout and stderr go to one log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> Child:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )
        return cls(name, process, log_path)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, text: str, timeout_s: float) -> str:
        """Wait until the log contains ``text``; the log so far. ``ChildFailed`` if it exits."""
        deadline = time.monotonic() + timeout_s
        while text not in (logged := self.log()):
            if self.process.poll() is not None:
                raise ChildFailed(f"{self.name} exited ({self.process.returncode}):\n{logged}")
            if time.monotonic() > deadline:
                raise ChildFailed(f"{self.name} did not say {text!r} in {timeout_s} s:\n{logged}")
            time.sleep(0.05)
        return logged

    def stop(self) -> None:
        """SIGTERM, and SIGKILL to its whole process group (it leads one: ``start_new_session``)
        if it outstays 10 s, so that what it started goes with it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@dataclass(frozen=True)
class Brokerd:
    """A running ``brokerd serve``: its sockets' folder, and the process with its log."""

    socket_dir: Path
    child: Child

    def socket(self, service: str) -> Path:
        return self.socket_dir / f"{service}.sock"


def minimal_env(home: Path, **variables: str) -> dict[str, str]:
    """A child's whole environment: nothing inherited from the test run but the search path."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), **variables}


def files_containing(root: Path, needle: bytes) -> list[Path]:
    """Every regular file under ``root`` whose bytes contain ``needle``."""
    return sorted(
        path for path in root.rglob("*") if path.is_file() and needle in path.read_bytes()
    )


@dataclass
class TcpTap:
    """A loopback TCP relay to ``upstream`` that records both directions, in threads.

    Closing either side closes the other at once (no half-close), as a client hang-up must reach
    the server unchanged for the slot-freeing check to mean anything.
    """

    upstream: tuple[str, int]
    _listener: socket.socket = field(init=False)
    _to_server: bytearray = field(default_factory=bytearray)
    _from_server: list[TimedBytes] = field(default_factory=list)
    _client_closes: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _open: list[socket.socket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # so the accept loop notices close()
        threading.Thread(target=self._accept_loop, name="tap-accept", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def mark(self) -> tuple[int, int]:
        """A bookmark: what has crossed so far, for ``*_since``."""
        with self._lock:
            return len(self._to_server), len(self._from_server)

    def sent_since(self, mark: tuple[int, int]) -> bytes:
        """What brokerd sent the server after the bookmark."""
        with self._lock:
            return bytes(self._to_server[mark[0] :])

    def answered_since(self, mark: tuple[int, int]) -> list[TimedBytes]:
        """What the server sent back after the bookmark, as received, with arrival times."""
        with self._lock:
            return list(self._from_server[mark[1] :])

    def client_closes_after(self, since: float) -> list[float]:
        """When the client side (brokerd) closed a connection, for closes after ``since``."""
        with self._lock:
            return [closed for closed in self._client_closes if closed > since]

    def close(self) -> None:
        self._stopping.set()  # before the shutdowns below, so they count as no client's close
        self._listener.close()
        with self._lock:
            for sock in self._open:
                _shut(sock)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _shut(client)  # the server is down: the client sees its connection dropped
                continue
            with self._lock:
                self._open += [client, server]
            ended = threading.Event()  # set by whichever direction ends first
            pair = (client, server, ended)
            threading.Thread(target=self._pump_up, args=pair, daemon=True).start()
            threading.Thread(target=self._pump_down, args=pair, daemon=True).start()

    def _pump_up(
        self, client: socket.socket, server: socket.socket, ended: threading.Event
    ) -> None:
        self._pump(client, server, ended, record=self._record_sent, source_is_client=True)

    def _pump_down(
        self, client: socket.socket, server: socket.socket, ended: threading.Event
    ) -> None:
        self._pump(server, client, ended, record=self._record_answered, source_is_client=False)

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        ended: threading.Event,
        *,
        record: Callable[[bytes], None],
        source_is_client: bool,
    ) -> None:
        """Copy source to sink until either fails or ends; then end the pair. Which side ended
        it decides whether it counts as the client's close (an EOF or a reset both do)."""
        by_client = source_is_client
        try:
            while data := source.recv(65536):
                record(data)
                by_client = not source_is_client  # from here on, a failure is the sink's
                sink.sendall(data)
                by_client = source_is_client
        except OSError:
            pass
        finally:
            self._end(ended, by_client=by_client)
            _shut(source, sink)

    def _record_sent(self, data: bytes) -> None:
        with self._lock:
            self._to_server += data

    def _record_answered(self, data: bytes) -> None:
        arrived = time.monotonic()
        with self._lock:
            self._from_server.append((arrived, data))

    def _end(self, ended: threading.Event, *, by_client: bool) -> None:
        """The first end of a connection wins; the second is the tap's own doing."""
        with self._lock:
            if ended.is_set():
                return
            ended.set()
            if by_client and not self._stopping.is_set():
                self._client_closes.append(time.monotonic())


def _shut(*socks: socket.socket) -> None:
    for sock in socks:
        # shutdown first: it wakes a thread blocked in recv on the same socket; close does not.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def _arrival_of(pieces: Sequence[TimedBytes]) -> tuple[bytes, list[int], list[float]]:
    joined = b"".join(data for _, data in pieces)
    ends = list(accumulate(len(data) for _, data in pieces))
    return joined, ends, [arrived for arrived, _ in pieces]


def _time_of_byte(offset: int, ends: list[int], times: list[float]) -> float:
    return times[bisect_right(ends, offset)]


def chunked_body(response: Sequence[TimedBytes]) -> list[TimedBytes]:
    """The body of one raw HTTP/1.1 response with chunked framing, chunk by chunk, each with
    the arrival time of its last byte. Bytes after the final chunk are ignored."""
    raw, ends, times = _arrival_of(response)
    head_end = raw.index(b"\r\n\r\n") + 4
    if b"\r\ntransfer-encoding: chunked\r\n" not in raw[:head_end].lower():
        raise ValueError(f"not a chunked response: {raw[:head_end]!r}")
    body: list[TimedBytes] = []
    position = head_end
    while True:
        line_end = raw.index(b"\r\n", position)
        size = int(raw[position:line_end].split(b";")[0], 16)
        if size == 0:
            return body
        start, stop = line_end + 2, line_end + 2 + size
        if stop > len(raw):
            raise ValueError(f"the response ends inside a {size}-byte chunk")
        body.append((_time_of_byte(stop - 1, ends, times), raw[start:stop]))
        position = stop + 2


def sse_events(body: Sequence[TimedBytes]) -> list[TimedBytes]:
    """The server-sent events in a body (each ending in a blank line), each with the arrival
    time of its last byte. An unterminated tail is left out."""
    joined, ends, times = _arrival_of(body)
    events: list[TimedBytes] = []
    start = 0
    while (end := joined.find(b"\n\n", start)) != -1:
        stop = end + 2
        events.append((_time_of_byte(stop - 1, ends, times), joined[start:stop]))
        start = stop
    return events


def http_request(method: str, target: str, body: bytes = b"") -> bytes:
    """One HTTP/1.1 request, written out byte for byte, asking the server to close after it."""
    head = [f"{method} {target} HTTP/1.1", "Host: box", "Connection: close"]
    if body or method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
