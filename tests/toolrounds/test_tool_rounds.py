"""Issue acceptance for the tools: a session with find_tool and call_tool rounds keeps the epoch's
`tools` bytes identical in every request, and tool results round-trip through the log.

On the fake the model's tool calls are scripted; on the real server (whose tiny model does not
emit tool calls on its own) a scripted assistant message stands in for the model, and every
request around it is a real request.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import _AsyncGeneratorContextManager, asynccontextmanager
from pathlib import Path

import pytest

from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings
from loopcommon.jsonbytes import dumps
from loopd.config import SHORTHAND_ENDPOINT, load_settings
from loopd.engine.client import ChatStream, InferenceClient
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord, fresh_external_key
from loopd.sessionlog.store import SessionLog
from loopd.sessions import Runtime
from loopd_dev import devserver
from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    ScriptedReply,
    ScriptedToolCall,
    serve_fake_llama,
)
from tests.brokerd.tools.brokertools_support import serving, write_tool

pytestmark = pytest.mark.anyio


def tools_bytes(body: bytes) -> str:
    """The raw text of the body's `tools` array, exactly as sent."""
    text = body.decode()
    start = text.index(',"tools":') + len(',"tools":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end]


@asynccontextmanager
async def broker(tmp_path: Path) -> AsyncIterator[str]:
    catalogue = tmp_path / "catalogue"
    write_tool(
        catalogue,
        "echo_text",
        description="Echo a text back (for tests).",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        run={"kind": "command", "argv": ["echo", "echo:", "{text}"]},
    )
    app = create_broker_app(BrokerSettings(audit_db=tmp_path / "audit.db", catalogue_dir=catalogue))
    sock = tmp_path / "broker.sock"
    async with serving(app, uds=sock):
        yield f"unix:{sock}"


class RecordingClient(InferenceClient):
    """The real client, keeping every chat body it sends."""

    bodies: list[bytes]

    def stream_chat(self, body: bytes) -> _AsyncGeneratorContextManager[ChatStream]:
        self.bodies.append(body)
        return super().stream_chat(body)


def runtime_for(
    url: str, model: str, broker_url: str, state: Path, max_tokens: int = 24
) -> Runtime:
    settings = load_settings(
        infer_url=url,
        model=model,
        broker_url=broker_url,
        state_dir=state,
        temperature=0.0,
        max_tokens=max_tokens,
        think_cap=0,  # no cap: a short max_tokens leaves a capped reasoning no room to answer
    )
    runtime = Runtime.open(settings, client_type=RecordingClient)
    client(runtime).bodies = []
    return runtime


def client(runtime: Runtime) -> RecordingClient:
    """The recording client of the runtime's one server."""
    found = runtime.endpoints.servers[SHORTHAND_ENDPOINT].client
    assert isinstance(found, RecordingClient)
    return found


async def test_find_tool_and_call_tool_rounds_keep_the_tools_bytes(tmp_path: Path) -> None:
    fake = FakeLlama(models=(ModelSpec(name="fake-model"),))
    fake.push(
        ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", '{"query": "echo a text"}'),)),
        ScriptedReply(
            tool_calls=(
                ScriptedToolCall(
                    "call_tool", '{"name": "echo_text", "arguments": {"text": "hello"}}'
                ),
            )
        ),
        ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}'),)),
        ScriptedReply(content="All done."),
    )
    socket = tmp_path / "l.sock"
    async with broker(tmp_path) as broker_url, serve_fake_llama(fake, uds=socket) as served:
        runtime = runtime_for(
            f"unix:{served.uds}", "fake-model", broker_url, tmp_path / "state", max_tokens=512
        )
        try:
            session = runtime.ensure_session("rounds")
            runtime.log.append_user("rounds", "Echo hello.", external_key=fresh_external_key())
            outcome = await runtime.run_turn(session, lambda status: None)
        finally:
            await runtime.aclose()
    assert outcome.failure is None
    assert outcome.answer == "All done."
    bodies = client(runtime).bodies
    assert len(bodies) == 4
    assert {tools_bytes(b) for b in bodies} == {runtime.spec.text}
    for before, after in itertools.pairwise(bodies):
        sent = json.loads(before)["messages"]
        assert json.loads(after)["messages"][: len(sent)] == sent
    results = [json.loads(m) for m in runtime_messages(tmp_path) if '"role":"tool"' in m]
    assert "echo_text" in results[0]["content"]  # find_tool's answer names the tool
    assert "echo: hello" in results[1]["content"]  # call_tool ran it through brokerd
    assert results[2]["tool_call_id"]  # list_dir, a core tool, ran in the workspace


def runtime_messages(tmp_path: Path) -> list[str]:
    with SessionLog.open(tmp_path / "state" / "loopd.db", create=False) as log:
        return log.replay_messages("rounds")


@pytest.mark.real_server
async def test_tool_results_round_trip_and_the_next_request_reuses_the_cache(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    async with broker(tmp_path) as broker_url:
        runtime = runtime_for(real_server.url, devserver.PLAIN_MODEL, broker_url, tmp_path / "st")
        try:
            name = "real-rounds"
            session = runtime.ensure_session(name)
            log = runtime.log
            log.append_user(name, "Say hello.", external_key=fresh_external_key())
            first = await runtime.run_turn(session, lambda status: None)
            assert first.failure is None, first.failure
            # The scripted model: a user asks, "the model" calls echo_text through call_tool.
            log.append_user(name, "Echo 'hi' with a tool.", external_key=fresh_external_key())
            call = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "scripted-1",
                        "type": "function",
                        "function": {
                            "name": "call_tool",
                            "arguments": '{"name": "echo_text",  "arguments": {"text": "hi"}}',
                        },
                    }
                ],
            }
            sent = log.replay_messages(name)
            scripted = RequestRecord(
                kind=RequestKind.TURN,
                slot=session.slot,
                epoch=log.current_epoch(name).number,
                message_count=len(sent),
                messages_sha256=messages_digest(sent),
                perf=Perf(
                    outcome="scripted", extra={"scripted": "assistant message given by the test"}
                ),
            )
            log.append_assistant(name, dumps(call), request=scripted)
            # find_tool first, as the broker requires, then the scripted call runs for real.
            await runtime.tools.broker.find_tool(name, "echo a text")
            await runtime.resume(session, lambda status: None)
        finally:
            await runtime.aclose()
        messages = log_messages(tmp_path / "st", name)
    tool_results = [json.loads(m) for m in messages if '"role":"tool"' in m]
    assert tool_results[0]["tool_call_id"] == "scripted-1"
    assert "echo: hi" in tool_results[0]["content"]
    perf = [r for r in log_requests(tmp_path / "st", name) if r.perf.outcome == "complete"]
    assert len(perf) == 2
    first_perf, follow = perf[0].perf, perf[1].perf
    assert first_perf.cache_n is not None
    assert first_perf.prompt_n is not None
    assert follow.cache_n is not None
    # Everything the server read and wrote in the first request is reused by the follow-up.
    expected = first_perf.cache_n + first_perf.prompt_n + (first_perf.predicted_n or 0) - 1
    assert follow.cache_n >= expected - 2, (first_perf, follow)


def log_messages(state: Path, name: str) -> list[str]:
    with SessionLog.open(state / "loopd.db", create=False) as log:
        return log.replay_messages(name)


def log_requests(state: Path, name: str) -> list[RequestRecord]:
    with SessionLog.open(state / "loopd.db", create=False) as log:
        return [r.record for r in log.requests(name)]


async def test_a_tool_call_cut_at_max_tokens_is_never_replayed(tmp_path: Path) -> None:
    """Replaying arguments that are not JSON makes the server answer every later request with
    a 500 (templates that take object arguments re-parse them): the session would be stuck."""
    fake = FakeLlama(models=(ModelSpec(name="fake-model"),))
    long_args = '{"query": "' + "word " * 200 + '"}'
    fake.push(ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", long_args),)))
    socket = tmp_path / "l.sock"
    async with broker(tmp_path) as broker_url, serve_fake_llama(fake, uds=socket) as served:
        runtime = runtime_for(f"unix:{served.uds}", "fake-model", broker_url, tmp_path / "state")
        try:
            session = runtime.ensure_session("rounds")
            runtime.log.append_user("rounds", "Find a tool.", external_key=fresh_external_key())
            cut = await runtime.run_turn(session, lambda status: None)
            runtime.log.append_user("rounds", "Say hi.", external_key=fresh_external_key())
            after = await runtime.run_turn(session, lambda status: None)
        finally:
            await runtime.aclose()
    assert cut.failure is not None
    assert "not JSON (cut at max_tokens)" in cut.failure
    assert after.failure is None, after.failure
    replayed = runtime_messages(tmp_path)
    assert not any('"tool_calls"' in m for m in replayed), "the cut call was not kept"
