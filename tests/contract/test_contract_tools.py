"""Findings (c) and (n): tool calls keep their argument types, and stream as JSON fragments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.conftest import Record
from tests.contract.contract_kit import (
    CORE_TOOLS,
    Message,
    Target,
    complete,
)

pytestmark = pytest.mark.anyio

TRICKY_ARGUMENTS: dict[str, Any] = {
    "command": 'echo "a & b" \'<x>\' {"k": [1, 2]}',
    "timeout_s": 30,
    "headers": {"a": {"b": 1}},
}
ASK = {"role": "user", "content": "Run the command."}
# The tiny model rarely ends a call by itself: stopping at the closing tag ends the turn there.
STOP = ["</tool_call>"]


async def test_c_tool_call_arguments_keep_their_types(target: Target, record: Record) -> None:
    """Integers, nested objects, and strings with quotes, &, <> and JSON survive the parser."""
    messages: list[Message] = [ASK, *target.tool_call(target.keep, "run_command", TRICKY_ARGUMENTS)]
    result = await complete(
        target.keep, messages, tools=CORE_TOOLS, id_slot=0, max_tokens=120, stop=STOP
    )
    calls = list(result.assembler.tool_calls.values())
    assert [c.name for c in calls] == ["run_command"]
    parsed = json.loads(calls[0].arguments)
    for key, value in TRICKY_ARGUMENTS.items():
        assert parsed[key] == value
        assert type(parsed[key]) is type(value)
    record(
        "c",
        target.kind,
        f"arguments {calls[0].arguments}, finish_reason {result.assembler.finish_reason}",
        arguments=calls[0].arguments,
        finish_reason=result.assembler.finish_reason,
    )


async def test_c_tool_turns_render_arguments_verbatim(target: Target, record: Record) -> None:
    """/apply-template: tools sit above the system text; a replayed call and its result render
    with their values unescaped."""
    call = {
        "id": "call0",
        "type": "function",
        "function": {"name": "run_command", "arguments": json.dumps(TRICKY_ARGUMENTS)},
    }
    messages: list[Message] = [
        {"role": "system", "content": "SYSTEM-TEXT"},
        ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call0", "content": 'exit 0: "a & b" <x>'},
    ]
    body = {"model": target.keep.model, "messages": messages, "tools": CORE_TOOLS}
    async with target.keep.client() as client:
        prompt = (await client.post_json("/apply-template", body, 30))["prompt"]
    assert prompt.index('"run_command"') < prompt.index("SYSTEM-TEXT")
    # Each template writes the call in its own format; neither escapes &, < or >.
    assert "'<x>'" in prompt
    assert "&amp;" not in prompt
    assert "\\u003c" not in prompt
    assert 'exit 0: "a & b" <x>' in prompt
    assert prompt.count("run_command") >= 2  # the schema and the call
    record("c-render", target.kind, "tools above system text; values and result unescaped")


async def test_n_tool_call_arguments_stream_as_json_fragments(
    target: Target, record: Record
) -> None:
    """The call streams in pieces (first with id and name), and the pieces concatenate to JSON."""
    arguments = {"path": "notes.txt", "content": "Dear"}
    messages: list[Message] = [
        {"role": "user", "content": "Write a short letter to notes.txt."},
        *target.tool_call(target.keep, "write_file", arguments, open_last=True),
    ]
    result = await complete(
        target.keep, messages, tools=CORE_TOOLS, id_slot=1, max_tokens=40, stop=STOP
    )
    deltas = [d for d in result.tool_deltas if d.index == 0]
    assert deltas[0].id
    assert deltas[0].name == "write_file"
    assert all(d.id is None and d.name is None for d in deltas[1:])
    assert len(deltas) >= 3, "the call arrived in one piece"
    text = "".join(d.arguments for d in deltas)
    if target.hybrid:
        # Its random text never closes the value: the fragments are the call as far as it got.
        assert text == result.assembler.tool_calls[0].arguments
        assert text.startswith('{"path":"notes.txt","content":"Dear')
    else:
        parsed = json.loads(text)
        assert parsed["path"] == "notes.txt"
        assert parsed["content"].startswith("Dear")
    record(
        "n",
        target.kind,
        f"{len(deltas)} fragments concatenate to {text}",
        fragments=[d.arguments for d in deltas],
    )
