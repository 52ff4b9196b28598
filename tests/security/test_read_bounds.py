"""What a server sends cannot take loopd's memory or hold its turns: every read has a bound in
bytes and ends with one line when it is passed, and a drip of bytes that completes no event does
not keep a turn open.

The server here is hostile (``tests.security.hostile_http``, in this process); loopd's side runs
in a child process (``tests.watch``), so its peak memory and its event loop's longest stall are
what the answer cost it, and both are printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from loopd.chat.ws import MAX_MESSAGE_BYTES
from loopd.engine.client import ANSWER_MAX_BYTES
from loopd.wire.sse import MAX_EVENT_BYTES
from tests.security.hostile_http import (
    MIB,
    Script,
    head,
    hostile_server,
    hostile_websocket,
    repeated,
)
from tests.watch import Watched, run_watched

SENT = 128 * MIB  # what the server has to send: far past every bound
MAX_GROWTH = 48 * MIB  # what reading it may cost loopd's process, beyond where it began
SCENARIOS = "tests.security.bound_scenarios"
SSE = "text/event-stream"
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"id":"c1","model":"m"}\n\n'


def report(observed: Callable[[str], None], watched: Watched, what: str, sock: Path) -> None:
    line = f"{what.replace(str(sock), '<sock>')}; {watched.line}"
    print(line)
    observed(line)


def chat_script(status: str, content_type: str, body: Iterable[bytes | float]) -> Script:
    """Every request answered with ``status`` and ``body`` (``/slots`` too, which the first-byte
    watch may poll)."""

    def script(request: str) -> tuple[bytes, Iterable[bytes | float]]:
        return head(status, content_type), body

    return script


@pytest.mark.attack(
    attack="The server sends an SSE line that never ends, or an event's data lines without "
    "the blank line that ends it",
    input=f"a 200 stream: one delta, then {SENT // MIB} MiB of `data: xxx...` with no newline "
    f"(or `data: x` lines and no blank one)",
    expected=f"the request ends malformed, naming the bound ({MAX_EVENT_BYTES // MIB} MiB); "
    f"loopd's memory grows under {MAX_GROWTH // MIB} MiB; it hangs up before the end",
)
@pytest.mark.parametrize("shape", ["one line", "data lines"])
def test_an_endless_sse_event_is_cut_at_its_bound(
    short_dir: Path, observed: Callable[[str], None], shape: str
) -> None:
    piece = b"x" * 65536 if shape == "one line" else b"data: xxxxxxxxxxxxxxxxxxxxxxxxx\n" * 2048
    body = [DELTA, b"data: " if shape == "one line" else b"", *repeated(piece, SENT)]
    with hostile_server(short_dir / "llama.sock", chat_script("200 OK", SSE, body)) as served:
        watched = run_watched(f"{SCENARIOS}:one_request", served.url)
    ended = watched.result
    report(observed, watched, f"{shape}: {ended['failure']}: {ended['detail'][:160]}", served.path)
    assert ended["failure"] == "malformed"
    assert f"grew past {MAX_EVENT_BYTES:,} bytes" in ended["detail"]
    assert ended["content"] == "Hi"
    assert watched.growth < MAX_GROWTH
    assert served.hung_up["POST /v1/chat/completions"]


@pytest.mark.attack(
    attack="The server, or Mattermost, answers with an error whose body never ends",
    input=f"500 to a chat request (400 to GET /users/me), then {SENT // MIB} MiB of text",
    expected="one line with the body's first bytes and a word that it was longer; loopd's "
    f"memory grows under {MAX_GROWTH // MIB} MiB; it hangs up at once",
)
@pytest.mark.parametrize(
    ("status", "scenario", "request_line", "start"),
    [
        ("500 Internal", "one_request", "POST /v1/chat/completions", "rejected: llama-server at"),
        ("400 Bad Request", "mattermost_call", "GET /api/v4/users/me", "Mattermost GET /users/me"),
    ],
    ids=["llama-server", "mattermost"],
)
def test_an_endless_error_body_is_read_only_in_part(
    short_dir: Path,
    observed: Callable[[str], None],
    status: str,
    scenario: str,
    request_line: str,
    start: str,
) -> None:
    body = [b"no: ", *repeated(b"n" * 65536, SENT)]
    with hostile_server(short_dir / "x.sock", chat_script(status, "text/plain", body)) as served:
        watched = run_watched(f"{SCENARIOS}:{scenario}", served.url)
    error = str(watched.result["error"])
    report(observed, watched, f"{error[:100]} ... {error[-60:]}", served.path)
    assert error.startswith(start)
    assert f"answered {status[:3]}: no: nnn" in error
    assert error.endswith("not read on)")
    assert watched.growth < MAX_GROWTH
    assert served.sent[request_line] < SENT // 2


@pytest.mark.attack(
    attack="The server answers a small call (`/slots`) with a body of any size",
    input=f"200 to GET /slots, then {SENT // MIB} MiB of a JSON list that never closes",
    expected=f"the call fails with one line naming the bound ({ANSWER_MAX_BYTES // MIB} MiB); "
    f"loopd's memory grows under {MAX_GROWTH // MIB} MiB; it hangs up",
)
def test_a_small_calls_answer_is_bounded(short_dir: Path, observed: Callable[[str], None]) -> None:
    body = [b"[", *repeated(b'{"id": 0, "is_processing": false}, ' * 1024, SENT)]
    script = chat_script("200 OK", "application/json", body)
    with hostile_server(short_dir / "llama.sock", script) as served:
        watched = run_watched(f"{SCENARIOS}:slots_call", served.url)
    report(observed, watched, str(watched.result["error"]), served.path)
    assert f"answered more than {ANSWER_MAX_BYTES:,} bytes" in str(watched.result["error"])
    assert watched.growth < MAX_GROWTH
    assert served.sent["GET /slots"] < SENT // 2


@pytest.mark.attack(
    attack="Mattermost's WebSocket (or what answers as it) sends a message of any size",
    input=f"hello, then one `posted` event of {SENT // MIB} MiB",
    expected=f"the message is refused before it is read ({MAX_MESSAGE_BYTES // MIB} MiB): the "
    f"socket is closed (1009) and reopened by the caller; loopd's memory grows under "
    f"{MAX_GROWTH // MIB} MiB",
)
def test_a_huge_websocket_message_is_refused_before_it_is_read(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    hello = json.dumps({"event": "hello", "seq": 0, "data": {"connection_id": "c1"}})
    posted = '{"event": "posted", "seq": 1, "data": {"post": "' + "x" * SENT + '"}}'
    sock = short_dir / "ws.sock"
    with hostile_websocket(sock, [hello, posted]):
        watched = run_watched(f"{SCENARIOS}:mattermost_socket", f"unix:{sock}")
    error = str(watched.result["error"])
    report(observed, watched, f"{watched.result['events']} events; {error}", sock)
    assert watched.result["events"] == 0
    assert "1009" in error
    assert "message too big" in error
    assert watched.growth < MAX_GROWTH


DRIP_BYTES = 300  # one a tenth of a second: 30 s, were it read to its end
SILENCE_S = 1.0


@pytest.mark.attack(
    attack="The server drips a byte at a time after a good delta, completing no event",
    input=f"one delta, then one byte every 0.1 s ({DRIP_BYTES} in all), never a newline; "
    f"silence limit {SILENCE_S:g} s",
    expected="the silence limit ends the request (it counts events, not bytes) and closes the "
    "connection long before the drip ends",
)
def test_a_drip_of_bytes_does_not_keep_a_turn_open(
    short_dir: Path, observed: Callable[[str], None]
) -> None:
    body: list[bytes | float] = [DELTA]
    for _ in range(DRIP_BYTES):
        body += [0.1, b"d"]
    with hostile_server(short_dir / "llama.sock", chat_script("200 OK", SSE, body)) as served:
        watched = run_watched(f"{SCENARIOS}:one_request", served.url, str(SILENCE_S))
    ended = watched.result
    dripped = served.sent["POST /v1/chat/completions"] - len(DELTA)
    report(
        observed,
        watched,
        f"{ended['failure']} after {ended['ended_s']:.1f} s, {dripped} bytes dripped: "
        f"{ended['detail']}",
        served.path,
    )
    assert ended["failure"] == "silence"
    assert served.hung_up["POST /v1/chat/completions"]
    assert dripped < DRIP_BYTES
