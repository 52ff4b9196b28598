"""Malformed answers from the inference server, relayed by a real brokerd.

brokerd reads llama-server's answers with httptools and writes a streamed body on from the
upstream connection's callback (``brokerd.proxy.oneshot``). Whatever the server sends, the box
must be able to tell a broken answer from a whole one, and brokerd's log must say what broke in
one line. A hostile server (on TCP, so that it can reset the connection) stands in for
llama-server; each case is one answer.
"""

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.security.brokerd_run import RunningBrokerd, brokerd
from tests.security.hostile_http import RESET, Reset, Served, hostile_server

CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
LOG_WAIT_S = 10.0


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass(frozen=True)
class Case:
    head: bytes
    body: tuple[bytes | float | Reset, ...]
    cause: str  # what brokerd's line must name
    delivered: bytes = b""  # the body the box gets before the break (a 502 when the head broke)


CASES = {
    "a chunk cut short": Case(
        CHUNKED_HEAD,
        (chunk(EVENT), b"40\r\ndata: {", 0.05),
        "closed the connection before the answer's end",
        EVENT + b"data: {",
    ),
    "an absurd chunk size": Case(
        CHUNKED_HEAD,
        (chunk(EVENT), 0.05, b"fffffffffffffffffffffff\r\n"),
        "not valid HTTP/1.1",
        EVENT,
    ),
    "chunk framing broken": Case(
        CHUNKED_HEAD,
        (chunk(EVENT), 0.05, b"5\r\nhelloXYZ"),
        "not valid HTTP/1.1",
        EVENT + b"hello",
    ),
    "a reset mid-stream": Case(
        CHUNKED_HEAD, (chunk(EVENT), 0.05, RESET), "Connection reset by peer", EVENT
    ),
    "a body shorter than its Content-Length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        (b'{"short":', 0.05),
        "closed the connection before the answer's end",
        b'{"short":',
    ),
    "not HTTP at all": Case(b"SSH-2.0-OpenSSH_9.6\r\n", (), "not valid HTTP/1.1"),
    "a head that never ends": Case(
        b"HTTP/1.1 200 OK\r\n", (b"X-Pad: " + b"a" * 20_000 + b"\r\n", 0.05), "head is longer"
    ),
    "no answer at all": Case(b"", (), "closed the connection without answering"),
}


@dataclass
class Upstream:
    served: Served
    case: list[Case]


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, RunningBrokerd]]:
    folder = Path(tmp_path_factory.mktemp("answers"))
    case: list[Case] = []

    def script(_request: str) -> tuple[bytes, Iterable[bytes | float | Reset]]:
        return case[-1].head, case[-1].body

    with hostile_server(folder / "unused.sock", script, tcp=True) as served:
        variables = {"BROKERD_INFERENCE_URL": served.url}
        with brokerd(folder, variables, only=["infer"]) as running:
            yield Upstream(served, case), running


@dataclass
class BoxSaw:
    status: int
    body: bytes
    error: str  # why the body did not end as a whole one ("" when it did)


def ask(infer: Path) -> BoxSaw:
    transport = httpx.HTTPTransport(uds=str(infer))
    with httpx.Client(transport=transport, base_url="http://infer", timeout=10) as box:
        request = box.build_request("POST", "/v1/chat/completions", content=b'{"stream":true}')
        response = box.send(request, stream=True)
        body = b""
        try:
            for piece in response.iter_raw():
                body += piece
        except httpx.HTTPError as exc:
            return BoxSaw(response.status_code, body, str(exc))
        finally:
            response.close()
    return BoxSaw(response.status_code, body, "")


def lines_about_it(running: RunningBrokerd, offset: int) -> list[dict[str, object]]:
    """brokerd's log lines since ``offset``, once the request's own line is among them."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        text = running.log()[offset:]
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        if any("POST /v1/chat/completions ->" in str(line.get("msg")) for line in lines):
            return lines
        assert time.monotonic() < deadline, f"no line for the request:\n{text}"
        time.sleep(0.02)


@pytest.mark.attack(
    attack="A malformed answer from the inference server passes to the box as a whole one",
    input="a chunk cut short, an absurd chunk size, broken chunk framing, a reset mid-stream, a "
    "body short of its Content-Length; before any head: not HTTP, a head without end, nothing",
    expected="the box gets the bytes that came and then a cut (no end of body), or a 502; "
    "brokerd logs one line naming what broke",
)
def test_malformed_answers_are_cut_and_said_in_one_line(
    relayed: tuple[Upstream, RunningBrokerd], observed: Callable[[str], None]
) -> None:
    upstream, running = relayed
    seen: dict[str, str] = {}
    for name, case in CASES.items():
        upstream.case.append(case)
        offset = len(running.log())
        saw = ask(running.socket("infer"))
        lines = lines_about_it(running, offset)
        said = [line for line in lines if line.get("level") in ("warning", "error")]
        assert len(said) == 1, f"{name}: {said}"
        [line] = said
        assert case.cause in str(line["msg"]), f"{name}: {line}"
        assert "\n" not in str(line["msg"]), f"{name}: {line}"
        assert "exc" not in line, f"{name}: a traceback"
        if case.delivered:
            assert (saw.status, saw.body) == (200, case.delivered), name
            assert "peer closed connection without sending complete" in saw.error, name
        else:
            assert saw.status == 502, f"{name}: {saw}"
            assert case.cause in saw.body.decode(), f"{name}: {saw}"
        seen[name] = str(line["msg"])
    observed("; ".join(f"{name}: {said}" for name, said in seen.items()))
