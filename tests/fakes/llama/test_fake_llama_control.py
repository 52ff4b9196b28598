"""``POST /v1/chat/completions/control``: every row of the reference table."""

from typing import Any

import anyio
import httpx
import pytest

from loopd_dev.fakes.llama import FakeLlama, Pace, ScriptedReply
from tests.fakes.llama.llama_fake_testkit import (
    MODEL,
    assistant_from_events,
    chat_body,
    eventually,
    parse_events,
    serving,
    user,
)

pytestmark = pytest.mark.anyio

THINKER = ScriptedReply(reasoning=" ".join(["hmm"] * 300), content="The answer.")


async def _control(client: httpx.AsyncClient, body: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions/control", json=body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": MODEL, "action": "reasoning_end"}, "missing completion id"),
        ({"model": MODEL, "id": "", "action": "reasoning_end"}, "missing completion id"),
        ({"model": MODEL, "id": "chatcmpl-x", "action": "stop"}, "unknown control action"),
        ({"id": "chatcmpl-x", "action": "reasoning_end"}, "model name is missing from the request"),
    ],
)
async def test_control_400s(body: dict[str, Any], message: str) -> None:
    async with serving(FakeLlama()) as (_, client):
        reply = await _control(client, body)
    assert reply.status_code == 400
    assert reply.json()["error"] == {
        "code": 400,
        "message": message,
        "type": "invalid_request_error",
    }


async def test_control_body_not_json_is_400() -> None:
    async with serving(FakeLlama()) as (_, client):
        reply = await client.post("/v1/chat/completions/control", content=b"{nope")
    assert reply.status_code == 400


async def test_unknown_and_finished_ids_are_200_without_success() -> None:
    async with serving(FakeLlama()) as (_, client):
        done = await client.post("/v1/chat/completions", json=chat_body(user("hi")))
        for completion_id in ("chatcmpl-unknown", done.json()["id"]):
            reply = await _control(
                client, {"model": MODEL, "id": completion_id, "action": "reasoning_end"}
            )
            assert reply.status_code == 200
            assert reply.json() == {"success": False, "message": "no active completion for this id"}


async def _while_thinking(armed: bool) -> tuple[dict[str, Any], list[Any]]:
    """Stream a long thought, call control after a few reasoning chunks; returns the reply."""
    fake = FakeLlama(pace=Pace(tokens_per_second=200))
    fake.push(THINKER)
    events: list[Any] = []
    async with serving(fake) as (_, client):
        body = chat_body(user("think"), stream=True, reasoning_control=armed)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            buffer = ""
            answer: dict[str, Any] = {}
            async for text in response.aiter_text():
                buffer += text
                events = parse_events(buffer.encode())
                reasoning_chunks = sum(
                    "reasoning_content" in e["choices"][0]["delta"]
                    for e in events
                    if e != "[DONE]" and e["choices"]
                )
                if reasoning_chunks >= 5 and not answer:
                    control = {"model": MODEL, "id": events[0]["id"], "action": "reasoning_end"}
                    answer = (await _control(client, control)).json()
                    if not armed:
                        break
    return answer, events


async def test_armed_control_ends_reasoning_and_the_model_answers() -> None:
    with anyio.fail_after(10):
        answer, events = await _while_thinking(armed=True)
    assert answer == {"success": True}
    message = assistant_from_events(events)
    assert message["content"] == "The answer."
    assert len(message["reasoning_content"].split()) < 20  # ended within a couple of tokens
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_unarmed_control_is_refused() -> None:
    answer, _ = await _while_thinking(armed=False)
    assert answer == {
        "success": False,
        "message": "reasoning control not enabled for this completion",
    }


async def test_queued_completion_is_not_active() -> None:
    fake = FakeLlama()
    fake.faults.set(stall_before_first_byte=True)
    async with serving(fake) as (_, client), anyio.create_task_group() as tg:

        async def post() -> None:
            await client.post("/v1/chat/completions", json=chat_body(user("x"), id_slot=0))

        for _ in range(2):
            tg.start_soon(post)

        async def one_queued() -> bool:
            return len(fake.chat_records()) == 2 and fake.model().slots.queued == 1

        await eventually(one_queued)
        queued = next(r for r in fake.chat_records() if r.slot is None)
        reply = await _control(
            client, {"model": MODEL, "id": queued.completion_id, "action": "reasoning_end"}
        )
        assert reply.json()["success"] is False
        fake.faults.set(stall_before_first_byte=False)
