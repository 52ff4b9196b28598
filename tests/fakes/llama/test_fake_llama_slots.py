"""Slots: the silent queue, id wrapping, /slots, context limits, and disconnects."""

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, RunningFake, ScriptedReply, Trigger
from tests.fakes.llama.llama_fake_testkit import (
    MODEL,
    chat_body,
    eventually,
    parse_events,
    serving,
    stream_raw,
    user,
)

pytestmark = pytest.mark.anyio

LONG = ScriptedReply(reasoning=" ".join(["think"] * 200), content="done")


def _raw_request(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _first_bytes_within(uds: Path, body: dict[str, Any], seconds: float) -> bytes:
    """Send a raw request and return whatever arrives within ``seconds`` (b"" for nothing)."""
    async with await anyio.connect_unix(uds) as stream:
        await stream.send(_raw_request(body))
        with anyio.move_on_after(seconds):
            return await stream.receive()
    return b""


async def _slots(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    reply = await client.get("/slots", params={"model": MODEL})
    assert reply.status_code == 200
    slots: list[dict[str, Any]] = reply.json()
    return slots


async def _wait_idle(client: httpx.AsyncClient, slot: int) -> None:
    async def idle() -> bool:
        return not (await _slots(client))[slot]["is_processing"]

    await eventually(idle)


async def _hold_slot_zero(running: RunningFake, client: httpx.AsyncClient) -> httpx.Response:
    """Start a stream on slot 0 that stalls after its first events; returns the open response."""
    running.fake.faults.set(stall_mid_stream=Trigger(after=2, count=1))
    request = client.build_request(
        "POST", "/v1/chat/completions", json=chat_body(user("a"), stream=True, id_slot=0)
    )
    response = await client.send(request, stream=True)
    assert response.status_code == 200
    return response


@pytest.mark.parametrize("wrong_on_purpose", [False, True])
async def test_queued_request_gets_no_bytes_until_the_slot_frees(wrong_on_purpose: bool) -> None:
    fake = FakeLlama()
    fake.faults.set(byte_while_queued=wrong_on_purpose)
    async with serving(fake) as (running, client):
        first = await _hold_slot_zero(running, client)
        assert running.uds is not None
        # id_slot 4 with two slots wraps to slot 0, which is busy.
        queued_body = chat_body(user("b"), stream=True, id_slot=4)
        early = await _first_bytes_within(running.uds, queued_body, 0.3)
        if wrong_on_purpose:
            assert early.startswith(b"HTTP/1.1 200")
            return
        assert early == b""
        slots = await _slots(client)
        assert [s["is_processing"] for s in slots] == [True, False]
        async with anyio.create_task_group() as tg:
            second: list[bytes] = []

            async def run_second() -> None:
                second.append(await stream_raw(client, queued_body))

            tg.start_soon(run_second)
            await anyio.sleep(0.05)
            assert not second
            fake.faults.set(stall_mid_stream=None)
            await first.aread()
            await first.aclose()
        assert parse_events(second[0])[-1] == "[DONE]"
    outcomes = [(r.slot, r.outcome) for r in fake.chat_records()]
    assert outcomes[0] == (0, "ok")
    assert outcomes[-1] == (0, "ok")
    assert (None, "gone-while-queued") in outcomes  # the raw client hung up while queued


async def test_slots_shape_and_busy_flag() -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_slots=3, n_ctx=4096)])
    async with serving(fake) as (running, client):
        fresh = await _slots(client)
        assert fresh[0] == {"id": 0, "n_ctx": 4096, "speculative": False, "is_processing": False}
        first = await _hold_slot_zero(running, client)
        busy = (await _slots(client))[0]
        assert busy["is_processing"] is True
        assert busy["n_prompt_tokens"] > 0
        assert busy["next_token"][0]["has_next_token"] is True
        assert isinstance(busy["id_task"], int)
        assert busy["params"]["stream"] is True
        fake.faults.set(stall_mid_stream=None)
        await first.aread()
        await first.aclose()
        idle = (await _slots(client))[0]
        assert idle["is_processing"] is False
        assert idle["n_prompt_tokens"] > busy["n_prompt_tokens"]  # prompt plus generated


async def test_prompt_at_context_size_is_a_plain_json_400() -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_ctx=32)])
    async with serving(fake) as (_, client):
        reply = await client.post(
            "/v1/chat/completions", json=chat_body(user("word " * 40), stream=True)
        )
    assert reply.status_code == 400
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == 32
    assert error["n_prompt_tokens"] >= 32


async def test_generation_stops_with_length_when_the_slot_is_full() -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_ctx=40)])
    fake.push(LONG)
    async with serving(fake) as (_, client):
        reply = await client.post("/v1/chat/completions", json=chat_body(user("hi")))
    data = reply.json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["total_tokens"] == 40


async def test_disconnect_frees_the_slot_and_keeps_what_was_evaluated() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=100))
    fake.push(LONG)
    async with serving(fake) as (_, client):
        body = chat_body(user("hi"), stream=True, id_slot=1)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            seen = 0
            async for line in response.aiter_lines():
                seen += line.startswith("data:")
                if seen == 5:
                    break
        await _wait_idle(client, 1)
        kept = (await _slots(client))[1]["n_prompt_tokens"]
    record = fake.chat_records()[0]
    assert record.outcome == "disconnected"
    assert record.prompt_n is not None
    assert record.predicted_n is not None
    assert record.prompt_n < kept <= record.prompt_n + record.predicted_n
    assert record.predicted_n < 100


async def test_queued_request_that_hangs_up_never_runs() -> None:
    fake = FakeLlama()
    async with serving(fake) as (running, client):
        first = await _hold_slot_zero(running, client)
        with anyio.move_on_after(0.2):
            await client.post("/v1/chat/completions", json=chat_body(user("b"), id_slot=0))
        fake.faults.set(stall_mid_stream=None)
        await first.aread()
        await first.aclose()
        await _wait_idle(client, 0)
    records = fake.chat_records()
    assert [r.outcome for r in records] == ["ok", "gone-while-queued"]
    assert records[1].slot is None
