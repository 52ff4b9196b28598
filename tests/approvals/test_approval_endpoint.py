"""With ``[[endpoint]]`` tables, a turn waiting for a person's approval hands its slot to the next
session, as on one server: another session's whole turn runs on the slot while the person
decides, then the waiting turn holds the slot again and is answered."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from loopd.approvals.call import AskedCall, Decision
from loopd.config import load_settings
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, RunningFake, ScriptedReply, ScriptedToolCall
from tests.approvals.support import TOOL, asking_broker, tool_results
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio

ENDPOINT = "gpu1"


class OtherTurnMeanwhile:
    """A person who decides only after another session's turn on the same slot has run: were
    the slot still held by the waiting turn, that turn would wait for ever (bounded here)."""

    def __init__(self, runtime: Runtime, other: str) -> None:
        self.runtime = runtime
        self.other = other
        self.holders: list[str | None] = []
        self.pages: list[str] = []  # the waiting turn's phase on the status page, when asked
        self.other_answer: str | None = None

    @property
    def people(self) -> frozenset[str]:
        return frozenset({"me"})

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        return None

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        self.holders.append(self.runtime.endpoints.servers[ENDPOINT].scheduler.holder(0))
        waiting = self.runtime.live.get(call.session)
        self.pages.append(waiting.phase if waiting is not None else "not live")
        session = self.runtime.ensure_session(self.other)
        await self.runtime.append_user(self.other, "hello", external_key=fresh_external_key())
        with anyio.fail_after(30):
            outcome = await self.runtime.run_turn(session, lambda status: None)
        self.other_answer = outcome.answer
        return Decision("allow", "@me")


async def test_a_turn_waiting_for_approval_on_an_endpoint_hands_its_slot_over(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    call = json.dumps({"name": TOOL, "arguments": {"text": "hi"}})
    fake_llama.push(
        ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", '{"query": "echo a text"}'),)),
        ScriptedReply(tool_calls=(ScriptedToolCall("call_tool", call),)),
        ScriptedReply(content="The other session's answer."),  # while the first one waits
        ScriptedReply(content="Done."),
        model=FAKE_MODEL,
    )
    async with asking_broker(tmp_path, sockets) as broker_url:
        one_slot = [{"name": ENDPOINT, "url": llama.base_url, "model": FAKE_MODEL, "slots": [0]}]
        settings = load_settings(
            endpoint=one_slot,
            broker_url=broker_url,
            state_dir=tmp_path / "state",
            max_tokens=256,
            think_cap=0,
        )
        runtime = Runtime.open(settings)
        try:
            session = runtime.ensure_session("waiting")
            await runtime.append_user("waiting", "echo hi", external_key=fresh_external_key())
            asker = OtherTurnMeanwhile(runtime, "other")
            with anyio.fail_after(60):
                outcome = await runtime.run_turn(session, lambda status: None, asker=asker)
            endpoints = {r.record.perf.extra.get("endpoint") for r in runtime.log.requests("other")}
        finally:
            await runtime.aclose()
    assert asker.holders == [None]  # the slot was free while the person was asked
    assert asker.pages == ["waiting for a person's approval"]  # not "calling call_tool"
    assert asker.other_answer == "The other session's answer."
    assert endpoints == {ENDPOINT}
    assert outcome.answer == "Done."
    assert tool_results(settings.db_path, "waiting")[-1] == "Allowed by @me.\necho: hi"
