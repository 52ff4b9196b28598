"""Every fault switch, observed from a client (in-process and over ``/_fake/faults``)."""

from typing import Any

import anyio
import httpx
import pytest

from loopd_dev.fakes.llama import FakeLlama, ScriptedReply, Trigger
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

STREAM = chat_body(user("hello there"), stream=True)


async def _nothing_within(coro: Any, seconds: float = 0.2) -> bool:
    """True when ``coro`` did not finish within ``seconds``."""
    with anyio.move_on_after(seconds) as scope:
        await coro
    return scope.cancelled_caught


async def test_loading_is_503_everywhere_until_cleared() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        await client.post("/_fake/faults", json={"loading": True})
        for reply in (
            await client.get("/health"),
            await client.get("/props"),
            await client.post("/v1/chat/completions", json=STREAM),
        ):
            assert reply.status_code == 503
            assert reply.json()["error"] == {
                "code": 503,
                "message": "Loading model",
                "type": "unavailable_error",
            }
        await client.post("/_fake/faults", json={"loading": False})
        assert (await client.get("/health")).status_code == 200


async def test_sleeping_blocks_work_but_not_health_and_props() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(sleeping=True)
        assert (await client.get("/health")).status_code == 200
        props = (await client.get("/props", params={"model": MODEL})).json()
        assert props["is_sleeping"] is True
        assert await _nothing_within(client.get("/slots", params={"model": MODEL}))
        assert await _nothing_within(client.post("/v1/chat/completions", json=STREAM))
        fake.faults.set(sleeping=False)
        assert (await client.get("/slots", params={"model": MODEL})).status_code == 200


async def test_hang_all_answers_nothing_at_all() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(hang_all=True)
        assert await _nothing_within(client.get("/health"))
        fake.faults.set(hang_all=False)
        assert (await client.get("/health")).status_code == 200


async def test_stall_before_first_byte_holds_the_slot() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(stall_before_first_byte=True)
        async with anyio.create_task_group() as tg:
            result: list[bytes] = []

            async def run() -> None:
                result.append(
                    await stream_raw(client, chat_body(user("x"), stream=True, id_slot=0))
                )

            tg.start_soon(run)

            async def slot_busy() -> bool:
                slots = (await client.get("/slots", params={"model": MODEL})).json()
                return bool(slots[0]["is_processing"])

            await eventually(slot_busy)
            fake.faults.set(slots_hang=True)
            assert await _nothing_within(client.get("/slots", params={"model": MODEL}))
            assert not result
            fake.faults.clear()
        assert parse_events(result[0])[-1] == "[DONE]"


async def test_stall_mid_stream_is_silent_until_cleared() -> None:
    fake = FakeLlama(sse_ping_interval=0.01)
    received = bytearray()

    async def read_all(response: httpx.Response) -> None:
        async for data in response.aiter_bytes():
            received.extend(data)

    async with serving(fake) as (_, client):
        fake.faults.set(stall_mid_stream={"after": 3})
        async with (
            client.stream("POST", "/v1/chat/completions", json=STREAM) as response,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(read_all, response)

            async def three_events() -> bool:
                return received.count(b"data:") >= 3

            await eventually(three_events)
            seen = bytes(received)
            await anyio.sleep(0.2)
            assert bytes(received) == seen  # no data and no pings while stalled
            fake.faults.set(stall_mid_stream=None)
    assert parse_events(bytes(received))[-1] == "[DONE]"


async def test_drop_mid_stream_closes_the_connection() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(drop_mid_stream=Trigger(after=2, count=1))
        with pytest.raises(httpx.RemoteProtocolError):
            await stream_raw(client, STREAM)
        assert parse_events(await stream_raw(client, STREAM))[-1] == "[DONE]"  # count used up
    assert [r.outcome for r in fake.chat_records()] == ["dropped", "ok"]


async def test_malformed_chunk_then_the_stream_goes_on() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(malformed_chunk={"after": 1})
        raw = await stream_raw(client, STREAM)
    blocks = raw.decode().split("\n\n")
    assert blocks[1].startswith('data: {"choices":[{')
    assert blocks[1].endswith('"content":')
    assert blocks[-2] == "data: [DONE]"


async def test_error_event_mid_stream_has_no_done() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        fake.faults.set(error_mid_stream={"after": 2})
        events = parse_events(await stream_raw(client, STREAM))
    assert events[-1]["error"]["type"] == "server_error"
    assert "[DONE]" not in events
    assert len(events) == 3


async def test_http_500_once() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        await client.post("/_fake/faults", json={"http_500": {"count": 1}})
        first = await client.post("/v1/chat/completions", json=STREAM)
        second = await client.post("/v1/chat/completions", json=STREAM)
    assert first.status_code == 500
    assert first.json()["error"]["type"] == "server_error"
    assert second.status_code == 200


async def test_bad_fault_names_are_refused() -> None:
    async with serving(FakeLlama()) as (_, client):
        reply = await client.post("/_fake/faults", json={"explode": True})
    assert reply.status_code == 400
    assert "explode" in reply.json()["error"]["message"]


async def test_killed_server_refuses_connections() -> None:
    fake = FakeLlama()
    async with serving(fake, "tcp") as (running, client):
        assert (await client.get("/health")).status_code == 200
        await client.post("/_fake/die")
        with anyio.fail_after(2):
            await running.wait_dead()
        with pytest.raises(httpx.TransportError):
            async with httpx.AsyncClient(base_url=running.base_url) as fresh:
                await fresh.get("/health")


async def test_script_over_http_and_request_log() -> None:
    fake = FakeLlama()
    async with serving(fake) as (_, client):
        pushed = await client.post(
            "/_fake/script",
            json={"model": MODEL, "replies": [{"content": "Scripted!", "finish_reason": "stop"}]},
        )
        reply = await client.post("/v1/chat/completions", json=chat_body(user("x")))
        log = (await client.get("/_fake/log")).json()
    assert pushed.json() == {"pending": 1}
    assert reply.json()["choices"][0]["message"]["content"] == "Scripted!"
    chat = next(e for e in log if e["path"] == "/v1/chat/completions")
    assert chat["body"]["messages"] == [user("x")]
    assert chat["outcome"] == "ok"
    assert chat["prompt_n"] > 0
    assert chat["status"] == 200


def test_scripted_reply_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown"):
        ScriptedReply.from_json({"contnet": "typo"})
