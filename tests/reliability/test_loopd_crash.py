"""``loopd chat`` SIGKILLed at each point of a turn, then started again on the same state dir
with no new input: it must resume the pending turn, answer, and run no tool twice."""

from __future__ import annotations

import json
from dataclasses import replace

import anyio
import pytest

from loopd.approvals.call import Asker
from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd.sessions import INTERRUPTED
from loopd.tools.core import ToolResult
from loopd.wire.assemble import ToolCall
from loopd_dev.fakes.llama import Pace, ScriptedReply, ScriptedToolCall
from tests.reliability.conftest import Observe
from tests.reliability.harness import (
    MARK_TOOL,
    SESSION,
    call_args,
    call_tool_args,
    chat,
    check_invariants,
    runtime,
    start_chat,
    until,
)
from tests.reliability.harness import box as make_box
from tests.reliability.write_table import scenario

pytestmark = pytest.mark.anyio

SLOW = Pace(tokens_per_second=15)
LONG = ScriptedReply(content="an answer that takes its time to stream, token by token " * 3)


def tool_results(db: object, session: str = SESSION) -> list[str]:
    with SessionLog.open(db, create=False) as log:  # type: ignore[arg-type]
        return [
            json.loads(str(e.message))["content"]
            for e in log.entries(session)
            if e.kind is EntryKind.TOOL
        ]


def find_then_call(tag: str, wait: int = 0) -> tuple[ScriptedReply, ScriptedReply]:
    return (
        ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", call_args(query="mark ticket")),)),
        ScriptedReply(
            tool_calls=(
                ScriptedToolCall("call_tool", call_tool_args(MARK_TOOL, tag=tag, wait=wait)),
            )
        ),
    )


@scenario(
    "loopd",
    "SIGKILL before the request",
    fault="loopd killed while its request waits for the router (no slot has taken it)",
    expected="next start resumes the stored message and answers it once",
)
async def test_sigkill_before_the_request(observe: Observe) -> None:
    async with make_box() as env:
        env.fake.faults.set(sleeping=True)  # /health answers; the chat request is held
        first = await start_chat(env, ["what is pending?"])
        await until(lambda: len(env.chat_requests()) == 1, "the request to arrive")
        first.kill()
        await first.wait()
        env.fake.faults.clear()
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        checked = check_invariants(
            env.state_dir,
            env.audit_db,
            ["what is pending?"],
            second.out(),
            shows="You said: what is pending?",
        )
        assert second.out().count("You said") == 1
        observe(checked.summary())


@scenario(
    "loopd",
    "SIGKILL mid-stream",
    fault="loopd killed while the answer streams",
    expected="nothing half-stored; next start sends the turn again and answers once",
)
async def test_sigkill_mid_stream(observe: Observe) -> None:
    async with make_box() as env:
        env.fake.pace = SLOW
        env.fake.push(LONG)
        first = await start_chat(env, ["stream slowly"])
        await until(
            lambda: any(r.status == 200 for r in env.chat_requests()), "the stream to start"
        )
        await anyio.sleep(0.3)  # a few tokens in
        first.kill()
        await first.wait()
        env.fake.pace = Pace()
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["stream slowly"], second.out(), shows="You said"
        )
        with SessionLog.open(env.db_path, create=False) as log:
            kinds = [e.kind for e in log.entries(SESSION)]
        assert kinds.count(EntryKind.ASSISTANT) == 1
        observe(checked.summary())


class _Killed(Exception):
    """Stands for the process dying: raised where the tool would start, after the assistant
    entry with the call was committed."""


class _DieBeforeTool:
    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        raise _Killed(call.id)


@scenario(
    "loopd",
    "SIGKILL after the assistant entry, before the tool runs",
    fault="loopd dies right after storing a call_tool request, before sending it to brokerd",
    expected="next start sends the call with the same id: it runs exactly once; answered",
)
async def test_dies_after_the_assistant_entry_before_the_tool(observe: Observe) -> None:
    async with make_box() as env:
        env.fake.push(*find_then_call("before-tool"))
        async with runtime(env) as rt:
            real_tools = rt.tools
            # find_tool runs for real; the process "dies" just before call_tool would run.
            session = rt.ensure_session(SESSION)
            rt.log.append_user(SESSION, "mark it", external_key="k-1")
            base = rt.turn(session, lambda status: None)

            class FindThenDie:
                async def run(self, name: str, call: ToolCall, asker: Asker | None) -> ToolResult:
                    if call.name == "call_tool":
                        raise _Killed(call.id)
                    return await real_tools.run(name, call, asker)

            with pytest.raises(_Killed):
                await replace(base, tools=FindThenDie()).run()
        assert env.mark_lines() == []
        resumed = await chat(env)
        again = await chat(env)  # nothing pending any more: runs nothing
        assert resumed.process.returncode == 0, resumed.err()
        assert again.process.returncode == 0, again.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["mark it"], resumed.out(), marks=env.marks
        )
        assert env.mark_lines() == ["before-tool"]
        assert "marked before-tool" in tool_results(env.db_path)[-1]
        observe(checked.summary())


@scenario(
    "loopd",
    "SIGKILL while a workspace tool runs",
    fault="loopd killed while run_command runs (its effect already written)",
    expected="next start records 'may or may not have taken effect', does not run it again",
)
async def test_sigkill_while_a_core_tool_runs(observe: Observe) -> None:
    async with make_box() as env:
        command = "echo ran >> count.txt; sleep 20"
        env.fake.push(
            ScriptedReply(tool_calls=(ScriptedToolCall("run_command", call_args(command=command)),))
        )
        effect = env.workspace() / "count.txt"
        first = await start_chat(env, ["count once"])
        await until(effect.exists, "the command to run")
        first.kill()
        await first.wait()
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["count once"], second.out(), effects=[effect]
        )
        assert tool_results(env.db_path) == [INTERRUPTED]
        assert effect.read_text().split() == ["ran"]
        observe(checked.summary())


@scenario(
    "loopd",
    "SIGKILL while a broker tool runs",
    fault="loopd killed while brokerd runs its call_tool (brokerd finishes it)",
    expected="next start asks brokerd again with the call id: recorded result, not run again",
)
async def test_sigkill_while_a_broker_tool_runs(observe: Observe) -> None:
    async with make_box() as env:
        env.fake.push(*find_then_call("while-running", wait=1))
        first = await start_chat(env, ["mark it while I kill you"])
        await until(lambda: env.mark_lines() == ["while-running"], "the broker tool to start")
        first.kill()
        await first.wait()
        await anyio.sleep(1.2)  # brokerd finishes the call and records its end
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        checked = check_invariants(
            env.state_dir,
            env.audit_db,
            ["mark it while I kill you"],
            second.out(),
            marks=env.marks,
        )
        assert env.mark_lines() == ["while-running"]
        assert "marked while-running" in tool_results(env.db_path)[-1]
        observe(checked.summary())


@scenario(
    "loopd",
    "SIGKILL after the tool result",
    fault="loopd killed after storing the tool result, while the follow-up request streams",
    expected="next start sends the follow-up again and answers; the tool does not run again",
)
async def test_sigkill_after_the_tool_result(observe: Observe) -> None:
    async with make_box() as env:
        env.fake.push(
            ScriptedReply(
                tool_calls=(
                    ScriptedToolCall("run_command", call_args(command="echo once >> eff.txt")),
                )
            ),
            LONG,
        )
        effect = env.workspace() / "eff.txt"
        env.fake.pace = SLOW
        first = await start_chat(env, ["do it once"])
        await until(effect.exists, "the command to run")
        await until(lambda: [r.status for r in env.chat_requests()] == [200, 200], "the follow-up")
        await anyio.sleep(0.3)
        first.kill()
        await first.wait()
        env.fake.pace = Pace()
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["do it once"], second.out(), effects=[effect]
        )
        assert len(tool_results(env.db_path)) == 1
        observe(checked.summary())


@scenario(
    "loopd",
    "killed while the terminal answer is shown, then restarted",
    fault="loopd killed after the answer was stored (the user may not have seen it)",
    expected="a restart with nothing pending asks nothing of the model and duplicates nothing",
)
async def test_restart_after_an_answer_repeats_nothing(observe: Observe) -> None:
    async with make_box() as env:
        first = await chat(env, ["just once"])
        assert first.process.returncode == 0, first.err()
        requests = len(env.chat_requests())
        second = await chat(env)
        assert second.process.returncode == 0, second.err()
        assert len(env.chat_requests()) == requests
        checked = check_invariants(
            env.state_dir, env.audit_db, ["just once"], first.out(), shows="You said: just once"
        )
        observe(checked.summary())
