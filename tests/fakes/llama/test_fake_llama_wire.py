"""Wire format of the fake's chat completions: chunks, ids, deltas, finish, usage, timings."""

import re

import anyio
import pytest

from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply, ScriptedToolCall
from tests.fakes.llama.llama_fake_testkit import chat_body, parse_events, serving, stream_raw, user

pytestmark = pytest.mark.anyio

CHUNK_KEYS = ["choices", "created", "id", "model", "system_fingerprint", "object"]
ARGS = '{"path": "a \\"b\\".txt", "n": 3}'


def _reply() -> ScriptedReply:
    return ScriptedReply(
        reasoning="Need the file.",
        content="Reading it.",
        tool_calls=(ScriptedToolCall("read_file", ARGS),),
    )


@pytest.mark.parametrize("transport", ["uds", "tcp"])
async def test_stream_wire_format(transport: str) -> None:
    fake = FakeLlama()
    fake.push(_reply())
    async with serving(fake, transport) as (_, client):
        body = chat_body(user("read a file"), stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            raw = await response.aread()
            headers = response.headers
    assert headers["content-type"] == "text/event-stream"
    assert headers["server"] == "llama.cpp"
    events = parse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    assert re.fullmatch(r"chatcmpl-[0-9A-Za-z]{32}", ids.pop())
    for c in chunks:
        assert list(c)[:6] == CHUNK_KEYS
        assert c["object"] == "chat.completion.chunk"
        assert c["system_fingerprint"].startswith("b11434-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-2]]
    assert all(d and all(v != "" for v in d.values()) for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert (reasoning, content) == ("Need the file.", "Reading it.")
    first, rest = calls[0], calls[1:]
    assert list(first) == ["index", "id", "type", "function"]
    assert first["type"] == "function"
    assert first["function"]["name"] == "read_file"
    assert re.fullmatch(r"[0-9A-Za-z]{32}", first["id"])
    assert all(
        list(c) == ["index", "function"] and list(c["function"]) == ["arguments"] for c in rest
    )
    assert "".join(c["function"]["arguments"] for c in calls) == ARGS
    finish, usage_chunk = chunks[-2], chunks[-1]
    assert finish["choices"] == [{"finish_reason": "tool_calls", "index": 0, "delta": {}}]
    assert "timings" not in finish
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage_chunk["timings"]["predicted_n"] == usage["completion_tokens"]


async def test_finish_chunk_carries_timings_without_usage() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        events = parse_events(await stream_raw(client, chat_body(user("hi"), stream=True)))
    finish = events[-2]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert set(finish["timings"]) >= {"cache_n", "prompt_n", "predicted_n", "prompt_ms"}


async def test_non_stream_response_shape() -> None:
    fake = FakeLlama()
    fake.push(_reply(), ScriptedReply(content="Plain."))
    async with serving(fake) as (_, client):
        first = (await client.post("/v1/chat/completions", json=chat_body(user("x")))).json()
        second = (await client.post("/chat/completions", json=chat_body(user("y")))).json()
    assert list(first) == [
        "choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"
    ]  # fmt: skip
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Reading it."
    assert choice["message"]["reasoning_content"] == "Need the file."
    call = choice["message"]["tool_calls"][0]
    assert list(call) == ["type", "function", "id"]
    assert call["function"] == {"name": "read_file", "arguments": ARGS}
    assert second["choices"][0]["message"] == {"role": "assistant", "content": "Plain."}


async def test_timings_per_token_and_progress() -> None:
    fake = FakeLlama(pace=Pace(batch_size=4))
    async with serving(fake) as (_, client):
        body = chat_body(
            user("one two three four five six seven"),
            stream=True,
            return_progress=True,
            timings_per_token=True,
        )
        events = parse_events(await stream_raw(client, body))[:-1]
    progress = [e for e in events if "prompt_progress" in e]
    assert len(progress) >= 3
    first, last = progress[0]["prompt_progress"], progress[-1]["prompt_progress"]
    assert first["processed"] == first["cache"] == 0
    assert last["processed"] == last["total"]
    assert all(e["choices"][0]["delta"] == {"role": "assistant", "content": None} for e in progress)
    assert progress[0]["timings"]["prompt_n"] == 0
    steps = [e["prompt_progress"]["processed"] for e in progress]
    assert steps == sorted(steps)
    assert all("timings" in e for e in events)
    predicted = [e["timings"]["predicted_n"] for e in events if "prompt_progress" not in e]
    assert predicted == sorted(predicted)
    assert predicted[-1] > 1


async def test_ping_after_silence() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=4), sse_ping_interval=0.05)
    fake.push(ScriptedReply(content="a b"))
    async with serving(fake) as (_, client):
        raw = await stream_raw(client, chat_body(user("hi"), stream=True))
    assert b":\n\n" in raw
    assert parse_events(raw)[-1] == "[DONE]"


async def test_request_ping_interval_zero_disables_pings() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=20), sse_ping_interval=0.01)
    fake.push(ScriptedReply(content="a b c"))
    async with serving(fake) as (_, client):
        raw = await stream_raw(client, chat_body(user("hi"), stream=True, sse_ping_interval=0))
    assert b":\n\n" not in raw


async def test_max_tokens_finishes_with_length() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        reply = await client.post("/v1/chat/completions", json=chat_body(user("hi"), max_tokens=3))
    data = reply.json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3


async def test_single_model_mode_ignores_model_field() -> None:
    fake = FakeLlama([ModelSpec("solo")], router=False)
    async with serving(fake) as (_, client):
        reply = await client.post(
            "/v1/chat/completions", json={"model": "anything", "messages": [user("hi")]}
        )
        slots = await client.get("/slots")
    assert reply.json()["model"] == "solo"
    assert slots.status_code == 200


async def test_serving_twice_in_one_test_frees_the_port() -> None:
    fake = FakeLlama()
    with anyio.fail_after(5):
        async with serving(fake, "tcp") as (running, client):
            assert (await client.get("/health")).json() == {"status": "ok"}
            url = running.base_url
    assert url.startswith("http://127.0.0.1:")
