"""Whole turns against the fake llama-server and a real session log: every fault ends in a
recorded, never-replayed broken request and a clear message; the next turn then succeeds; tool
loops replay byte for byte; each kind of cache loss is labelled."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.engine.cacheloss import LossCause
from loopd.engine.client import InferenceClient
from loopd.engine.guards import GuardLimits
from loopd.engine.outcome import Failure
from loopd.engine.progress import Phase, Status
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import EntryKind, RequestKind
from loopd.sessionlog.store import SessionLog
from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    Pace,
    ScriptedReply,
    ScriptedToolCall,
    TemplateOptions,
    Trigger,
    serve_fake_llama,
)
from tests.engine.engine_support import (
    FAST,
    MODEL,
    SESSION,
    SLOT,
    TOOLS_TEXT,
    FakeTools,
    Served,
    eventually,
    kinds,
    make_turn,
    open_log,
    records,
    say,
    served,
)

pytestmark = pytest.mark.anyio

READ_A = ScriptedReply(
    reasoning="I should read the file.",
    tool_calls=(ScriptedToolCall("read_file", '{"path": "a.txt",  "n": 1}'),),
)
THINKER = ScriptedReply(reasoning=" ".join(["hmm"] * 400), content="The answer.")
TWO_ATTEMPTS = replace(FAST, attempts=2)


async def test_a_turn_records_the_answer_and_its_request(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        outcome = await make_turn(server, log).run()
    assert (outcome.answer, outcome.failure, outcome.cause) == ("You said: hello there", None, None)
    assert kinds(log) == [EntryKind.EPOCH, EntryKind.USER, EntryKind.ASSISTANT]
    [request] = records(log)
    perf = request.record.perf
    assert (request.record.kind, perf.outcome) == (RequestKind.TURN, "complete")
    assert (perf.cache_n, perf.cache_loss, perf.cache_loss_cause) == (0, 0, LossCause.FIRST)
    assert perf.prompt_n
    assert perf.predicted_n
    assert perf.ttfb_ms is not None
    assert log.state(SESSION).idle


# Each fault: the switches, the limits, the Failure, what the message says, and how many
# attempts the turn makes (a retry only where it is safe).
FAULTS: list[tuple[str, dict[str, Any], dict[str, Any], Failure, str, int]] = [
    (
        "stall before the first byte",
        {"stall_before_first_byte": True},
        {"first_byte_s": 0.3},
        Failure.FIRST_BYTE_TIMEOUT,
        "no answer from {url} within 0.3 s",
        1,
    ),
    (
        "slots hang while health answers",
        {"stall_before_first_byte": True, "slots_hang": True},
        {"first_byte_s": 0.4, "probe_timeout_s": 0.1},
        Failure.FIRST_BYTE_TIMEOUT,
        "the server looks stuck",
        1,
    ),
    (
        "stall mid-stream before any output",
        {"stall_mid_stream": Trigger(after=3)},
        {"silence_s": 0.2},
        Failure.SILENCE,
        "llama-server at {url} went silent for 0.2 s mid-stream",
        2,
    ),
    (
        "stall mid-stream after output",
        {"stall_mid_stream": Trigger(after=8)},
        {"silence_s": 0.2},
        Failure.SILENCE,
        "llama-server at {url} went silent for 0.2 s mid-stream",
        1,
    ),
    (
        "dropped connection",
        {"drop_mid_stream": Trigger(after=2)},
        {},
        Failure.TRUNCATED,
        "the connection to {url} broke mid-stream",
        2,
    ),
    (
        "malformed chunk",
        {"malformed_chunk": Trigger(after=1)},
        {},
        Failure.MALFORMED,
        "malformed stream from {url}: malformed chunk",
        2,
    ),
    (
        "error event",
        {"error_mid_stream": Trigger(after=2)},
        {},
        Failure.SERVER_ERROR,
        "llama-server at {url} reported an error mid-stream: fake fault",
        2,
    ),
    (
        "http 500",
        {"http_500": Trigger()},
        {},
        Failure.REJECTED,
        "llama-server at {url} answered 500: fake fault: internal server error",
        2,
    ),
    (
        "503 while loading, past the wait",
        {"loading": True},
        {"loading_retry_s": 0.05},
        Failure.REJECTED,
        "llama-server at {url} answered 503: Loading model",
        1,
    ),
    (
        "a hung server",
        {"hang_all": True},
        {"probe_timeout_s": 0.1},
        Failure.SERVER_GONE,
        "llama-server at {url} is gone: /slots does not answer within 0.1 s",
        2,
    ),
]


@pytest.mark.parametrize(
    ("faults", "limits", "failure", "message", "attempts"),
    [pytest.param(*case[1:], id=case[0]) for case in FAULTS],
)
async def test_a_fault_is_recorded_as_broken_then_the_next_turn_succeeds(
    tmp_path: Path,
    faults: dict[str, Any],
    limits: dict[str, Any],
    failure: Failure,
    message: str,
    attempts: int,
) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        before = log.replay_messages(SESSION)
        server.fake.faults.set(**faults)
        with anyio.fail_after(10):
            broken = await make_turn(server, log, limits=replace(TWO_ATTEMPTS, **limits)).run()
        server.fake.faults.clear()
        assert log.replay_messages(SESSION) == before, "nothing of a broken stream is replayed"
        assert log.state(SESSION).pending_turn
        again = await make_turn(server, log).run()
    assert (broken.answer, broken.cause) == (None, failure)
    assert broken.failure is not None
    assert message.format(url=server.url) in broken.failure
    assert kinds(log) == [EntryKind.EPOCH, EntryKind.USER] + [EntryKind.BROKEN] * attempts + [
        EntryKind.ASSISTANT
    ]
    assert again.answer == "You said: hello there", again.failure
    *failed, answered = records(log)
    assert [r.record.perf.outcome for r in failed] == ["broken"] * attempts
    assert {r.record.perf.extra["failure"] for r in failed} == {failure.value}
    assert answered.record.perf.outcome == "complete"
    sent = {r.record.messages_sha256 for r in records(log)}
    assert sent == {messages_digest(before)}, "every attempt and the next turn sent the same bytes"
    broken_entry = log.entries(SESSION)[2]
    assert broken_entry.fields.reason == broken.failure


async def test_a_500_once_is_retried_within_the_turn(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        server.fake.faults.set(http_500=Trigger(count=1))
        outcome = await make_turn(server, log).run()
    assert outcome.answer == "You said: hello there"
    assert kinds(log)[2:] == [EntryKind.BROKEN, EntryKind.ASSISTANT]
    first, second = records(log)
    assert first.record.perf.extra["status_code"] == 500
    assert first.record.perf.extra["failure"] == Failure.REJECTED.value
    assert second.record.perf.outcome == "complete"
    assert second.record.perf.cache_loss_cause == LossCause.FIRST, "the 500 never touched the slot"
    assert [r.record for r in records(log)] == outcome.requests


async def test_exceeding_the_context_is_not_retried(tmp_path: Path) -> None:
    async with served(FakeLlama([ModelSpec(MODEL, n_ctx=256)])) as server:
        log = open_log(tmp_path)
        say(log, "word " * 300)
        outcome = await make_turn(server, log).run()
    assert outcome.cause is Failure.REJECTED
    assert outcome.failure is not None
    assert "exceeds the available context size" in outcome.failure
    assert len(server.fake.chat_records()) == 1
    [request] = records(log)
    assert request.record.perf.extra["status_code"] == 400


async def test_a_503_while_loading_waits_then_the_turn_answers(tmp_path: Path) -> None:
    async with served() as server, anyio.create_task_group() as tg:
        log = open_log(tmp_path)
        say(log, "hello there")
        server.fake.faults.set(loading=True)

        async def load_after_refusals() -> None:
            await eventually(lambda: len(server.fake.chat_records()) >= 3)
            server.fake.faults.set(loading=False)

        tg.start_soon(load_after_refusals)
        outcome = await make_turn(server, log).run()
    assert outcome.answer == "You said: hello there"
    assert kinds(log)[2:] == [EntryKind.ASSISTANT], "the loading wait is not a broken request"


async def test_a_queued_turn_says_queued_then_answers(tmp_path: Path) -> None:
    statuses: list[Status] = []
    async with served() as server, anyio.create_task_group() as tg:
        log = open_log(tmp_path)
        say(log, "hello there")
        server.fake.faults.set(stall_before_first_byte=True)
        body = {"model": MODEL, "id_slot": SLOT, "messages": [{"role": "user", "content": "x"}]}

        async def other_client() -> None:
            async with server.running.client() as other:
                await other.post("/v1/chat/completions", json=body)

        tg.start_soon(other_client)

        async def release_when_queued() -> None:
            await eventually(lambda: Phase.QUEUED in {s.phase for s in statuses})
            server.fake.faults.set(stall_before_first_byte=False)

        await eventually(lambda: server.fake.model().slots.slots[SLOT].is_processing)
        tg.start_soon(release_when_queued)
        outcome = await make_turn(server, log, statuses=statuses).run()
    assert outcome.answer == "You said: hello there"
    [request] = records(log)
    assert request.record.perf.queue_wait_ms
    assert request.record.perf.queue_wait_ms > 0


async def test_a_server_that_dies_is_gone_then_a_restarted_one_answers_cold(
    tmp_path: Path,
) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        first = await make_turn(server, log).run()
        say(log, "and again")
        server.fake.faults.set(stall_before_first_byte=True)
        async with anyio.create_task_group() as tg:

            async def kill_when_busy() -> None:
                await eventually(lambda: server.fake.model().slots.slots[SLOT].is_processing)
                server.running.kill()

            tg.start_soon(kill_when_busy)
            died = await make_turn(server, log, limits=TWO_ATTEMPTS).run()
        # The same socket, a new process: nothing cached.
        async with serve_fake_llama(FakeLlama(), uds=server.socket):
            again = await make_turn(server, log).run()
    assert first.answer
    assert again.answer == "You said: and again"
    assert died.cause is Failure.UNREACHABLE, "the retry found nothing listening"
    assert died.failure is not None
    assert f"unix:{server.socket} is unreachable" in died.failure
    broken = [r.record.perf.extra["failure"] for r in records(log)[1:-1]]
    assert broken == [Failure.SERVER_GONE.value, Failure.UNREACHABLE.value]
    last = records(log)[-1].record.perf
    assert (last.cache_n, last.cache_loss_cause) == (0, LossCause.COLD)


async def test_cancelling_a_turn_records_the_request_as_broken(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        server.fake.faults.set(stall_mid_stream=Trigger(after=6))
        with anyio.move_on_after(0.3) as scope:
            await make_turn(server, log).run()
        await eventually(lambda: not server.fake.model().slots.slots[SLOT].is_processing)
    assert scope.cancelled_caught
    assert kinds(log)[2:] == [EntryKind.BROKEN]
    [request] = records(log)
    assert request.record.perf.extra["failure"] == Failure.CANCELLED.value
    assert server.fake.chat_records()[0].outcome == "disconnected"


async def test_a_tool_loop_replays_byte_for_byte_with_full_reuse(tmp_path: Path) -> None:
    tools = FakeTools({"read_file": "contents of a.txt"})
    statuses: list[Status] = []
    async with served() as server:
        server.fake.push(READ_A)
        log = open_log(tmp_path)
        say(log, "read a.txt")
        outcome = await make_turn(server, log, tools=tools, statuses=statuses).run()
    assert outcome.answer == "You said: contents of a.txt"
    assert [(c.name, c.arguments) for c in tools.calls] == [("read_file", READ_A_ARGUMENTS)]
    assert Status(Phase.TOOL_CALL, tool="read_file") in statuses
    entries = log.entries(SESSION)
    assert [e.kind for e in entries] == [
        EntryKind.EPOCH,
        EntryKind.USER,
        EntryKind.ASSISTANT,
        EntryKind.TOOL,
        EntryKind.ASSISTANT,
    ]
    first, followup = records(log)
    assert followup.record.kind is RequestKind.TOOL_FOLLOWUP
    messages = log.replay_messages(SESSION)
    sent_first = messages[: first.record.message_count]
    sent_followup = messages[: followup.record.message_count]
    assert messages_digest(sent_first) == first.record.messages_sha256
    assert messages_digest(sent_followup) == followup.record.messages_sha256
    assert sent_followup[: len(sent_first)] == sent_first
    assert entries[2].message == sent_followup[len(sent_first)]
    assert json.loads(entries[2].message or "")["tool_calls"][0]["function"]["arguments"] == (
        READ_A_ARGUMENTS
    ), "the arguments are stored as streamed, spacing and all"
    perf = followup.record.perf
    assert perf.cache_loss == 0
    assert perf.cache_n == perf.extra["expected_reuse"] > 0


READ_A_ARGUMENTS = READ_A.tool_calls[0].arguments


async def test_a_model_that_keeps_calling_tools_stops_at_max_rounds(tmp_path: Path) -> None:
    tools = FakeTools({"read_file": "contents of a.txt"})
    async with served() as server:
        server.fake.push(READ_A, READ_A, READ_A)
        log = open_log(tmp_path)
        say(log, "read a.txt")
        # The repeat guard off: the same call three times is what it would stop first.
        off = GuardLimits(repeat=0)
        outcome = await make_turn(server, log, tools=tools, max_rounds=2, guard_limits=off).run()
    assert (outcome.answer, outcome.cause) == (None, None)
    assert outcome.failure == "stopped after 2 tool rounds without an answer"
    assert len(tools.calls) == 2
    assert [r.record.kind for r in records(log)] == [RequestKind.TURN, RequestKind.TOOL_FOLLOWUP]
    assert kinds(log)[-1] is EntryKind.TOOL


async def test_a_request_ended_by_an_unexpected_error_is_still_recorded(tmp_path: Path) -> None:
    def report(status: Status) -> None:
        if status.phase is Phase.ANSWERING:
            raise RuntimeError("the status receiver failed")

    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        with pytest.raises(RuntimeError, match="status receiver"):
            await make_turn(server, log, report=report).run()
    assert kinds(log)[2:] == [EntryKind.BROKEN]
    [request] = records(log)
    assert request.record.perf.outcome == "broken"


async def test_a_tool_call_without_a_runner_gets_an_error_result(tmp_path: Path) -> None:
    async with served() as server:
        server.fake.push(READ_A)
        log = open_log(tmp_path)
        say(log, "read a.txt")
        outcome = await make_turn(server, log).run()
    tool_entry = log.entries(SESSION)[3]
    assert tool_entry.kind is EntryKind.TOOL
    assert "tool 'read_file' is not available" in (tool_entry.message or "")
    assert outcome.answer is not None


async def test_a_capped_turn_is_recorded_and_the_loss_after_it_labelled(tmp_path: Path) -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    async with served(fake) as server:
        fake.push(THINKER)
        log = open_log(tmp_path)
        say(log, "think hard")
        capped = await make_turn(server, log, limits=replace(FAST, think_cap=20)).run()
        # The fake's forced end renders like its replay, so its cache survives a cap. The real
        # server's falls back to the end of the previous prompt (docs/contract.md, (k)): another
        # client sending that prompt on the slot leaves the same state here.
        await _prompt_again_from_another_client(server, log)
        say(log, "and now?")
        after = await make_turn(server, log).run()
    assert capped.answer == "The answer."
    assert after.answer
    first, second = records(log)
    assert first.record.perf.capped
    assert first.record.perf.thinking_tokens
    assert first.record.perf.extra["control_answer"] == "success"
    assert second.record.perf.cache_loss
    assert second.record.perf.cache_loss > 0
    assert second.record.perf.cache_loss_cause == LossCause.CAPPED_TURN


async def _prompt_again_from_another_client(server: Served, log: SessionLog) -> None:
    [request] = records(log)
    sent = log.replay_messages(SESSION)[: request.record.message_count]
    body = {
        "model": MODEL,
        "id_slot": SLOT,
        "tools": json.loads(TOOLS_TEXT),
        "messages": [json.loads(message) for message in sent],
    }
    async with server.running.client() as other:
        reply = await other.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200


async def test_a_turn_thinking_past_cap_and_grace_is_broken_and_not_retried(
    tmp_path: Path,
) -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    async with served(fake) as server:
        fake.push(THINKER)
        log = open_log(tmp_path)
        say(log, "think hard")
        unarmed = _UnarmedClient(server.client.url, MODEL)
        limits = replace(FAST, think_cap=20, think_grace=10)
        outcome = await make_turn(server, log, limits=limits, client=unarmed).run()
        await unarmed.aclose()
    assert outcome.cause is Failure.THINK_RUNAWAY
    assert outcome.failure is not None
    assert "the server could not end it" in outcome.failure
    [request] = records(log)
    assert request.record.perf.capped
    assert request.record.perf.outcome == "broken"
    assert kinds(log)[2:] == [EntryKind.BROKEN]


class _UnarmedClient(InferenceClient):
    """The server's answer for a completion that was not armed (the fake arms every request
    that asks, and the engine always asks)."""

    async def control_reasoning_end(self, completion_id: str) -> dict[str, Any]:
        return {"success": False, "message": "reasoning control not enabled for this completion"}


async def test_a_new_epoch_labels_its_loss(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        await make_turn(server, log).run()
        log.start_epoch(
            SESSION,
            reason="tool set changed",
            tools_text="[]",
            system_text="You are a test agent.",
            carry_over=True,
        )
        say(log, "and again")
        outcome = await make_turn(server, log).run()
    assert outcome.answer
    perf = records(log)[-1].record.perf
    assert perf.cache_loss
    assert perf.cache_loss > 0
    assert perf.cache_loss_cause == LossCause.NEW_EPOCH


async def test_a_cold_server_labels_its_loss(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        await make_turn(server, log).run()
        server.fake.faults.set(loading=True)  # an unload: every slot forgets its tokens
        server.fake.faults.set(loading=False)
        say(log, "and again")
        await make_turn(server, log).run()
    perf = records(log)[-1].record.perf
    assert perf.cache_n == 0
    assert perf.cache_loss == perf.extra["expected_reuse"] > 0
    assert perf.cache_loss_cause == LossCause.COLD


async def test_a_template_that_drops_reasoning_labels_its_loss(tmp_path: Path) -> None:
    fake = FakeLlama([ModelSpec(MODEL, template=TemplateOptions(drop_past_reasoning=True))])
    async with served(fake) as server:
        log = open_log(tmp_path)
        say(log, "hello there")
        await make_turn(server, log, template_drops_reasoning=True).run()
        say(log, "and again")
        await make_turn(server, log, template_drops_reasoning=True).run()
        say(log, "once more")
        await make_turn(server, log).run()  # not told: the same loss is unexplained
    second, third = (r.record.perf for r in records(log)[1:])
    assert second.cache_loss
    assert second.cache_loss > 0
    assert second.cache_n
    assert second.cache_loss_cause == LossCause.TEMPLATE_DROPS_REASONING
    assert third.cache_loss_cause == LossCause.UNEXPLAINED


async def test_exact_replay_over_turns_has_no_loss(tmp_path: Path) -> None:
    async with served() as server:
        log = open_log(tmp_path)
        for text in ("one", "two", "three"):
            say(log, text)
            await make_turn(server, log).run()
    losses = [(r.record.perf.cache_loss, r.record.perf.cache_loss_cause) for r in records(log)]
    assert losses == [(0, LossCause.FIRST), (0, None), (0, None)]
