"""A loopd turn on the real llama-server whose tool round calls a real MCP server.

The tiny model does not call tools by itself, so a scripted assistant message stands in for it
(as in tests/toolrounds): ``call_tool`` of ``time.get_current_time``, which brokerd runs on the
real mcp-server-time. Every request around it is real: the result goes into the session log,
and the next request carries it byte for byte and reuses the server's cache.
"""

import json
from pathlib import Path

import pytest

from loopcommon.jsonbytes import dumps
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord, fresh_external_key
from loopd_dev import devserver
from tests.mcp.support import broker_with, time_server
from tests.toolrounds.test_tool_rounds import client, log_messages, log_requests, runtime_for

pytestmark = pytest.mark.anyio


@pytest.mark.real_server
async def test_an_mcp_result_replays_byte_for_byte_and_the_cache_is_reused(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    name = "mcp-turn"
    async with broker_with(tmp_path, [time_server()]) as broker:
        runtime = runtime_for(real_server.url, devserver.PLAIN_MODEL, broker.url, tmp_path / "st")
        try:
            session = runtime.ensure_session(name)
            log = runtime.log
            log.append_user(name, "Say hello.", external_key=fresh_external_key())
            first = await runtime.run_turn(session, lambda status: None)
            assert first.failure is None, first.failure
            log.append_user(name, "What time is it in UTC?", external_key=fresh_external_key())
            arguments = '{"name": "time.get_current_time", "arguments": {"timezone": "UTC"}}'
            call = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "scripted-mcp-1",
                        "type": "function",
                        "function": {"name": "call_tool", "arguments": arguments},
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
            # find_tool first, as the broker requires; then the scripted call runs for real.
            found = await runtime.tools.broker.find_tool(name, "current time in a timezone")
            assert "time.get_current_time" in found
            await runtime.resume(session, lambda status: None)
        finally:
            await runtime.aclose()
        bodies = client(runtime).bodies
    messages = log_messages(tmp_path / "st", name)
    [tool_message] = [m for m in messages if '"role":"tool"' in m]
    result = json.loads(tool_message)
    assert result["tool_call_id"] == "scripted-mcp-1"
    reading = json.loads(result["content"])  # mcp-server-time's own answer, as it sent it
    assert reading["timezone"] == "UTC"
    assert reading["datetime"].endswith("+00:00")
    # The request after the tool round carries the logged message byte for byte.
    assert tool_message.encode() in bodies[-1]
    perf = [r for r in log_requests(tmp_path / "st", name) if r.perf.outcome == "complete"]
    assert len(perf) == 2
    first_perf, follow = perf[0].perf, perf[1].perf
    assert first_perf.cache_n is not None
    assert first_perf.prompt_n is not None
    assert follow.cache_n is not None
    # Everything the server read and wrote in the first request is reused by the follow-up.
    expected = first_perf.cache_n + first_perf.prompt_n + (first_perf.predicted_n or 0) - 1
    assert follow.cache_n >= expected - 2, (first_perf, follow)
