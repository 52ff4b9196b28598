"""The naive client renders the way common clients do, which is what loses the cache."""

import json
from datetime import datetime

import httpx
import pytest

from bench.errors import BenchError
from bench.naive import Mistake, NaiveHarness, parse_assistant, render, request_clock
from bench.script import RECORDED_TOOL_CALL, TOOLS

STREAMED = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "Read it first.",
    "tool_calls": [
        {
            "id": "abc",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path":"a.txt","n":{"x":1}}'},
        }
    ],
}


def harness(
    http: httpx.AsyncClient, clock: datetime = datetime(2026, 3, 1, 9, 30, 5)
) -> NaiveHarness:
    return NaiveHarness(
        http,
        model="m",
        system_text="Be brief.",
        tools=TOOLS,
        sampling={"temperature": 0.0},
        clock=lambda: clock,
    )


def test_reasoning_is_dropped_and_arguments_are_re_dumped() -> None:
    wire = render(parse_assistant(STREAMED))
    assert "reasoning_content" not in wire
    arguments = wire["tool_calls"][0]["function"]["arguments"]
    assert arguments == '{"path": "a.txt", "n": {"x": 1}}'
    assert arguments != STREAMED["tool_calls"][0]["function"]["arguments"]  # type: ignore[index]


def test_arguments_that_are_not_json_are_kept_as_raw() -> None:
    message = json.loads(RECORDED_TOOL_CALL)
    message["tool_calls"][0]["function"]["arguments"] = '{"path": "a'
    parsed = parse_assistant(message)
    assert parsed.tool_calls[0].arguments == {"raw": '{"path": "a'}


def test_the_system_line_carries_the_current_time() -> None:
    naive = harness(httpx.AsyncClient())
    naive.add_user("hi")
    messages = naive.messages()
    assert messages[0] == {
        "role": "system",
        "content": "Be brief.\nCurrent time: 2026-03-01 09:30:05",
    }
    assert messages[1] == {"role": "user", "content": "hi"}


def test_every_request_rebuilds_the_whole_conversation() -> None:
    naive = harness(httpx.AsyncClient())
    naive.add_user("read a.txt")
    naive.add_assistant(STREAMED)
    naive.add_tool_result("abc", "hello")
    body = naive.body(max_tokens=8)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][3] == {"role": "tool", "content": "hello", "tool_call_id": "abc"}
    assert body["tools"] == TOOLS
    assert body["max_tokens"] == 8
    assert body["temperature"] == 0.0
    assert "id_slot" not in body  # common clients let the server pick a slot


@pytest.mark.anyio
async def test_complete_posts_json_and_returns_the_reply_and_timings() -> None:
    seen: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "choices": [
                    {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "timings": {"cache_n": 3, "prompt_n": 40},
            },
        )

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(answer), base_url="http://llama"
    ) as http:
        naive = harness(http)
        naive.add_user("hi")
        reply = await naive.complete(max_tokens=4)
    assert reply.message == {"role": "assistant", "content": "ok"}
    assert reply.timings == {"cache_n": 3, "prompt_n": 40}
    assert reply.finish_reason == "stop"
    assert seen[0]["model"] == "m"


@pytest.mark.anyio
async def test_a_refused_request_is_a_bench_error_with_the_status() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text="bad request")

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(refuse), base_url="http://llama"
    ) as http:
        with pytest.raises(BenchError, match="400"):
            await harness(http).complete(max_tokens=4)


def test_each_mistake_can_be_made_alone() -> None:
    parsed = parse_assistant(STREAMED)
    received = STREAMED["tool_calls"][0]["function"]["arguments"]  # type: ignore[index]
    only_reasoning = render(parsed, frozenset({Mistake.REASONING_DROPPED}))
    assert "reasoning_content" not in only_reasoning
    assert only_reasoning["tool_calls"][0]["function"]["arguments"] == received
    only_arguments = render(parsed, frozenset({Mistake.ARGUMENTS_REDUMPED}))
    assert only_arguments["reasoning_content"] == "Read it first."
    assert only_arguments["tool_calls"][0]["function"]["arguments"] != received


def test_without_the_time_mistake_the_system_line_is_the_same_every_request() -> None:
    naive = NaiveHarness(
        httpx.AsyncClient(),
        model="m",
        system_text="Be brief.",
        tools=TOOLS,
        sampling={},
        mistakes=frozenset({Mistake.REASONING_DROPPED}),
    )
    assert naive.system_line() == naive.system_line() == "Be brief."


def test_the_time_line_moves_on_by_a_minute_each_request_whatever_the_servers_speed() -> None:
    naive = NaiveHarness(
        httpx.AsyncClient(), model="m", system_text="Be brief.", tools=TOOLS, sampling={}
    )
    first, second = naive.system_line(), naive.system_line()
    assert [first[-8:], second[-8:]] == ["09:00:00", "09:01:00"]
    clock = request_clock(datetime(2026, 3, 1, 23, 59, 0))
    assert [clock(), clock()] == [datetime(2026, 3, 1, 23, 59), datetime(2026, 3, 2, 0, 0)]


def test_arguments_the_server_could_not_parse_are_re_dumped_even_when_kept() -> None:
    message = json.loads(RECORDED_TOOL_CALL)
    message["tool_calls"][0]["function"]["arguments"] = '{"path": "a'
    wire = render(parse_assistant(message), frozenset({Mistake.REASONING_DROPPED}))
    assert json.loads(wire["tool_calls"][0]["function"]["arguments"]) == {"raw": '{"path": "a'}
