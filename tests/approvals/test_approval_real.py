"""On the real llama-server: a call that waited for a person's approval is answered, and the
turn's next request continues the same prefix (the server reuses what the call's request read).
The tiny model does not call tools on its own, so a scripted assistant message makes the call;
every request around it is real."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from loopcommon.jsonbytes import dumps
from loopd.config import load_settings
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord, fresh_external_key
from loopd.sessions import Runtime
from loopd.terminal.approve import TerminalAsker
from loopd_dev import devserver
from tests.approvals.support import TOOL, asking_broker, audit_approvals, tool_results

pytestmark = pytest.mark.anyio


def scripted_call(runtime: Runtime, name: str, slot: int) -> None:
    log = runtime.log
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "scripted-1",
                "type": "function",
                "function": {
                    "name": "call_tool",
                    "arguments": json.dumps({"name": TOOL, "arguments": {"text": "hi"}}),
                },
            }
        ],
    }
    sent = log.replay_messages(name)
    record = RequestRecord(
        kind=RequestKind.TURN,
        slot=slot,
        epoch=log.current_epoch(name).number,
        message_count=len(sent),
        messages_sha256=messages_digest(sent),
        perf=Perf(outcome="scripted", extra={"scripted": "assistant message given by the test"}),
    )
    log.append_assistant(name, dumps(call), request=record)


@pytest.mark.real_server
async def test_an_allowed_call_continues_the_turn_on_the_same_prefix(
    real_server: devserver.RunningServer, tmp_path: Path, sockets: Path
) -> None:
    async with asking_broker(tmp_path, sockets) as broker_url:
        settings = load_settings(
            infer_url=real_server.url,
            model=devserver.PLAIN_MODEL,
            broker_url=broker_url,
            state_dir=tmp_path / "state",
            temperature=0.0,
            max_tokens=24,
            think_cap=0,
        )
        runtime = Runtime.open(settings)
        name = "real-approval"
        try:
            session = runtime.ensure_session(name)
            runtime.log.append_user(name, "Say hello.", external_key=fresh_external_key())
            first = await runtime.run_turn(session, lambda status: None)
            assert first.failure is None, first.failure
            runtime.log.append_user(name, "Echo 'hi'.", external_key=fresh_external_key())
            scripted_call(runtime, name, session.slot)
            await runtime.tools.broker.find_tool(name, "echo a text")

            def typed_y(stop: threading.Event) -> str:
                return "y\n"

            asker = TerminalAsker("me", write=lambda text: None, read_line=typed_y)
            outcome = await runtime.resume(session, lambda status: None, asker=asker)
            requests = [r.record for r in runtime.log.requests(name)]
        finally:
            await runtime.aclose()
    assert outcome is not None
    assert outcome.failure is None, outcome.failure
    assert tool_results(settings.db_path, name) == ["Allowed by @me.\necho: hi"]
    assert audit_approvals(tmp_path) == [(TOOL, "allow", "@me")]
    done = [r.perf for r in requests if r.perf.outcome == "complete"]
    assert len(done) == 2
    before, after = done
    assert before.cache_n is not None
    assert before.prompt_n is not None
    assert after.cache_n is not None
    read = before.cache_n + before.prompt_n + (before.predicted_n or 0) - 1
    assert after.cache_n >= read - 2, (before, after)
