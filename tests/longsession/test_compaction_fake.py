"""Compaction on the fake llama-server: a long session stays inside its slot's context."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopd.contextwindow.compaction import (
    INSTRUCTION,
    INSTRUCTION_KEY,
    SUMMARY_KEY,
    instruction_key,
)
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog.records import EntryKind, RequestKind
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.engine.engine_support import SESSION, FakeTools, open_log, records, say, served
from tests.longsession.longsession_support import gated_turn, small_fake, words


def _prompt_total(log: SessionLog) -> int:
    """The last request's prompt and answer, in tokens (0 before the first)."""
    if not records(log):
        return 0
    perf = records(log)[-1].record.perf
    return (perf.cache_n or 0) + (perf.prompt_n or 0) + (perf.predicted_n or 0)


def _contents(log: SessionLog, epoch: int) -> list[str]:
    return [
        json.loads(e.message)["content"]
        for e in log.entries(SESSION)
        if e.fields.epoch_number == epoch and e.kind is EntryKind.USER and e.message
    ]


@pytest.mark.anyio
async def test_a_long_session_compacts_before_the_context_runs_out(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    outcomes: list[TurnOutcome] = []
    snapshots: dict[int, list[object]] = {}
    async with served(small_fake(n_ctx=4096)) as server:
        for number in range(40):
            say(log, f"turn {number}: " + words(60, seed=f"t{number}x"))
            outcome = await gated_turn(server, log).run()
            assert outcome.failure is None, outcome.failure
            outcomes.append(outcome)
            epochs = log.epochs(SESSION)
            snapshots.setdefault(epochs[-1].number, [])
            for epoch in epochs[:-1]:  # closed epochs: their rows must never change again
                rows = [e for e in log.entries(SESSION) if e.fields.epoch_number == epoch.number]
                snapshots[epoch.number] = snapshots.get(epoch.number) or list(rows)
                assert rows == snapshots[epoch.number]
        served_requests = list(server.fake.log)
    assert all(r.status != 400 for r in served_requests)
    epochs = log.epochs(SESSION)
    assert len(epochs) >= 3
    assert all(e.reason.startswith("compaction: prompt of") for e in epochs[1:])
    assert all(e.tools_text == epochs[0].tools_text for e in epochs)
    assert verify(log) == []
    kinds = [r.record.kind for r in records(log)]
    assert kinds.count(RequestKind.COMPACTION) == len(epochs) - 1
    # Each compaction: one request extending the cached prompt, then one full read of the new
    # epoch, after which requests reuse the whole prompt again.
    requests = records(log)
    for index, request in enumerate(requests):
        if request.record.kind is not RequestKind.COMPACTION:
            continue
        compaction, first, second = (r.record for r in requests[index : index + 3])
        assert compaction.perf.outcome == "complete"
        assert compaction.perf.cache_loss == 0
        assert first.epoch == compaction.epoch + 1
        assert first.perf.cache_loss_cause == "new epoch"
        assert second.perf.cache_loss == 0
    # Every prompt stayed under the context; the thread was told once per compaction.
    assert all(
        (r.record.perf.cache_n or 0) + (r.record.perf.prompt_n or 0) < 4096 for r in requests
    )
    notices = [n for o in outcomes for n in o.notices]
    assert len(notices) == len(epochs) - 1
    assert "compacted" in notices[0]


@pytest.mark.anyio
async def test_the_new_epoch_holds_the_summary_and_the_latest_message(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    shown: list[object] = []
    async with served(small_fake(n_ctx=4096)) as server:
        number = 0
        while len(log.epochs(SESSION)) == 1:
            say(log, f"message {number} " + words(120, seed=f"m{number}x"))
            number += 1
            await gated_turn(server, log, report=shown.append).run()
    # The summary is not the answer: its text never streams where the turn's answer shows.
    texts = [getattr(status, "text", "") for status in shown]
    assert not any("[loopd] This conversation" in text for text in texts)
    old, new = log.epochs(SESSION)
    old_users = _contents(log, old.number)
    assert old_users[-1] == INSTRUCTION  # what the model was asked is in the log
    latest = old_users[-2]
    assert latest.startswith(f"message {number - 1} ")
    summary, carried = _contents(log, new.number)
    # The fake model echoes the start of the last message: the summary answered the instruction.
    assert summary.endswith(
        "You said: [loopd] This conversation is about to be compacted to fit the model's"
    )
    assert "compacted" in summary
    assert carried == latest
    keys = [e.fields.external_key or "" for e in log.entries(SESSION)]
    assert sum(k.startswith(INSTRUCTION_KEY) for k in keys) == 1
    assert sum(k.startswith(SUMMARY_KEY) for k in keys) == 1
    notes = [e for e in log.entries(SESSION) if e.kind is EntryKind.NOTE]
    assert (notes[-1].fields.text or "").startswith(f"compacted epoch {old.number}: prompt of")
    assert verify(log) == []


@pytest.mark.anyio
async def test_an_over_long_tool_result_is_cut_with_a_note(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    tools = FakeTools(answers={"read_file": words(10_000)})
    async with served(small_fake(n_ctx=4096)) as server:
        server.fake.push(
            ScriptedReply(tool_calls=(ScriptedToolCall("read_file", '{"path":"big.txt"}'),)),
            ScriptedReply(content="done"),
        )
        say(log, "read big.txt")
        outcome = await gated_turn(server, log, tools=tools).run()
    assert outcome.answer == "done"
    (result,) = [e for e in log.entries(SESSION) if e.kind is EntryKind.TOOL]
    content = json.loads(result.message or "")["content"]
    assert content.startswith("w0 w1 w2")
    assert re.search(r"\[loopd: this tool result was cut here. It was [\d,]{6} tokens", content)
    assert len(content) < 2000
    assert all(r.record.perf.outcome == "complete" for r in records(log))


@pytest.mark.anyio
async def test_an_uncut_over_long_message_in_the_log_is_never_sent(tmp_path: Path) -> None:
    """A front end that stored a message too long for the context: the turn carries it, cut,
    into a new epoch instead of sending a request that must fail."""
    log = open_log(tmp_path)
    async with served(small_fake(n_ctx=4096)) as server:
        say(log, words(10_000))
        outcome = await gated_turn(server, log).run()
        statuses = [r.status for r in server.fake.log if r.path == "/v1/chat/completions"]
    assert outcome.failure is None
    assert 400 not in statuses
    assert len(log.epochs(SESSION)) == 2
    summary, carried = _contents(log, 2)
    assert "no earlier conversation" in summary
    assert "[loopd: this message was cut here" in carried
    assert [r.record.kind for r in records(log)] == [RequestKind.TURN]
    assert verify(log) == []


@pytest.mark.anyio
async def test_a_compaction_cut_short_is_finished_by_the_next_turn(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    async with served(small_fake(n_ctx=4096)) as server:
        say(log, "hello")
        await gated_turn(server, log).run()
        say(log, "the latest question")
        # loopd stopped right after asking for the summary, before the request was sent.
        log.append_user(SESSION, INSTRUCTION, external_key=instruction_key(SESSION, 1))
        outcome = await gated_turn(server, log).run()
    assert outcome.failure is None
    assert len(log.epochs(SESSION)) == 2
    assert log.epochs(SESSION)[1].reason == "compaction: resumed after an interruption"
    assert _contents(log, 2)[1] == "the latest question"
    kinds = [r.record.kind for r in records(log)]
    assert kinds == [RequestKind.TURN, RequestKind.COMPACTION, RequestKind.TURN]
    assert verify(log) == []


@pytest.mark.anyio
async def test_a_compaction_in_the_middle_of_a_turn_carries_its_tool_rounds(tmp_path: Path) -> None:
    """The prompt outgrows the context with a tool result, so the session compacts before the
    follow-up request: the new epoch holds the call and its result as they were (summarised,
    the model would make the call again), and the follow-up continues from them."""
    log = open_log(tmp_path)
    tools = FakeTools(answers={"read_file": words(700, seed="r")})
    async with served(small_fake(n_ctx=4096)) as server:
        # Plain turns until the prompt is close under the threshold (3,072 tokens of 4,096).
        while _prompt_total(log) < 2700:
            say(log, "chat " + words(40, seed=f"c{len(records(log))}x"))
            assert (await gated_turn(server, log).run()).failure is None
        # Two rounds of about 600 tokens each (a result is cut to that): the second outgrows the
        # context before the follow-up that would read it.
        for part in ("one", "two"):
            call = ScriptedToolCall("read_file", json.dumps({"path": part}))
            server.fake.push(ScriptedReply(tool_calls=(call,)))
        say(log, "read both parts")
        outcome = await gated_turn(server, log, tools=tools).run()
        assert outcome.failure is None, outcome.failure
        sent = server.fake.chat_records()[-1].body["messages"]
    _first_epoch, new = (e.number for e in log.epochs(SESSION))
    [first] = [r.record for r in records(log) if r.record.epoch == new]
    assert first.kind is RequestKind.TOOL_FOLLOWUP  # the compaction came mid-turn
    copied = [e for e in log.entries(SESSION) if e.fields.epoch_number == new]
    kinds_in_new = [e.kind for e in copied if e.kind is not EntryKind.NOTE]
    assert kinds_in_new == [
        EntryKind.EPOCH,
        EntryKind.USER,  # the summary (an excerpt: no room was left to ask for one)
        EntryKind.USER,  # the message the turn answers
        EntryKind.ASSISTANT,  # the first call, copied
        EntryKind.TOOL,  # its result, copied
        EntryKind.ASSISTANT,  # the second call, copied
        EntryKind.TOOL,  # its result, copied
        EntryKind.ASSISTANT,  # the answer
    ]
    originals = {e.seq: e for e in log.entries(SESSION)}
    for copy in copied[3:7]:
        assert copy.fields.refers_to is not None
        assert copy.message == originals[copy.fields.refers_to].message
    # The follow-up after the compaction showed the model its call and the result.
    roles = ["system", "user", "user", "assistant", "tool", "assistant", "tool"]
    assert [m["role"] for m in sent] == roles
    assert [m["tool_calls"][0]["function"]["arguments"] for m in sent[3::2]] == [
        '{"path": "one"}',
        '{"path": "two"}',
    ]
    assert sent[6]["content"].startswith("r0 r1 r2")
    assert len(tools.calls) == 2, "each call ran once"
    assert verify(log) == []
