"""Contract findings (c) and (h) measured again on the tool model, whose calls are its own.

(c) A call's argument types survive the server's parser, and a replayed call renders through
this template: the template writes past calls itself, from the parsed arguments (``tojson``), so
what reaches the prompt is its serialisation, not the bytes loopd stored. (h) A tool added to
the array re-reads the conversation; the ``find_tool`` route (the schema as a tool result) keeps
the cache. Each test prints its figures (``-s``); docs/contract.md quotes them.
"""

from __future__ import annotations

import json

import pytest

from loopd_dev import devserver
from tests.contract.contract_kit import (
    CORE_TOOLS,
    GET_WEATHER,
    Endpoint,
    Message,
    complete,
    cost,
    tokens_before,
)

pytestmark = [pytest.mark.anyio, pytest.mark.real_server]

SYSTEM = {"role": "system", "content": "You are a terse assistant in a chat thread."}
ASK = {
    "role": "user",
    "content": "Run the command `echo \"a & b\" '<x>'` with run_command, with timeout_s 30.",
}


def endpoint(server: devserver.RunningServer) -> Endpoint:
    return Endpoint(server.url, devserver.TOOL_MODEL)


async def test_c_the_models_call_keeps_its_types_and_renders_by_the_template(
    tool_server: devserver.RunningServer,
) -> None:
    model = endpoint(tool_server)
    result = await complete(model, [SYSTEM, ASK], tools=CORE_TOOLS, id_slot=0, max_tokens=150)
    [call] = result.assembler.tool_calls.values()
    parsed = json.loads(call.arguments)
    assert result.assembler.finish_reason == "tool_calls"
    assert call.name == "run_command"
    assert parsed["timeout_s"] == 30
    assert type(parsed["timeout_s"]) is int
    assert "a & b" in parsed["command"]
    assert "<x>" in parsed["command"]

    def rendered_with(arguments: str) -> dict[str, object]:
        wire = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }
        messages: list[Message] = [
            SYSTEM,
            ASK,
            {"role": "assistant", "content": None, "tool_calls": [wire]},
            {"role": "tool", "tool_call_id": call.id, "content": "exit code 0\na & b <x>"},
        ]
        return {"model": model.model, "messages": messages, "tools": CORE_TOOLS}

    async with model.client() as client:
        as_streamed = await client.post_json("/apply-template", rendered_with(call.arguments), 30)
        compact = json.dumps(parsed, separators=(",", ":"))
        as_compact = await client.post_json("/apply-template", rendered_with(compact), 30)
    prompt = str(as_streamed["prompt"])
    # The call is written in the template's fence, its values unescaped ...
    assert '```json\n{"name": "run_command", "arguments": ' in prompt
    assert "&amp;" not in prompt
    assert "\\u003c" not in prompt
    assert "a & b <x>\n</tool_response>" in prompt
    # ... from the parsed arguments: other spacing of the same JSON renders the same prompt.
    assert as_compact["prompt"] == prompt
    verbatim = f'"arguments": {call.arguments}}}' in prompt
    print(f"(c) tool model: arguments {call.arguments}; rendered verbatim: {verbatim}")


async def test_h_a_new_tool_rereads_the_conversation_the_find_tool_route_does_not(
    tool_server: devserver.RunningServer,
) -> None:
    model = endpoint(tool_server)
    messages: list[Message] = [
        SYSTEM,
        {"role": "user", "content": "Use find_tool to find a weather tool."},
    ]
    first = await complete(model, messages, tools=CORE_TOOLS, id_slot=0, max_tokens=150)
    [found] = first.assembler.tool_calls.values()
    assert found.name == "find_tool"  # the model's own call
    # The same conversation with one more tool in the array.
    added = await complete(
        model, messages, tools=[*CORE_TOOLS, GET_WEATHER], id_slot=0, max_tokens=1
    )
    # The fixed array: the model's call replayed, the schema as its result.
    route = [*messages, first.replay()]
    schema = '{"name":"get_weather","parameters":{"city":"string"}}'
    route.append({"role": "tool", "tool_call_id": found.id, "content": schema})
    again = await complete(model, messages, tools=CORE_TOOLS, id_slot=0, max_tokens=1)
    after = await complete(model, route, tools=CORE_TOOLS, id_slot=0, max_tokens=1)
    body = {"model": model.model, "messages": messages, "tools": [*CORE_TOOLS, GET_WEATHER]}
    # This template writes the system text first and the tools after it: a new tool keeps the
    # system text and the old tools, and everything after them (the conversation) is read again.
    before_user = await tokens_before(model, body, messages[1]["content"])
    assert added.timings.cache_n < before_user, cost(added)
    # The route only appends: the slot's prompt (the fixed array, the conversation) is kept.
    held = again.timings.cache_n + again.timings.prompt_n
    assert after.timings.cache_n >= 0.9 * held, (cost(again), cost(after))
    print(
        f"(h) tool model: tool added: cache_n {added.timings.cache_n} of "
        f"{added.timings.cache_n + added.timings.prompt_n} (the user message starts at "
        f"{before_user}); find_tool route: cache_n {after.timings.cache_n}, prompt_n "
        f"{after.timings.prompt_n}"
    )
