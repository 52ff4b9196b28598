"""The e2e timing maths and searches, on hand-made input (no server)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.e2e_support import (
    REPO_ROOT,
    TcpTap,
    chunked_body,
    files_containing,
    minimal_env,
    sse_events,
)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_body_times_each_chunk_by_its_last_byte() -> None:
    # The second chunk arrives split over two reads; it is complete only at the later one.
    pieces = [
        (1.0, HEAD + b"5\r\nhello\r\n"),
        (2.0, b"6\r\n wo"),
        (3.0, b"rld\r\n0\r\n\r\n"),
    ]
    assert chunked_body(pieces) == [(1.0, b"hello"), (3.0, b" world")]


def test_chunked_body_refuses_what_is_not_chunked_or_is_cut_short() -> None:
    with pytest.raises(ValueError, match="not a chunked"):
        chunked_body([(1.0, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")])
    with pytest.raises(ValueError, match="inside a 10-byte chunk"):
        chunked_body([(1.0, HEAD + b"a\r\nshort")])


def test_sse_events_end_at_their_blank_line_and_leave_a_partial_tail_out() -> None:
    body = [(1.0, b"data: 1\n\ndata: "), (2.0, b"2\n"), (3.0, b"\ndata: 3")]
    assert sse_events(body) == [(1.0, b"data: 1\n\n"), (3.0, b"data: 2\n\n")]


def test_files_containing_finds_a_needle_anywhere_below(tmp_path: Path) -> None:
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "hit.db").write_bytes(b"\x00xx-needle-xx\x00")
    (tmp_path / "miss.txt").write_text("nothing here")
    assert files_containing(tmp_path, b"needle") == [tmp_path / "deep" / "er" / "hit.db"]


def test_the_tap_relays_both_ways_and_records_what_crossed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True
    ) as echo:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        tap = TcpTap(("127.0.0.1", port))
        try:
            before = tap.mark()
            host, _, tap_port = tap.url.removeprefix("http://").partition(":")
            with socket.create_connection((host, int(tap_port)), timeout=5) as sock:
                sock.sendall(b"ping")
                assert sock.recv(16) == b"PING"
                assert sock.recv(16) == b""  # the echo server ended it, and the tap passed that on
            assert tap.sent_since(before) == b"ping"
            assert [data for _, data in tap.answered_since(before)] == [b"PING"]
            assert tap.client_closes_after(0.0) == []
        finally:
            tap.close()
            echo.wait(timeout=5)


# Accepts one connection, answers one read upper-cased, then exits.
ECHO_SERVER = """
import socket
with socket.create_server(("127.0.0.1", 0)) as server:
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
    with conn:
        conn.sendall(conn.recv(16).upper())
"""


def test_the_probe_reports_a_refused_connection_and_a_missing_socket(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "tests.e2e.inside", "--report", str(report)]
    argv += ["--tcp", "127.0.0.1:1", "--get", f"gone={tmp_path / 'none.sock'}:/health"]
    subprocess.run(argv, env=minimal_env(tmp_path, PYTHONPATH=str(REPO_ROOT)), check=True)
    found = json.loads(report.read_text())
    assert found["tcp"][0]["connected"] is False
    assert found["tcp"][0]["errno"] == "ECONNREFUSED"
    assert found["unix"][0]["status"] is None
    assert "lo" in found["interfaces"]


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_the_tap_notes_when_the_client_hangs_up(reset: bool) -> None:
    """A client that closes, or resets (closing with unread data does that), is noted at once."""
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        tap = TcpTap(("127.0.0.1", upstream.getsockname()[1]))
        try:
            host, _, port = tap.url.removeprefix("http://").partition(":")
            client = socket.create_connection((host, int(port)), timeout=5)
            server_side, _ = upstream.accept()
            with server_side:
                server_side.sendall(b"unread by the client")
                if reset:  # linger 0: close sends a reset, not an orderly end
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                started = time.monotonic()
                client.close()
                server_side.settimeout(5)
                assert server_side.recv(16) == b""  # the tap passed the hang-up on
            [closed] = tap.client_closes_after(started)
            assert closed - started < 1.0
        finally:
            tap.close()
