"""Requests the server places, and a shared pool, on the fake llama-server
(docs/production-shape.md, "What loopd's engine must change", items 1, 2 and 5): every request of
an unpinned session goes out with ``id_slot`` -1, a request waits as queued only while every slot
is busy, a pool-full failure is sent again once the other slots are idle, and on a shared pool a
request waits while it would not fit beside the busy slots."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.config import load_settings
from loopd.contextwindow.budget import ServerBudget
from loopd.contextwindow.compaction import Compactor
from loopd.contextwindow.pool import held_by_busy_slots
from loopd.engine.client import ChatStream, InferenceClient
from loopd.engine.outcome import Failure, RequestResult, retry_safe
from loopd.engine.progress import Phase, Status
from loopd.engine.request import ANY_SLOT
from loopd.engine.stream import run_request
from loopd.errors import ServerRejected
from loopd.sessionlog.records import RequestKind, fresh_external_key
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply, ScriptedToolCall
from tests.engine.engine_support import (
    FAST,
    MODEL,
    Served,
    eventually,
    make_turn,
    one_server,
    open_log,
    records,
    say,
    served,
    user_body,
)

pytestmark = pytest.mark.anyio

LIMITS = replace(FAST, first_byte_s=10)


def _id_slots(server: Served) -> list[int]:
    return [record.body["id_slot"] for record in server.fake.chat_records()]


def _stalled(server: Served, slot: int) -> bool:
    return bool(server.fake.model().slots.slots[slot].is_processing)


# -- every request of an unpinned session goes out with id_slot -1 -----------------------------


def _runtime(server: Served, state: Path, **overrides: Any) -> Runtime:
    values: dict[str, Any] = {
        "infer_url": server.url,
        "model": MODEL,
        "state_dir": state,
        "slots": (1,),
        "max_tokens": 64,
        "think_cap": 0,
        "compact_at": 0.5,
        "summary_max_tokens": 64,
    }
    values.update(overrides)
    return Runtime.open(load_settings(**values))


async def _say(runtime: Runtime, name: str, text: str) -> None:
    session = runtime.ensure_session(name)
    await runtime.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.failure is None, outcome.failure


@pytest.mark.parametrize(("pin", "id_slot"), [("no", ANY_SLOT), ("yes", 1)])
async def test_turns_tool_rounds_compaction_and_prewarm_follow_the_pinning(
    tmp_path: Path, pin: str, id_slot: int
) -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=2048)])
    fake.push(
        ScriptedReply(tool_calls=(ScriptedToolCall("read_file", '{"path": "a.txt"}'),)),
        ScriptedReply(content="It says hello."),
    )
    async with served(fake) as server:
        runtime = _runtime(server, tmp_path, pin_slots=pin, prewarm=True)
        try:
            await _say(runtime, "s", "read a.txt")  # a turn and its tool follow-up
            while len(runtime.log.epochs("s")) < 2:  # compaction
                await _say(runtime, "s", "tell me more " * 60)
            prewarm = await runtime.prewarm(runtime.log.get_session("s"))
            kinds = {r.record.kind for r in runtime.log.requests("s")}
            lanes = {r.record.slot for r in runtime.log.requests("s")}
        finally:
            await runtime.aclose()
    assert prewarm.record is not None, prewarm
    assert {RequestKind.TURN, RequestKind.TOOL_FOLLOWUP, RequestKind.COMPACTION} <= kinds
    assert RequestKind.PREWARM in kinds
    assert set(_id_slots(server)) == {id_slot}
    assert lanes == {1}, "the session's recorded slot is its lane either way"


async def test_without_a_self_test_or_a_record_requests_are_not_pinned(tmp_path: Path) -> None:
    async with served() as server:
        runtime = _runtime(server, tmp_path)
        try:
            await _say(runtime, "s", "hello")
            known = one_server(runtime).known
        finally:
            await runtime.aclose()
    assert not known.pinning.pinned
    assert _id_slots(server) == [ANY_SLOT]


# -- queued only while every slot is busy -------------------------------------------------------


async def test_a_request_the_server_places_is_queued_only_while_every_slot_is_busy() -> None:
    seen: list[Status] = []
    blockers: list[RequestResult] = []
    async with served() as server, anyio.create_task_group() as tg:
        server.fake.faults.set(stall_before_first_byte=True)

        async def block(slot: int) -> None:
            blockers.append(
                await run_request(
                    server.client, user_body(f"b{slot}", id_slot=slot), slot=slot, limits=LIMITS
                )
            )

        for slot in (0, 1):
            tg.start_soon(block, slot)
            await eventually(lambda slot=slot: _stalled(server, slot))  # type: ignore[misc]

        async def clear_when_queued() -> None:
            await eventually(lambda: Phase.QUEUED in {s.phase for s in seen})
            await eventually(lambda: server.fake.model().slots.queued == 1)
            server.fake.faults.set(stall_before_first_byte=False)

        tg.start_soon(clear_when_queued)
        body = user_body("mine", id_slot=ANY_SLOT)
        mine = await run_request(
            server.client, body, slot=ANY_SLOT, limits=LIMITS, report=seen.append
        )
    assert mine.complete, mine.detail
    assert mine.wait.parts()["server_queue_ms"] > 0
    assert all(b.complete for b in blockers)


# -- a full pool --------------------------------------------------------------------------------


class PoolFullOnce(InferenceClient):
    """The server's answer when the requests running at once outgrew the pool, for the first
    request; the next ones reach the fake, noting whether any slot was busy when they did."""

    def __init__(self, server: Served) -> None:
        super().__init__(server.url, MODEL, connect_s=2.0)
        self.fake = server.fake
        self.sent = 0
        self.busy_when_sent: list[bool] = []

    @asynccontextmanager
    async def stream_chat(self, body: bytes) -> AsyncIterator[ChatStream]:
        self.sent += 1
        if self.sent == 1:
            raise ServerRejected(self.url, 500, "Context size has been exceeded.", "server_error")
        self.busy_when_sent.append(any(s.is_processing for s in self.fake.model().slots.slots))
        async with super().stream_chat(body) as answer:
            yield answer


async def test_a_full_pool_is_sent_again_once_the_other_slots_are_idle(tmp_path: Path) -> None:
    seen: list[Status] = []
    log = open_log(tmp_path)
    say(log, "hello")
    async with served() as server, anyio.create_task_group() as tg:
        # Another client's request holds slot 1 until the test lets it go.
        server.fake.faults.set(stall_before_first_byte=True)
        tg.start_soon(
            lambda: run_request(server.client, user_body("b", id_slot=1), slot=1, limits=LIMITS)
        )
        await eventually(lambda: _stalled(server, 1))

        async def free_when_queued() -> None:
            await eventually(lambda: Phase.QUEUED in {s.phase for s in seen})
            server.fake.faults.set(stall_before_first_byte=False)

        tg.start_soon(free_when_queued)
        client = PoolFullOnce(server)
        try:
            turn = make_turn(
                server, log, client=client, statuses=seen, limits=replace(LIMITS, attempts=2)
            )
            outcome = await turn.run()
        finally:
            await client.aclose()
    assert outcome.answer, outcome.failure
    assert client.busy_when_sent == [False], "sent again only once no slot was busy"
    first, second = records(log)
    assert first.record.perf.outcome == "broken"
    assert first.record.perf.extra["failure"] == Failure.POOL_FULL
    assert second.record.perf.outcome == "complete"
    assert len(log.epochs("thread-1")) == 1, "a full pool is never a reason to compact"


# -- room beside the busy slots -----------------------------------------------------------------


async def test_on_a_shared_pool_a_request_waits_while_it_does_not_fit_beside_the_busy_slots(
    tmp_path: Path,
) -> None:
    # Another client's long prompt, read slowly on slot 1: most of the pool's 4,096 tokens.
    fake = FakeLlama(
        [ModelSpec(MODEL, n_slots=2, n_ctx=4096)],
        pace=Pace(prompt_tokens_per_second=2000, batch_size=100),
    )
    seen: list[Status] = []
    done: list[str] = []
    log = open_log(tmp_path)
    say(log, "hello")
    async with served(fake) as server, anyio.create_task_group() as tg:

        async def other_client() -> None:
            long_prompt = user_body(" ".join(["word"] * 3500), id_slot=1)
            result = await run_request(server.client, long_prompt, slot=1, limits=LIMITS)
            assert result.complete, result.detail
            done.append("other client")

        tg.start_soon(other_client)
        await eventually(lambda: _stalled(server, 1))
        held = held_by_busy_slots(await server.client.slots())
        gate = Compactor(ServerBudget(server.client, shared=True, requests=2))
        turn = make_turn(server, log, statuses=seen, gate=gate, limits=LIMITS)
        outcome = await turn.run()
        done.append("turn")
    assert held >= 3500, "the fake lists the busy slot's prompt"
    assert outcome.answer, outcome.failure
    assert Phase.QUEUED in {s.phase for s in seen}
    assert done == ["other client", "turn"], "slot 0 was free: only the pool made it wait"
    assert len(log.epochs("thread-1")) == 1, "waiting for room is not compacting"


async def test_on_a_shared_pool_the_budget_plans_with_a_share_of_it() -> None:
    async with served(FakeLlama([ModelSpec(MODEL, n_ctx=16384)])) as server:
        alone = ServerBudget(server.client)
        shared = ServerBudget(server.client, shared=True, requests=2)
        assert (await alone.n_ctx(), await alone.pool()) == (16384, 16384)
        assert (await shared.n_ctx(), await shared.pool()) == (8192, 16384)


class _Stream:
    """A streamed answer's chunks, as ``ChatStream.receive`` gives them."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def receive(self) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)


class _PoolFullMidStream(InferenceClient):
    """The server's error event when the pool ran out during generation (build 11434 sends it
    to every request running), after some of the answer."""

    @asynccontextmanager
    async def stream_chat(self, body: bytes) -> AsyncIterator[Any]:
        delta = {
            "choices": [{"finish_reason": None, "index": 0, "delta": {"content": "Part of"}}],
            "created": 1,
            "id": "chatcmpl-1",
            "model": MODEL,
            "object": "chat.completion.chunk",
        }
        error = {"error": {"code": 500, "message": "Context size has been exceeded."}}
        yield _Stream(
            [f"data: {json.dumps(delta)}\n\n".encode(), f"data: {json.dumps(error)}\n\n".encode()]
        )


async def test_a_full_pool_mid_stream_is_a_pool_full_failure_safe_to_send_again() -> None:
    async with _PoolFullMidStream("unix:/nonexistent/llama.sock", MODEL) as client:
        result = await run_request(client, user_body("hello"), slot=ANY_SLOT, limits=LIMITS)
    assert result.failure is Failure.POOL_FULL
    assert result.output_seen
    assert "Context size has been exceeded." in result.detail
    assert retry_safe(result)
