"""Findings (b) and (h): exact replay keeps the prompt cache; a new tool invalidates all of it."""

from __future__ import annotations

import pytest

from tests.contract.conftest import Record
from tests.contract.contract_kit import (
    CORE_TOOLS,
    GET_WEATHER,
    Message,
    Target,
    carried_forward,
    complete,
    cost,
    hybrid_resume_point,
    tokens_before,
)

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are a terse assistant in a chat thread."}


async def test_b_cache_reuse_over_three_turns_with_tools(target: Target, record: Record) -> None:
    """Each request, replaying the last reply exactly, processes only its new tokens."""
    messages: list[Message] = [SYSTEM]
    costs = []
    previous = None
    for question in ("Name a colour.", "Name a fruit.", "Name a tree."):
        messages.append({"role": "user", "content": question})
        result = await complete(target.keep, messages, tools=CORE_TOOLS, id_slot=0)
        costs.append(cost(result))
        if previous is not None and target.hybrid:
            # Its replies never replay token for token: back to the checkpoint, then the reply.
            assert result.timings.cache_n == hybrid_resume_point(previous), costs
            assert result.timings.prompt_n < 40 + previous.timings.predicted_n, costs
        elif previous is not None:
            assert result.timings.cache_n == carried_forward(previous), costs
            assert result.timings.prompt_n < 40, f"more than the new message was read: {costs}"
        messages.append(result.replay())
        previous = result
    record(
        "b",
        target.kind,
        " / ".join(f"cache_n {c} prompt_n {p}" for c, p, _ in costs),
        costs=costs,
    )


async def test_h_new_tool_invalidates_the_prompt_find_tool_route_does_not(
    target: Target, record: Record
) -> None:
    """A tool added mid-session re-reads everything; a schema that arrives as a tool result and
    a call through the fixed call_tool keep the cache."""
    messages: list[Message] = [SYSTEM, {"role": "user", "content": "What is the weather?"}]
    first = await complete(target.keep, messages, tools=CORE_TOOLS, id_slot=1)
    messages.append(first.replay())
    messages.append({"role": "user", "content": "Look for a weather tool."})
    # The same conversation with one more tool in the array.
    added = await complete(target.keep, messages, tools=[*CORE_TOOLS, GET_WEATHER], id_slot=1)
    # Back to the fixed array: find_tool is called and its result carries the new schema.
    route = list(messages)
    route += target.tool_call(target.keep, "find_tool", {"query": "weather"})
    found = await complete(target.keep, route, tools=CORE_TOOLS, id_slot=1, max_tokens=40)
    assert [c.name for c in found.assembler.tool_calls.values()] == ["find_tool"]
    if route[-1]["role"] == "assistant":
        route.pop()  # the prefill: replaced by the message as the server returned it
    route.append(found.replay())
    call_id = found.assembler.tool_calls[0].id
    schema_text = '{"name":"get_weather","parameters":{"city":"string"}}'
    route.append({"role": "tool", "tool_call_id": call_id, "content": schema_text})
    after = await complete(target.keep, route, tools=CORE_TOOLS, id_slot=1)

    total_added = added.timings.cache_n + added.timings.prompt_n
    # Tools render above the system text: from there on, everything is read again.
    body = {"model": target.keep.model, "messages": messages, "tools": [*CORE_TOOLS, GET_WEATHER]}
    before_system = await tokens_before(target.keep, body, SYSTEM["content"])
    assert added.timings.cache_n < before_system, "a changed tools array kept the conversation"
    prompt_before_call = found.timings.cache_n + found.timings.prompt_n
    assert after.timings.cache_n >= 0.9 * prompt_before_call, cost(after)
    record(
        "h",
        target.kind,
        f"tool added: cache_n {added.timings.cache_n} of {total_added} (system text starts at "
        f"{before_system}); "
        f"find_tool route: cache_n {after.timings.cache_n}, prompt_n {after.timings.prompt_n}",
        added=cost(added),
        route=cost(after),
    )
