"""brokerd's tool broker down, killed mid-call, restarted: the turn goes on, the user gets an
answer, and brokerd's audit and the tool's own effect show no call ran twice."""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd.tools.broker_client import BrokerClient
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.reliability.conftest import Observe
from tests.reliability.harness import (
    MARK_TOOL,
    SESSION,
    call_tool_args,
    check_invariants,
    runtime,
    say,
    start_brokerd,
    until,
)
from tests.reliability.harness import box as make_box
from tests.reliability.test_loopd_crash import find_then_call, tool_results
from tests.reliability.write_table import scenario

pytestmark = pytest.mark.anyio


def recorded_call(audit_db: object, tag: str) -> tuple[str, str, str | None]:
    """(call id, argument text, end status) of the mark_ticket call with this tag."""
    db = sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT call_id, arguments, status FROM calls WHERE tool = ?", (MARK_TOOL,)
        ).fetchall()
    finally:
        db.close()
    matching = [(str(a), str(b), None if c is None else str(c)) for a, b, c in rows if tag in b]
    assert len(matching) == 1, rows
    return matching[0]


@scenario(
    "brokerd",
    "brokerd down during a call",
    fault="nothing listens on broker.sock when the model calls find_tool and call_tool",
    expected="each result says brokerd is not running and nothing ran; the model answers",
)
async def test_brokerd_down_during_a_call(observe: Observe) -> None:
    async with make_box(broker=False) as env, runtime(env) as rt:
        env.fake.push(*find_then_call("never"))
        shown, _ = await say(rt, "mark the ticket")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["mark the ticket"], shown, marks=env.marks
        )
        results = tool_results(env.db_path)
        assert len(results) == 2
        assert all("brokerd is not running" in r for r in results)
        assert all("Nothing was run" in r for r in results)
        assert shown.startswith("You said")
        assert env.mark_lines() == []
        observe(checked.summary())


@scenario(
    "brokerd",
    "brokerd killed mid-call",
    fault="brokerd SIGKILLed while its tool runs",
    expected="the result says it may or may not have run; after a restart the same call id "
    "answers 'interrupted' and does not run again",
)
async def test_brokerd_killed_mid_call(observe: Observe) -> None:
    async with make_box(broker=False) as env:
        broker = await start_brokerd(env)
        try:
            env.fake.push(*find_then_call("mid-call", wait=20))
            async with runtime(env) as rt, anyio.create_task_group() as tg:
                answer: list[str] = []

                async def turn() -> None:
                    answer.append((await say(rt, "mark mid-call"))[0])

                tg.start_soon(turn)
                await until(lambda: env.mark_lines() == ["mid-call"], "the tool to start")
                broker.kill()
            await broker.stop()
            broker = await start_brokerd(env)
            call_id, arguments, status = recorded_call(env.audit_db, "mid-call")
            assert status is None  # started, never ended: brokerd died mid-call
            async with BrokerClient(f"unix:{env.broker_socket}") as client:
                again = await client.call_tool(SESSION, call_id, MARK_TOOL, arguments)
        finally:
            await broker.stop()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["mark mid-call"], answer[0], marks=env.marks
        )
        assert "may or may not have taken effect" in tool_results(env.db_path)[-1]
        assert "it was not run again" in again.lower()
        assert env.mark_lines() == ["mid-call"]
        observe(checked.summary())


@scenario(
    "brokerd",
    "brokerd restarted between turns",
    fault="brokerd SIGKILLed and started again between two turns",
    expected="what find_tool showed survives (from the audit log); the next call_tool runs "
    "once; an old call id replays its recorded result",
)
async def test_brokerd_restarted(observe: Observe) -> None:
    async with make_box(broker=False) as env:
        broker = await start_brokerd(env)
        try:
            env.fake.push(*find_then_call("first"))
            async with runtime(env) as rt:
                _first, _ = await say(rt, "mark first")
                broker.kill()
                await broker.stop()
                broker = await start_brokerd(env)
                env.fake.push(
                    ScriptedReply(
                        tool_calls=(
                            ScriptedToolCall("call_tool", call_tool_args(MARK_TOOL, tag="second")),
                        )
                    )
                )
                second, _ = await say(rt, "mark second")
            call_id, arguments, status = recorded_call(env.audit_db, "first")
            async with BrokerClient(f"unix:{env.broker_socket}") as client:
                replayed = await client.call_tool(SESSION, call_id, MARK_TOOL, arguments)
        finally:
            await broker.stop()
        checked = check_invariants(
            env.state_dir, env.audit_db, ["mark first", "mark second"], second, marks=env.marks
        )
        assert status == "ok"
        assert "marked first" in replayed
        assert env.mark_lines() == ["first", "second"]
        assert "marked second" in tool_results(env.db_path)[-1]
        with SessionLog.open(env.db_path, create=False) as log:
            assert sum(e.kind is EntryKind.ASSISTANT for e in log.entries(SESSION)) == 5
        observe(checked.summary())
