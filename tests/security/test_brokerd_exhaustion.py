"""brokerd under load from a hostile box: one process, one event loop, three sockets.

One ``brokerd serve --only infer --only broker`` with its defaults (100 connections per socket,
10 s for a request head, 128 MiB of request bodies held at once, 1 MiB per broker request) and
the open-file limit of a default service (1,024), attacked through its real sockets.
"""

import contextlib
import json
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from tests.security.brokerd_run import RunningBrokerd, brokerd

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
HEADER_TIMEOUT_S = 10.0  # brokerd's default header_timeout_s
BUDGET = 128 * MIB  # brokerd's default body_memory_bytes


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBrokerd]:
    folder = Path(tmp_path_factory.mktemp("exhaust"))
    variables = {
        "BROKERD_INFERENCE_URL": f"unix:{folder}/no-llama.sock",
        "BROKERD_BROKER__AUDIT_DB": str(folder / "audit.db"),
    }
    prefix = ["prlimit", "--nofile=1024:1024", "--"]
    with brokerd(folder, variables, only=["infer", "broker"], prefix=prefix) as process:
        yield process


def health(path: Path, timeout_s: float) -> bytes:
    """One GET /v1/health on a fresh connection: the status line (``socket.timeout`` if slow)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: box\r\nConnection: close\r\n\r\n")
        return sock.recv(4096).split(b"\r\n", 1)[0]


def open_idle(path: Path, count: int) -> list[socket.socket]:
    """``count`` connections that never send a byte (each queued or accepted)."""
    idle = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # backlog full: the connect is still pending
            sock.connect(str(path))
        idle.append(sock)
    return idle


@pytest.mark.attack(
    attack="Idle connections to one socket starve the others and flood the log",
    input="1,100 connections to infer.sock that send nothing (brokerd's open-file limit 1,024)",
    expected="broker.sock answers at once; the log stays small (100 connections per socket)",
)
def test_idle_connections_to_one_socket_leave_the_others_alone(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    log_before = running.log_bytes()
    idle = open_idle(running.socket("infer"), 1100)
    try:
        started = time.monotonic()
        answers = [health(running.socket("broker"), timeout_s=2.0) for _ in range(5)]
        elapsed = time.monotonic() - started
        logged = running.log_bytes() - log_before
    finally:
        for sock in idle:
            sock.close()
    observed(f"5 health checks in {elapsed:.2f} s: {answers[0].decode()}; log grew {logged} B")
    assert answers == [b"HTTP/1.1 200 OK"] * 5
    assert logged < 64 * 1024


@pytest.mark.attack(
    attack="Slow-header clients hold connections for ever",
    input="50 connections that send `GET /health HT` and then nothing",
    expected=f"each is closed within header_timeout_s ({HEADER_TIMEOUT_S:g} s, plus slack)",
)
@pytest.mark.slow
async def test_slow_header_clients_are_cut(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    cut_after: list[float] = []
    started = time.monotonic()

    async def slow_client() -> None:
        async with await anyio.connect_unix(running.socket("infer")) as stream:
            await stream.send(b"GET /health HT")
            try:
                while await stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                cut_after.append(time.monotonic() - started)

    with anyio.move_on_after(HEADER_TIMEOUT_S + 8):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(slow_client)
    observed(f"{len(cut_after)} of 50 closed, the last after {max(cut_after, default=0):.1f} s")
    assert len(cut_after) == 50
    assert max(cut_after) >= HEADER_TIMEOUT_S - 1  # cut by the deadline, not at once


@pytest.mark.attack(
    attack="Unfinished large bodies grow brokerd's memory without bound",
    input="12 requests declaring 63 MiB bodies to infer.sock, each sending 16 MiB and stopping",
    expected="brokerd holds at most its body budget: memory grows by less than 64 MiB",
)
async def test_unfinished_bodies_do_not_grow_memory_without_bound(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    before = running.rss_bytes()
    refused = 0
    chunk = b"x" * MIB
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: box\r\n"
        f"Content-Type: application/json\r\nContent-Length: {63 * MIB}\r\n\r\n"
    ).encode()
    streams: list[anyio.abc.SocketStream] = []

    async def big_body() -> None:
        nonlocal refused
        stream = await anyio.connect_unix(running.socket("infer"))
        streams.append(stream)  # kept open: the body stays unfinished
        try:
            await stream.send(head)
            for _ in range(16):
                await stream.send(chunk)
        except (anyio.BrokenResourceError, BrokenPipeError, ConnectionResetError):
            refused += 1  # answered (503) and closed before the body was read

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(big_body)
        grown = running.rss_bytes() - before
    finally:
        for stream in streams:
            await stream.aclose()
    observed(f"memory grew {grown / MIB:.0f} MiB; {refused} of 12 refused before their body")
    assert grown < 64 * MIB


@pytest.mark.attack(
    attack="A huge call_tool body is stored in the append-only audit log",
    input="POST /v1/call_tool with 200 MiB of `arguments` (Content-Length 200 MiB)",
    expected="413 before the body is read; nothing written to the audit log",
)
async def test_a_huge_call_is_refused_and_not_audited(
    running: RunningBrokerd,
    tmp_path_factory: pytest.TempPathFactory,
    observed: Callable[[str], None],
) -> None:
    filler = 200 * MIB
    prefix = b'{"session": "s", "call_id": "huge", "name": "clock_now", "arguments": "'
    suffix = b'"}'
    head = (
        "POST /v1/call_tool HTTP/1.1\r\nHost: box\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(prefix) + filler + len(suffix)}\r\n\r\n"
    ).encode()
    received = bytearray()
    async with await anyio.connect_unix(running.socket("broker")) as stream:

        async def send_all() -> None:
            await stream.send(head + prefix)
            chunk = b"a" * MIB
            for _ in range(filler // MIB):
                await stream.send(chunk)
            await stream.send(suffix)

        async def read_answer(scope: anyio.CancelScope) -> None:
            try:
                while chunk := await stream.receive():
                    received.extend(chunk)
                    if b"\r\n\r\n" in received and b"}" in received:
                        break
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
            scope.cancel()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_answer, tg.cancel_scope)
                # brokerd may answer and close without reading the rest.
                with contextlib.suppress(
                    anyio.BrokenResourceError, BrokenPipeError, ConnectionResetError
                ):
                    await send_all()
    status = bytes(received).split(b"\r\n", 1)[0].decode()
    rows = _audit_rows(running)
    observed(f"{status}; audit rows for the call: {rows}")
    assert status.startswith("HTTP/1.1 413")
    assert rows == 0


@pytest.mark.attack(
    attack="Over-deep JSON crashes the broker's request parsing",
    input="call_tool whose `arguments` nest 100,000 arrays deep",
    expected="400 naming the nesting limit, not a 500",
)
def test_over_deep_json_is_a_client_error(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    depth = 100_000
    body = (
        '{"session": "s", "call_id": "deep", "name": "clock_now", "arguments": '
        + "[" * depth
        + "]" * depth
        + "}"
    ).encode()
    head = (
        "POST /v1/call_tool HTTP/1.1\r\nHost: box\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(running.socket("broker")))
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head_bytes, _, content = answer.partition(b"\r\n\r\n")
    status = head_bytes.split(b"\r\n", 1)[0].decode()
    observed(f"{status}: {content[:80].decode(errors='replace')}")
    assert status.startswith("HTTP/1.1 400")
    assert "nests deeper than" in json.loads(content)["error"]


def _audit_rows(running: RunningBrokerd) -> int:
    audit = running.socket_dir.parent / "audit.db"
    with sqlite3.connect(audit) as db:
        (count,) = db.execute("SELECT count(*) FROM call_started WHERE call_id = 'huge'").fetchone()
    return int(count)


@pytest.mark.attack(
    attack="Malformed requests flood brokerd's log",
    input="1,000 connections to infer.sock, each sending one line that is not HTTP",
    expected="each gets 400; the log grows by a few lines (20 warnings of a kind per 10 s)",
)
def test_malformed_requests_do_not_flood_the_log(
    running: RunningBrokerd, observed: Callable[[str], None]
) -> None:
    log_before = running.log_bytes()
    statuses = set()
    for _ in range(1000):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(running.socket("infer")))
            sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
            statuses.add(sock.recv(4096).split(b"\r\n", 1)[0])
    logged = running.log_bytes() - log_before
    observed(f"answers {sorted(s.decode() for s in statuses)}; log grew {logged} B")
    assert statuses == {b"HTTP/1.1 400 Bad Request"}
    assert logged < 16 * 1024
