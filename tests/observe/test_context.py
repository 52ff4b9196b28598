"""The request id: one per model request and tool call, in the log lines and in the headers."""

from __future__ import annotations

import io
import json
import logging

import httpx
import pytest

from loopcommon.context import REQUEST_HEADER, SESSION_HEADER, ContextFields
from loopcommon.logsetup import JsonLinesFormatter
from loopd.requestscope import (
    broker_hooks,
    current,
    inference_hooks,
    request_scope,
    session_scope,
)

pytestmark = pytest.mark.anyio


def json_logger(name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLinesFormatter())
    handler.addFilter(ContextFields())
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_lines_in_a_scope_carry_its_session_and_request_id() -> None:
    logger, out = json_logger("tests.observe.scope")
    logger.info("outside")
    with session_scope("mm:abc"):
        logger.info("in the turn")
        with request_scope() as first:
            logger.info("in a request", extra={"fields": {"slot": 0}})
        with request_scope() as second:
            logger.info("another", extra={"fields": {"session": "its own"}})
        logger.info("between")
    outside, turn, request, other, between = lines(out)
    assert "session" not in outside
    assert "request_id" not in outside
    assert turn["session"] == "mm:abc"
    assert "request_id" not in turn
    assert request["request_id"] == first.request_id
    assert request["session"] == "mm:abc"
    assert request["slot"] == 0
    assert other["request_id"] == second.request_id != first.request_id
    assert other["session"] == "its own"  # the line's own field wins
    assert "request_id" not in between
    assert current() is None


def test_ids_are_distinct() -> None:
    ids = set()
    for _ in range(200):
        with request_scope("s") as scope:
            ids.add(scope.request_id)
    assert len(ids) == 200


async def test_requests_in_a_scope_carry_the_headers() -> None:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={"ok": True})

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(answer), event_hooks=inference_hooks()
    ) as client:
        await client.get("http://x/health")
        with session_scope("mm:abc"):
            await client.get("http://x/tokenize")
            with request_scope() as scope:
                await client.get("http://x/slots")
        with request_scope("naïve"):  # not ASCII: the header would be refused; it is left out
            await client.get("http://x/slots")
    none, turn, request, foreign = seen
    assert REQUEST_HEADER not in none
    assert SESSION_HEADER not in none
    assert turn[SESSION_HEADER] == "mm:abc"
    assert REQUEST_HEADER not in turn
    assert request[REQUEST_HEADER] == scope.request_id
    assert request[SESSION_HEADER] == "mm:abc"
    assert SESSION_HEADER not in foreign
    assert REQUEST_HEADER in foreign
    assert scope.sent


@pytest.mark.parametrize(
    ("response", "http_status", "answer_status"),
    [
        (httpx.Response(200, json={"result": "r", "status": "timeout"}), 200, "timeout"),
        (httpx.Response(200, json={"result": "r", "names": []}), 200, None),
        (httpx.Response(200, content=b"not json"), 200, None),
        (httpx.Response(409, json={"error": "conflict"}), 409, None),
    ],
)
async def test_the_broker_hook_notes_brokerds_answer(
    response: httpx.Response, http_status: int, answer_status: str | None
) -> None:
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: response), event_hooks=broker_hooks()
    ) as client:
        with request_scope("s") as scope:
            got = await client.post("http://x/v1/call_tool", json={})
    assert got.content == response.content  # the client still reads the whole body
    assert (scope.http_status, scope.answer_status) == (http_status, answer_status)
