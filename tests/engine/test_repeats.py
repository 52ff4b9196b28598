"""The repeat guard: identical calls within a turn (canonical JSON) are pointed to their first
result, and the repeat that reaches the limit ends the turn; pure rules, then a whole turn on the
fake server with a real session log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopcommon.jsonbytes import dumps
from loopd.engine import repeats
from loopd.observe.metrics import METRICS
from loopd.sessionlog.records import EntryKind
from loopd.wire.assemble import ToolCall
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.engine.engine_support import (
    SESSION,
    FakeTools,
    kinds,
    make_turn,
    open_log,
    records,
    say,
    served,
)


def user(text: str) -> str:
    return dumps({"role": "user", "content": text})


def assistant(*calls: ToolCall) -> str:
    return dumps({"role": "assistant", "content": None, "tool_calls": [c.to_wire() for c in calls]})


def result(call: ToolCall) -> str:
    return dumps({"role": "tool", "tool_call_id": call.id, "content": "a.txt"})


LIST = ToolCall("c1", "list_dir", '{"path": "."}')
# The same call as the model may write it again: other spacing, other key order.
LIST_AGAIN = ToolCall("c2", "list_dir", '{ "path":"." }')
READ = ToolCall("c3", "read_file", '{"path": "a.txt", "n": 1}')
READ_REORDERED = ToolCall("c4", "read_file", '{"n": 1, "path": "a.txt"}')


def test_calls_compare_as_canonical_json_and_text_when_not_json() -> None:
    assert repeats.call_key(LIST) == repeats.call_key(LIST_AGAIN)
    assert repeats.call_key(READ) == repeats.call_key(READ_REORDERED)
    assert repeats.call_key(LIST) != repeats.call_key(ToolCall("x", "list_dir", '{"path": "a"}'))
    assert repeats.call_key(LIST) != repeats.call_key(ToolCall("x", "read_file", '{"path": "."}'))
    broken = ToolCall("x", "list_dir", '{"path": ')
    assert repeats.call_key(broken) == ("list_dir", '{"path": ')


def test_the_first_repeat_is_pointed_to_the_earlier_result_and_the_second_stops() -> None:
    first = [user("list"), assistant(LIST)]
    assert repeats.plan(first, [LIST], 2) == repeats.Plan((None,))
    second = [*first, result(LIST), assistant(LIST_AGAIN)]
    plan = repeats.plan(second, [LIST_AGAIN], 2)
    assert plan.stop is None
    assert plan.pointed == 1
    assert "tool result for c1" in (plan.answers[0] or "")
    third_call = ToolCall("c5", "list_dir", '{"path": "."}')
    third = [*second, dumps({"role": "tool", "tool_call_id": "c2", "content": "x"})]
    third.append(assistant(third_call))
    plan = repeats.plan(third, [third_call], 2)
    assert plan.stop == repeats.Stop(
        "the model repeated a call (list_dir, same arguments) 3 times; stopped", "list_dir"
    )
    assert plan.pointed == 0
    assert plan.answers == ("not run: " + plan.stop.line,)


def test_only_the_turn_under_way_counts() -> None:
    earlier_turn = [
        user("list"),
        assistant(LIST),
        result(LIST),
        dumps({"role": "assistant", "content": "ok"}),
    ]
    messages = [*earlier_turn, user("list again"), assistant(LIST_AGAIN)]
    assert repeats.plan(messages, [LIST_AGAIN], 1) == repeats.Plan((None,))


def test_repeats_within_one_message_count_and_calls_after_a_stop_are_not_run() -> None:
    messages = [user("go"), assistant(LIST, LIST_AGAIN, READ)]
    plan = repeats.plan(messages, [LIST, LIST_AGAIN, READ], 1)
    assert plan.answers[0] is None
    assert plan.stop is not None
    assert "2 times" in plan.stop.line
    assert plan.answers[1:] == ("not run: " + plan.stop.line,) * 2


def test_limit_zero_is_off() -> None:
    messages = [user("go"), assistant(LIST), result(LIST), assistant(LIST_AGAIN)]
    assert repeats.plan(messages, [LIST_AGAIN], 0) == repeats.Plan((None,))


def stopped_turns() -> float:
    sample = METRICS.registry.get_sample_value("loopd_repeated_calls_total", {"answer": "stopped"})
    return sample or 0.0


LIST_CALL = ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}'),))


@pytest.mark.anyio
async def test_a_turn_whose_model_repeats_a_call_ends_with_one_line_recorded(
    tmp_path: Path,
) -> None:
    stopped_before = stopped_turns()
    tools = FakeTools({"list_dir": "a.txt"})
    async with served() as server:
        server.fake.push(*[LIST_CALL] * 5)
        log = open_log(tmp_path)
        say(log, "list the files")
        outcome = await make_turn(server, log, tools=tools).run()
    line = "the model repeated a call (list_dir, same arguments) 3 times; stopped"
    assert (outcome.answer, outcome.failure) == (None, line)
    assert len(tools.calls) == 1, "the repeats were not run"
    assert len(records(log)) == 3, "three requests, not the 16 rounds"
    entries = log.entries(SESSION)
    results = [json.loads(e.message or "") for e in entries if e.kind is EntryKind.TOOL]
    assert results[0]["content"] == "a.txt"
    assert "already called list_dir" in results[1]["content"]
    assert results[2]["content"] == f"not run: {line}"
    assert kinds(log)[-1] is EntryKind.NOTE
    assert entries[-1].fields.text == line
    assert log.state(SESSION).interrupted_calls == ()
    assert stopped_turns() == stopped_before + 1
