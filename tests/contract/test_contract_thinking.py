"""Finding (e): what thinking costs the prompt cache under each kind of template."""

from __future__ import annotations

import pytest

from tests.contract.conftest import Record
from tests.contract.contract_kit import (
    CORE_TOOLS,
    Endpoint,
    Message,
    Streamed,
    Target,
    carried_forward,
    complete,
    cost,
    hybrid_resume_point,
    tokens_before,
)

pytestmark = pytest.mark.anyio

SYSTEM = "You answer questions about gardening."
# Tools as in the production measurement (docs/design, behaviour (e)); they also sit above the
# system text the edit changes.


def opening(system: str = SYSTEM) -> list[Message]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "When should I plant tulips?"},
    ]


async def two_turns(endpoint: Endpoint, slot: int) -> tuple[Streamed, Streamed, list[Message]]:
    """A first turn, then a second that replays the first exactly."""
    messages = opening()
    first = await complete(endpoint, messages, id_slot=slot, tools=CORE_TOOLS)
    assert first.assembler.reasoning, "the model did not think"
    messages += [first.replay(), {"role": "user", "content": "And roses?"}]
    second = await complete(endpoint, messages, id_slot=slot, tools=CORE_TOOLS)
    return first, second, messages


async def test_e_thinking_and_the_cache_per_template(target: Target, record: Record) -> None:
    """Keeping every turn's reasoning costs only new tokens; a template that drops past
    reasoning, or a client that drops reasoning_content, re-reads the last answer; an edit
    early in the prompt re-reads everything."""
    first, kept, messages = await two_turns(target.keep, 0)
    if target.hybrid:
        assert kept.timings.cache_n == hybrid_resume_point(first)
    else:
        assert kept.timings.cache_n == carried_forward(first)

    drop_first, dropped_by_template, _ = await two_turns(target.drop, 0)
    drop_prompt = drop_first.timings.cache_n + drop_first.timings.prompt_n
    assert dropped_by_template.timings.cache_n < carried_forward(drop_first)
    assert dropped_by_template.timings.cache_n <= drop_prompt

    without_reasoning = [*messages[:2], {**messages[2], "reasoning_content": ""}, messages[3]]
    if not without_reasoning[2]["reasoning_content"]:
        del without_reasoning[2]["reasoning_content"]
    dropped_by_client = await complete(target.keep, without_reasoning, id_slot=0, tools=CORE_TOOLS)
    first_prompt = first.timings.cache_n + first.timings.prompt_n
    assert dropped_by_client.timings.cache_n <= first_prompt

    edited = [{"role": "system", "content": "Be brief. " + SYSTEM}, *messages[1:]]
    reread = await complete(target.keep, edited, id_slot=0, tools=CORE_TOOLS)
    total = reread.timings.cache_n + reread.timings.prompt_n
    body = {"model": target.keep.model, "messages": edited, "tools": CORE_TOOLS}
    before_edit = await tokens_before(target.keep, body, "Be brief.")
    # One token of slack: the tokens at the seam need not split where the text does.
    assert reread.timings.cache_n <= before_edit + 1, "text after an early edit was reused"
    record(
        "e",
        target.kind,
        f"next turn prompt_n: reasoning kept {kept.timings.prompt_n}, dropped by the template "
        f"{dropped_by_template.timings.prompt_n}, dropped by the client "
        f"{dropped_by_client.timings.prompt_n}; early edit (after {before_edit} tokens of "
        f"tools) cache_n {reread.timings.cache_n} of {total}",
        kept=cost(kept),
        dropped_by_template=cost(dropped_by_template),
        dropped_by_client=cost(dropped_by_client),
        early_edit=cost(reread),
    )
