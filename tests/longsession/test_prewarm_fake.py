"""Prewarm on the fake llama-server: it reads an idle slot's prompt, and gives way at once."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from loopd.prewarm.prewarmer import Prewarmer, PrewarmOutcome, PrewarmResult, final_timings
from loopd.scheduler import Scheduler
from loopd.sessionlog.records import RequestKind
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace
from tests.engine.engine_support import (
    MODEL,
    SESSION,
    SLOT,
    Served,
    eventually,
    make_turn,
    open_log,
    records,
    say,
    served,
    settings,
    user_body,
)


def _no_host_cache() -> FakeLlama:
    # Without the host prompt cache another prompt on the slot really evicts the session's.
    return FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=4096, host_cache_tokens=0)])


async def _evict(server: Served) -> None:
    async with server.client.stream_chat(user_body("an unrelated prompt from someone else")) as r:
        await r.aread()


async def _one_turn(server: Served, log: SessionLog) -> None:
    say(log, "hello there, how are you today?")
    outcome = await make_turn(server, log).run()
    assert outcome.failure is None


@pytest.mark.anyio
async def test_a_prewarmed_session_reads_only_its_new_tokens(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    async with served(_no_host_cache()) as server:
        await _one_turn(server, log)
        await _evict(server)
        prewarmer = Prewarmer(server.client, log, Scheduler(), enabled=True)
        result = await prewarmer.prewarm(log.get_session(SESSION), settings())
        assert result.outcome is PrewarmOutcome.DONE, result.detail
        say(log, "and one more thing")
        await make_turn(server, log).run()
    prewarm, turn = (r.record for r in records(log)[-2:])
    assert prewarm.kind is RequestKind.PREWARM
    assert prewarm.perf.outcome == "complete"
    assert prewarm.perf.prompt_n is not None
    assert prewarm.perf.prompt_n > 20  # it re-read the evicted prompt
    assert turn.perf.cache_loss == 0
    assert turn.perf.prompt_n is not None
    assert turn.perf.prompt_n < 20  # and the turn read only its own message
    assert verify(log) == []


@pytest.mark.anyio
async def test_without_prewarm_the_evicted_session_reads_everything(tmp_path: Path) -> None:
    """The control for the test above: the eviction is real."""
    log = open_log(tmp_path)
    async with served(_no_host_cache()) as server:
        await _one_turn(server, log)
        await _evict(server)
        say(log, "and one more thing")
        await make_turn(server, log).run()
    turn = records(log)[-1].record
    assert turn.perf.prompt_n is not None
    assert turn.perf.prompt_n > 20


@pytest.mark.anyio
async def test_prewarm_is_skipped_when_off_busy_or_pending(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    async with served() as server:
        await _one_turn(server, log)
        session = log.get_session(SESSION)
        scheduler = Scheduler()
        off = await Prewarmer(server.client, log, scheduler).prewarm(session, settings())
        assert off == PrewarmResult(PrewarmOutcome.SKIPPED, "prewarm is off")
        prewarmer = Prewarmer(server.client, log, scheduler, enabled=True)
        async with scheduler.slot("another session", SLOT):
            busy = await prewarmer.prewarm(session, settings())
        assert busy == PrewarmResult(PrewarmOutcome.SKIPPED, "the slot is in use")
        say(log, "a message not answered yet")
        pending = await prewarmer.prewarm(session, settings())
        assert pending == PrewarmResult(PrewarmOutcome.SKIPPED, "a turn is pending")
    assert [r.record.kind for r in records(log)] == [RequestKind.TURN]


@pytest.mark.anyio
async def test_prewarm_waits_for_the_whole_engine_and_the_whole_server(tmp_path: Path) -> None:
    """A prewarm beside any running request would slow both (a second active slot), and on a
    unified pool its launch clears every idle slot: it runs only when nothing else does."""
    log = open_log(tmp_path)
    async with served() as server:
        await _one_turn(server, log)
        session = log.get_session(SESSION)
        scheduler = Scheduler()
        prewarmer = Prewarmer(server.client, log, scheduler, enabled=True)
        async with scheduler.slot("a session on another slot", SLOT + 1):
            other_lane = await prewarmer.prewarm(session, settings())
        # Another client's request on the other slot of the server.
        server.fake.faults.set(stall_before_first_byte=True)
        async with anyio.create_task_group() as tg:

            async def other_client() -> None:
                async with server.client.stream_chat(user_body("x", id_slot=SLOT + 1)) as r:
                    await r.aread()

            tg.start_soon(other_client)
            await eventually(lambda: server.fake.model().slots.slots[SLOT + 1].is_processing)
            other_client_busy = await prewarmer.prewarm(session, settings())
            server.fake.faults.set(stall_before_first_byte=False)
        idle = await prewarmer.prewarm(session, settings())
    assert other_lane == PrewarmResult(PrewarmOutcome.SKIPPED, "a turn of loopd's runs or waits")
    assert other_client_busy == PrewarmResult(
        PrewarmOutcome.SKIPPED, "the server is busy with another client's request"
    )
    assert idle.outcome is PrewarmOutcome.DONE


@pytest.mark.anyio
async def test_a_real_turn_waits_only_for_the_prewarm_to_be_cancelled(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    async with served() as server:
        await _one_turn(server, log)
        session = log.get_session(SESSION)
        scheduler = Scheduler()
        prewarmer = Prewarmer(server.client, log, scheduler, enabled=True)
        await _evict(server)
        server.fake.pace = Pace(prompt_tokens_per_second=20, batch_size=8)  # seconds of reading
        results: list[PrewarmResult] = []
        slot = server.fake.model().slots.slots[SLOT]
        async with anyio.create_task_group() as tg:

            async def prewarm() -> None:
                results.append(await prewarmer.prewarm(session, settings()))

            tg.start_soon(prewarm)
            await eventually(lambda: prewarmer.running(SLOT) and slot.is_processing)
            server.fake.pace = Pace()
            # What Runtime.run_turn does when real work arrives.
            started = time.monotonic()
            prewarmer.preempt(SLOT)
            async with scheduler.slot(SESSION, SLOT):
                waited = time.monotonic() - started
                say(log, "the real question")
                outcome = await make_turn(server, log).run()
        served_log = list(server.fake.log)
    assert waited < 0.5
    assert outcome.failure is None
    assert results == [PrewarmResult(PrewarmOutcome.CANCELLED, "real work needed the slot")]
    prewarm_record = records(log)[-2].record
    assert prewarm_record.kind is RequestKind.PREWARM
    assert prewarm_record.perf.outcome == "cancelled"
    chats = [r for r in served_log if r.path == "/v1/chat/completions"]
    assert chats[-2].outcome == "disconnected"  # the server stopped reading the prewarm
    assert verify(log) == []


def test_the_final_timings_are_read_from_the_prewarms_stream() -> None:
    stream = (
        b'data: {"choices":[],"prompt_progress":{"total":9,"processed":9}}\n\n'
        b'data: {"choices":[{"delta":{"content":"x"}}],"timings":{"prompt_n":5}}\n\n'
        b"data: not json\n\n"
        b'data: {"choices":[{"finish_reason":"length"}],"timings":{"cache_n":4,"prompt_n":9}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert final_timings(stream) == {
        "choices": [{"finish_reason": "length"}],
        "timings": {"cache_n": 4, "prompt_n": 9},
    }
    assert final_timings(b'data: {"choices":[]}\n\ndata: [DONE]\n\n') is None
