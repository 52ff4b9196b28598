"""The soak's scripted tool rounds: what the relay answers in the model's place, and that loopd's
own stream parser reads it as the tool calls it means."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loopd.wire.assemble import StreamAssembler
from loopd.wire.events import EventDecoder
from soak.relay import scripted_stream
from soak.script import MARK_TOOL, Directive, ScriptedCall, directives_in, next_round

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": n}} for n in ("find_tool", "call_tool")]
ASK = Directive("t01m3", 2, 1)


def body(*messages: dict[str, Any], tools: list[Any] = TOOLS) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, *messages],
        "tools": tools,
    }


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*made: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(made)
        ],
    }


def find(tag: str) -> tuple[str, dict[str, Any]]:
    return ("find_tool", {"query": f"mark a ticket as done ({tag})"})


def mark(tag: str) -> tuple[str, dict[str, Any]]:
    return ("call_tool", {"name": MARK_TOOL, "arguments": {"tag": tag, "wait": 1}})


def test_the_directive_reads_back_from_its_text() -> None:
    assert directives_in(f"@u01: Please close these tickets. {ASK.text()}") == [ASK]
    assert directives_in("@u01: no tools here [soak-tool BAD x1 w0]") == []


def test_a_tool_request_gets_find_tool_then_every_call_then_the_real_server() -> None:
    asked = user(f"@u01: Please close these tickets. {ASK.text()}")
    first = next_round(body(asked))
    assert first == [
        ScriptedCall("find_tool", json.dumps({"query": "mark a ticket as done (t01m3)"}))
    ]
    second = next_round(body(asked, calls(find("t01m3"))))
    assert second is not None
    assert [json.loads(c.arguments)["arguments"]["tag"] for c in second] == [
        "t01m3-1",
        "t01m3-2",
    ]
    assert {c.name for c in second} == {"call_tool"}
    done = body(asked, calls(find("t01m3")), calls(mark("t01m3-1"), mark("t01m3-2")))
    assert next_round(done) is None


def test_only_the_calls_not_made_are_asked_again() -> None:
    asked = user(f"@u01: {ASK.text()}")
    again = next_round(body(asked, calls(find("t01m3")), calls(mark("t01m3-1"))))
    assert again is not None
    assert [json.loads(c.arguments)["arguments"]["tag"] for c in again] == ["t01m3-2"]


def test_an_answered_request_is_not_scripted_again() -> None:
    asked = user(f"@u01: {ASK.text()}")
    answered = {"role": "assistant", "content": "Done."}
    assert next_round(body(asked, answered, user("@u01: thanks"))) is None


def test_compaction_and_requests_without_call_tool_go_to_the_server() -> None:
    asked = user(f"@u01: {ASK.text()}")
    instruction = user("[loopd] This conversation is about to be compacted.")
    assert next_round(body(asked, instruction)) is None
    assert next_round(body(asked, tools=[])) is None
    assert next_round({"messages": "not a list", "tools": TOOLS}) is None


def test_a_summary_quoting_an_earlier_request_is_history_not_a_request() -> None:
    summary = user(
        "[loopd] The conversation so far (epoch 1) was compacted into this summary to fit the "
        f"model's context.\n\nNo summary could be written. The last messages were:\n"
        f"- user: @u01: {ASK.text()}\n- assistant: (called call_tool)"
    )
    assert next_round(body(summary, user("@u01: and now?"))) is None
    assert next_round(body(summary, user(f"@u01: {ASK.text()}"))) is not None


async def test_the_scripted_stream_is_a_tool_call_message_to_loopd() -> None:
    scripted = [
        ScriptedCall("call_tool", json.dumps({"name": MARK_TOOL, "arguments": {"tag": "a-1"}})),
        ScriptedCall("call_tool", json.dumps({"name": MARK_TOOL, "arguments": {"tag": "a-2"}})),
    ]
    decoder, assembler = EventDecoder(), StreamAssembler()
    async for chunk in scripted_stream(scripted, "smollm2"):
        assembler.apply_all(decoder.feed(chunk))
    assembler.apply_all(decoder.flush())
    assert assembler.problems == []
    assert assembler.finish_reason == "tool_calls"
    made = assembler.tool_calls
    assert [(c.name, json.loads(c.arguments)["arguments"]["tag"]) for c in made.values()] == [
        ("call_tool", "a-1"),
        ("call_tool", "a-2"),
    ]
    assert len({c.id for c in made.values()}) == 2
