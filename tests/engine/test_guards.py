"""The loop guards: the pure rule (the same call after folding, cycles, runs of failures, the
limits on calls and tool time), then whole turns on the fake server with a real session log,
each guard ending the turn with one line, a note in the log and a metric."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from loopcommon.jsonbytes import dumps
from loopd.approvals.call import Asker
from loopd.engine import guards
from loopd.engine.guards import Guard, GuardLimits, Made, Point, Run, Stop, judge
from loopd.observe.metrics import METRICS
from loopd.sessionlog.records import EntryKind
from loopd.tools.core import ToolResult
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
    settings,
)

LIMITS = GuardLimits()
LIST = ToolCall("c1", "list_dir", '{"path": "."}')
# The same call as the model may write it again: other spacing, other key order.
LIST_AGAIN = ToolCall("c2", "list_dir", '{ "path":"." }')
READ = ToolCall("c3", "read_file", '{"path": "a.txt", "n": 1}')
READ_REORDERED = ToolCall("c4", "read_file", '{"n": 1, "path": "a.txt"}')
EDIT = ToolCall("c5", "edit_file", '{"path": "a.txt", "old_string": "a", "new_string": "b"}')


def call(n: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(f"k{n}", name, arguments)


def ran(*calls: ToolCall, failed: bool | None = False) -> list[Made]:
    return [Made(c, ran=True, failed=failed) for c in calls]


# -- the same call --------------------------------------------------------------------------


def test_calls_compare_after_folding_key_order_and_whitespace_in_strings() -> None:
    assert guards.call_key(LIST) == guards.call_key(LIST_AGAIN)
    assert guards.call_key(READ) == guards.call_key(READ_REORDERED)
    command = [call(n, "run_command", json.dumps({"command": "ls" + " " * n})) for n in range(3)]
    assert len({guards.call_key(c) for c in command}) == 1
    spaced = call(9, "run_command", '{"command": "  ls   -a\\n"}')
    assert guards.call_key(spaced) == guards.call_key(call(8, "run_command", '{"command":"ls -a"}'))
    assert guards.call_key(LIST) != guards.call_key(ToolCall("x", "list_dir", '{"path": "a"}'))
    assert guards.call_key(LIST) != guards.call_key(ToolCall("x", "read_file", '{"path": "."}'))
    broken = ToolCall("x", "list_dir", '{"path":   ')
    assert guards.call_key(broken) == ("list_dir", '{"path":')
    deep = ToolCall("x", "list_dir", "[" * 100_000 + "]" * 100_000)
    assert guards.call_key(deep) == ("list_dir", "[" * 100_000 + "]" * 100_000)


def test_the_first_repeat_is_pointed_to_the_earlier_result_and_the_second_stops() -> None:
    assert judge(LIMITS, [], LIST) == Run()
    first = judge(LIMITS, [Made(LIST, result="a.txt\nb.txt")], LIST_AGAIN)
    assert isinstance(first, Point)
    assert first.guard is Guard.REPEAT
    assert first.text == (
        "not run again: you already called list_dir with these arguments in this turn (call c1), "
        "and nothing has changed since. Its result was:\na.txt\nb.txt\nIf that answers the "
        "request, answer in plain text now; otherwise make a different call."
    )
    long = judge(LIMITS, [Made(LIST, result="x" * 5000)], LIST_AGAIN)
    assert isinstance(long, Point)
    assert "x" * 800 + "\n[cut: the whole result is above]\n" in long.text
    assert "x" * 801 not in long.text
    made = [*ran(LIST), Made(LIST_AGAIN, ran=False, failed=None)]
    assert judge(LIMITS, made, LIST) == Stop(
        Guard.REPEAT, "the model repeated a call (list_dir, same arguments) 3 times; stopped"
    )


def test_repeats_of_different_calls_count_together() -> None:
    """Seen with the agent model: it read line 2 (the answer), paged on through the file, went
    back to its start and paged again, each page repeated only once."""
    pages = [
        call(n, "read_file", json.dumps({"path": "lines.txt", "offset": offset, "limit": 1}))
        for n, offset in enumerate([2, 3, 4, 1, 2, 3, 4, 5])
    ]
    made = ran(*pages[:4])
    assert isinstance(judge(LIMITS, made, pages[4]), Point)
    made.append(Made(pages[4], ran=False, failed=None))
    assert judge(LIMITS, made, pages[5]) == Stop(
        Guard.REPEAT,
        "the model repeated calls it had already made (read_file, same arguments) 2 times; stopped",
    )


def test_a_call_after_a_change_is_no_repeat_but_a_read_only_call_between_changes_nothing() -> None:
    # read, edit, read again to confirm: the file changed, so the second read runs.
    assert judge(LIMITS, ran(READ, EDIT), READ_REORDERED) == Run()
    # An edit that failed changed nothing; nor did a listing.
    assert isinstance(judge(LIMITS, [*ran(READ), *ran(EDIT, failed=True)], READ), Point)
    assert isinstance(judge(LIMITS, ran(READ, LIST), READ), Point)
    # The same command twice in a row is a repeat, though a command may change things.
    command = call(1, "run_command", '{"command": "date"}')
    assert isinstance(judge(LIMITS, ran(command), command), Point)


def test_only_the_turn_under_way_counts() -> None:
    messages = [
        dumps({"role": "user", "content": "list"}),
        dumps({"role": "assistant", "content": None, "tool_calls": [LIST.to_wire()]}),
        dumps({"role": "tool", "tool_call_id": "c1", "content": "a.txt"}),
        dumps({"role": "assistant", "content": "ok"}),
        dumps({"role": "user", "content": "list again"}),
        dumps({"role": "assistant", "content": None, "tool_calls": [LIST_AGAIN.to_wire()]}),
    ]
    made = guards.made_of_turn(messages, {})
    assert [m.call for m in made] == [LIST_AGAIN]
    assert made[0].failed is None  # made before this process saw it: not known to have failed
    answered = [*messages, dumps({"role": "tool", "tool_call_id": "c2", "content": "b.txt"})]
    assert guards.made_of_turn(answered, {})[0].result == "b.txt"


# -- cycles -----------------------------------------------------------------------------------


def test_a_cycle_gone_round_again_stops_at_the_call_that_closes_it() -> None:
    a = call(1, "edit_file", '{"path": "x", "old_string": "1", "new_string": "2"}')
    b = call(2, "edit_file", '{"path": "x", "old_string": "2", "new_string": "1"}')
    # Each edit changes the file, so neither is a repeat of the other: the cycle guard sees it.
    assert judge(LIMITS, ran(a, b), a) == Run()
    verdict = judge(LIMITS, ran(a, b, a), b)
    assert verdict == Stop(
        Guard.CYCLE,
        "the model went round the same 2 calls (edit_file, edit_file) again once; stopped",
    )
    c = call(3, "run_command", '{"command": "make"}')
    assert isinstance(judge(LIMITS, ran(a, b, c, a, b), c), Stop)
    assert judge(GuardLimits(cycle=2), ran(a, b, a), b) == Run()
    assert isinstance(judge(GuardLimits(cycle=2), ran(a, b, a, b, a), b), Stop)


def test_different_calls_and_a_cycle_not_yet_closed_are_no_cycle() -> None:
    calls = [call(n, "read_file", json.dumps({"path": f"f{n}"})) for n in range(6)]
    for index in range(1, len(calls)):
        assert judge(LIMITS, ran(*calls[:index]), calls[index]) == Run()
    a, b = calls[:2]
    assert judge(GuardLimits(cycle=0, repeat=0), ran(a, b, a), b) == Run()


# -- runs of failures ---------------------------------------------------------------------------


def test_a_run_of_failing_calls_ends_the_turn_before_its_next_call_or_request() -> None:
    missing = [call(n, "read_file", json.dumps({"path": f"r{n}.txt"})) for n in range(5)]
    three = ran(*missing[:3], failed=True)
    assert judge(LIMITS, three, missing[3]) == Run()
    assert judge(LIMITS, three, None) == Run()
    four = ran(*missing[:3], failed=True) + ran(LIST, failed=True)
    line = "the model's last 4 tool calls all failed (read_file x3, list_dir); stopped"
    assert judge(LIMITS, four, missing[4]) == Stop(Guard.FAILURES, line)
    assert judge(LIMITS, four, None) == Stop(Guard.FAILURES, line)


def test_a_success_or_a_call_not_seen_run_breaks_a_run_of_failures() -> None:
    missing = [call(n, "read_file", json.dumps({"path": f"r{n}.txt"})) for n in range(4)]
    broken = ran(*missing[:2], failed=True) + ran(LIST) + ran(*missing[2:], failed=True)
    assert judge(LIMITS, broken, None) == Run()
    unknown = ran(missing[0], failed=None) + ran(*missing[1:], failed=True)
    assert judge(LIMITS, unknown, None) == Run()
    # Calls a guard answered are neither: they do not count, and do not break the run.
    pointed = [*ran(*missing[:2], failed=True), Made(LIST, ran=False, failed=None)]
    assert judge(LIMITS, [*pointed, *ran(*missing[2:], failed=True)], None) == Stop(
        Guard.FAILURES, "the model's last 4 tool calls all failed (read_file x4); stopped"
    )
    assert judge(GuardLimits(failures=0), ran(*missing, failed=True), None) == Run()


# -- calls and time -----------------------------------------------------------------------------


def test_calls_per_message_per_turn_and_tool_time_each_end_the_turn_when_reached() -> None:
    limits = GuardLimits(calls_per_message=3, calls_per_turn=5, tool_s_per_turn=10.0)
    made = ran(*[call(n, "read_file", json.dumps({"path": f"{n}"})) for n in range(4)])
    fresh = call(99, "list_dir", '{"path": "sub"}')
    assert judge(limits, made[:2], fresh, in_message=3) == Run()
    assert judge(limits, made[:3], fresh, in_message=4) == Stop(
        Guard.CALLS_PER_MESSAGE, "the model made more than 3 tool calls in one message; stopped"
    )
    assert judge(limits, made, fresh) == Run()
    assert judge(limits, [*made, *ran(LIST)], fresh) == Stop(
        Guard.CALLS_PER_TURN, "the model made more than 5 tool calls in one turn; stopped"
    )
    line = "the turn's tool calls ran for 10 s, the most a turn may take is 10 s; stopped"
    assert judge(limits, made, fresh, tool_s=9.9) == Run()
    assert judge(limits, made, fresh, tool_s=10.0) == Stop(Guard.TOOL_TIME, line)
    assert judge(limits, made, None, tool_s=10.0) == Stop(Guard.TOOL_TIME, line)
    off = GuardLimits(calls_per_message=0, calls_per_turn=0, tool_s_per_turn=0)
    assert judge(off, made * 40, fresh, in_message=500, tool_s=1e9) == Run()


# -- whole turns on the fake server -------------------------------------------------------------


def firings(guard: str, action: str) -> float:
    labels = {"guard": guard, "action": action}
    return METRICS.registry.get_sample_value("loopd_guard_firings_total", labels) or 0.0


LIST_CALL = ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}'),))


@pytest.mark.anyio
async def test_a_turn_whose_model_repeats_a_call_ends_with_one_line_recorded(
    tmp_path: Path,
) -> None:
    stopped_before = firings("repeat", "stopped")
    tools = FakeTools({"list_dir": "a.txt"})
    async with served() as server:
        server.fake.push(*[LIST_CALL] * 5)
        log = open_log(tmp_path)
        say(log, "list the files")
        outcome = await make_turn(server, log, tools=tools).run()
    line = "the model repeated a call (list_dir, same arguments) 3 times; stopped"
    assert (outcome.answer, outcome.failure, outcome.guard) == (None, line, Guard.REPEAT)
    assert len(tools.calls) == 1, "the repeats were not run"
    assert len(records(log)) == 3, "three requests, not the 16 rounds"
    entries = log.entries(SESSION)
    results = [json.loads(e.message or "") for e in entries if e.kind is EntryKind.TOOL]
    assert results[0]["content"] == "a.txt"
    assert results[1]["content"].startswith("not run again: you already called list_dir")
    assert "Its result was:\na.txt\n" in results[1]["content"]
    assert results[2]["content"] == f"not run: {line}"
    assert kinds(log)[-1] is EntryKind.NOTE
    assert entries[-1].fields.text == line
    assert log.state(SESSION).interrupted_calls == ()
    assert firings("repeat", "stopped") == stopped_before + 1


def command_variants(count: int) -> ScriptedReply:
    """One message of ``count`` run_command calls, each the last with one more space."""
    return ScriptedReply(
        tool_calls=tuple(
            ScriptedToolCall("run_command", json.dumps({"command": "touch mark" + " " * n}))
            for n in range(count)
        )
    )


@pytest.mark.anyio
async def test_forty_whitespace_variants_of_one_command_in_one_message_run_it_once(
    tmp_path: Path,
) -> None:
    tools = FakeTools({"run_command": "exit code 0"})
    async with served() as server:
        server.fake.push(command_variants(40), ScriptedReply(content="Done."))
        log = open_log(tmp_path)
        say(log, "mark it")
        # Room for the whole message: the fake writes as many tokens as the calls take.
        outcome = await make_turn(server, log, tools=tools, settings=settings(8192)).run()
    print(f"40 variants in one message: the command ran {len(tools.calls)} times")
    assert len(tools.calls) == 1
    assert outcome.failure == (
        "the model repeated a call (run_command, same arguments) 3 times; stopped"
    )
    results = [e for e in log.entries(SESSION) if e.kind is EntryKind.TOOL]
    assert len(results) == 40, "every call of the message has its result"


@pytest.mark.anyio
async def test_more_calls_in_one_message_than_allowed_end_the_turn_at_the_first_past_it(
    tmp_path: Path,
) -> None:
    before = firings("calls_per_message", "stopped")
    tools = FakeTools({"read_file": "text"})
    many = ScriptedReply(
        tool_calls=tuple(
            ScriptedToolCall("read_file", json.dumps({"path": f"f{n}.txt"})) for n in range(40)
        )
    )
    async with served() as server:
        server.fake.push(many, ScriptedReply(content="Done."))
        log = open_log(tmp_path)
        say(log, "read them all")
        outcome = await make_turn(server, log, tools=tools, settings=settings(8192)).run()
    line = "the model made more than 16 tool calls in one message; stopped"
    assert (outcome.failure, outcome.guard) == (line, Guard.CALLS_PER_MESSAGE)
    assert len(tools.calls) == 16
    assert len(records(log)) == 1
    assert log.entries(SESSION)[-1].fields.text == line
    assert firings("calls_per_message", "stopped") == before + 1


@pytest.mark.anyio
async def test_calls_per_turn_are_counted_across_the_rounds(tmp_path: Path) -> None:
    tools = FakeTools({"read_file": "text"})
    rounds = [
        ScriptedReply(
            tool_calls=tuple(
                ScriptedToolCall("read_file", json.dumps({"path": f"r{r}-{n}.txt"}))
                for n in range(3)
            )
        )
        for r in range(4)
    ]
    async with served() as server:
        server.fake.push(*rounds, ScriptedReply(content="Done."))
        log = open_log(tmp_path)
        say(log, "read")
        turn = make_turn(server, log, tools=tools, guard_limits=GuardLimits(calls_per_turn=7))
        outcome = await turn.run()
    assert outcome.failure == "the model made more than 7 tool calls in one turn; stopped"
    assert len(tools.calls) == 7
    assert len(records(log)) == 3


class SlowTools(FakeTools):
    """Each call takes at least ``seconds`` (a sleep can only make the tool time longer)."""

    seconds: float = 0.2

    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        await anyio.sleep(self.seconds)
        return await super().run(session, call, asker)


@pytest.mark.anyio
async def test_tool_time_per_turn_ends_the_turn_before_its_next_call(tmp_path: Path) -> None:
    tools = SlowTools({"read_file": "text"})
    calls = tuple(
        ScriptedToolCall("read_file", json.dumps({"path": f"f{n}.txt"})) for n in range(5)
    )
    async with served() as server:
        server.fake.push(ScriptedReply(tool_calls=calls), ScriptedReply(content="Done."))
        log = open_log(tmp_path)
        say(log, "read")
        turn = make_turn(server, log, tools=tools, guard_limits=GuardLimits(tool_s_per_turn=0.3))
        outcome = await turn.run()
    assert outcome.guard is Guard.TOOL_TIME
    assert (outcome.failure or "").startswith("the turn's tool calls ran for ")
    assert len(tools.calls) == 2, "two calls of 0.2 s pass 0.3 s"
    assert outcome.tool_s >= 0.4


@pytest.mark.anyio
async def test_a_run_of_failing_calls_ends_the_turn_without_another_request(
    tmp_path: Path,
) -> None:
    tools = FakeTools({"read_file": "error: no such file"}, failing=frozenset({"read_file"}))
    guesses = [
        ScriptedReply(
            tool_calls=(ScriptedToolCall("read_file", json.dumps({"path": f"report{n}.txt"})),)
        )
        for n in range(6)
    ]
    async with served() as server:
        server.fake.push(*guesses)
        log = open_log(tmp_path)
        say(log, "give the total")
        outcome = await make_turn(server, log, tools=tools).run()
    assert outcome.failure == "the model's last 4 tool calls all failed (read_file x4); stopped"
    assert len(tools.calls) == 4
    assert len(records(log)) == 4, "no request after the fourth failure"
    assert [m.failed for m in outcome.calls] == [True] * 4


@pytest.mark.anyio
async def test_a_cycle_of_two_calls_ends_the_turn(tmp_path: Path) -> None:
    tools = FakeTools({"edit_file": "edited"})
    swap = [
        ScriptedReply(tool_calls=(ScriptedToolCall("edit_file", json.dumps(args)),))
        for args in [
            {"path": "x", "old_string": "1", "new_string": "2"},
            {"path": "x", "old_string": "2", "new_string": "1"},
        ]
        * 3
    ]
    async with served() as server:
        server.fake.push(*swap)
        log = open_log(tmp_path)
        say(log, "fix x")
        outcome = await make_turn(server, log, tools=tools).run()
    assert outcome.guard is Guard.CYCLE
    assert len(tools.calls) == 3
    assert len(records(log)) == 4


@pytest.mark.anyio
async def test_normal_tool_turns_fire_no_guard(tmp_path: Path) -> None:
    """List, read, edit, read again to confirm, answer: every call runs, no guard fires."""
    tools = FakeTools({"list_dir": "a.txt", "read_file": "a", "edit_file": "edited"})
    steps = [
        ("list_dir", {"path": "."}),
        ("read_file", {"path": "a.txt"}),
        ("edit_file", {"path": "a.txt", "old_string": "a", "new_string": "b"}),
        ("read_file", {"path": "a.txt"}),
    ]
    async with served() as server:
        server.fake.push(
            *[
                ScriptedReply(tool_calls=(ScriptedToolCall(name, json.dumps(args)),))
                for name, args in steps
            ],
            ScriptedReply(content="a.txt now says b."),
        )
        log = open_log(tmp_path)
        say(log, "change a to b in a.txt and confirm")
        outcome = await make_turn(server, log, tools=tools).run()
    assert (outcome.answer, outcome.failure, outcome.guard) == ("a.txt now says b.", None, None)
    assert [c.name for c in tools.calls] == [name for name, _ in steps]
