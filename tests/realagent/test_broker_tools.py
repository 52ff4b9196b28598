"""The tool model through brokerd: its own ``find_tool`` and ``call_tool`` calls, on a catalogue
tool and on a real MCP server (mcp-server-time); and a call whose arguments fail the tool's
schema gets the schema error as its result while the turn goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.wire.assemble import ToolCall
from loopd_dev import devserver
from tests.mcp.support import broker_with, time_server
from tests.realagent.support import Agent, agent
from tests.toolrounds.test_tool_rounds import broker

# The tool model's rounds are bounded by tokens (and the repeat guard); on two cores shared with
# another test run a round can take a minute, so the safety net is wider than the suite's 300 s.
pytestmark = [pytest.mark.anyio, pytest.mark.real_server, pytest.mark.timeout(1200)]


def content(agent: Agent, session: str, call: ToolCall) -> str:
    text: str = json.loads(agent.result_of(session, call))["content"]
    return text


def call_of(calls: list[ToolCall], name: str) -> ToolCall | None:
    """The model's first call_tool of the tool ``name``."""
    for call in calls:
        if call.name == "call_tool" and json.loads(call.arguments).get("name") == name:
            return call
    return None


async def test_find_tool_then_call_tool_on_a_catalogue_tool_then_a_schema_error(
    tool_server: devserver.RunningServer, tmp_path: Path
) -> None:
    # The catalogue of one tool, echo_text (tests/toolrounds).
    async with broker(tmp_path) as broker_url, agent(tool_server, tmp_path / "st", broker_url) as a:
        _, searched = await a.turn("echo", 'Use find_tool with the query "echo a text".')
        found = content(a, "echo", searched[0])
        _, calls = await a.turn(
            "echo", 'Call echo_text with call_tool, with the arguments {"text": "hi"}.'
        )
        called = call_of(calls, "echo_text")
        echoed = content(a, "echo", called) if called else None
        wrong, wrong_calls = await a.turn(
            "echo", 'Call echo_text with call_tool, with the arguments {"words": "hi"}.'
        )
        refused = call_of(wrong_calls, "echo_text")
        refused_result = a.result_of("echo", refused) if refused else ""
        bodies = a.client.bodies[-len(wrong.requests) :]
    assert searched[0].name == "find_tool", searched
    assert "echo_text" in found
    assert called is not None, calls
    assert json.loads(called.arguments)["arguments"] == {"text": "hi"}
    assert (echoed or "").strip() == "echo: hi"
    # Arguments that fail the schema: brokerd's error is the result, nothing ran, and the turn
    # went on: a next request carried the error to the model.
    assert refused is not None, wrong_calls
    assert json.loads(refused.arguments)["arguments"] == {"words": "hi"}
    error = json.loads(refused_result)["content"]
    assert error.startswith('call_tool: the arguments for "echo_text" do not match'), error
    assert "Nothing was run" in error
    assert any(refused_result.encode() in body for body in bodies[1:])


async def test_find_tool_then_call_tool_on_a_real_mcp_server(
    tool_server: devserver.RunningServer, tmp_path: Path
) -> None:
    async with (
        broker_with(tmp_path, [time_server()]) as broker,
        agent(tool_server, tmp_path / "st", broker.url) as a,
    ):
        _, searched = await a.turn("time", 'Use find_tool with the query "current time".')
        found = content(a, "time", searched[0])
        _, calls = await a.turn(
            "time",
            'Call time.get_current_time with call_tool, with the arguments {"timezone": "UTC"}.',
        )
        called = call_of(calls, "time.get_current_time")
        reading = json.loads(content(a, "time", called)) if called else {}
    assert searched[0].name == "find_tool", searched
    assert "time.get_current_time" in found
    assert called is not None, calls
    assert json.loads(called.arguments)["arguments"] == {"timezone": "UTC"}
    assert reading["timezone"] == "UTC"  # mcp-server-time's own answer
    assert reading["datetime"].endswith("+00:00")
