"""Prefix caching with the real server's arithmetic, and the pure tokenizer/renderer under it."""

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    ScriptedReply,
    ScriptedToolCall,
    TemplateOptions,
)
from loopd_dev.fakes.llama.messages import Message
from loopd_dev.fakes.llama.render import render_prompt
from loopd_dev.fakes.llama.slots import reusable_prefix
from loopd_dev.fakes.llama.tokenize import tokenize
from tests.fakes.llama.llama_fake_testkit import (
    assistant_from_events,
    chat_body,
    parse_events,
    serving,
    stream_raw,
    user,
)

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@given(st.text(), st.text())
def test_tokenizing_after_a_newline_is_prefix_stable(head: str, tail: str) -> None:
    prompt = head + "<|im_start|>assistant\n"
    assert tokenize(prompt + tail)[: len(tokenize(prompt))] == tokenize(prompt)


def test_reusable_prefix_always_leaves_one_token() -> None:
    prompt = ["a", "b", "c"]
    assert reusable_prefix(prompt, ["a", "b", "c", "d"], cache_prompt=True) == 2
    assert reusable_prefix(prompt, ["a", "x"], cache_prompt=True) == 1
    assert reusable_prefix(prompt, ["a", "b", "c"], cache_prompt=False) == 0


def test_reasoning_is_rendered_unless_dropped() -> None:
    turns = [
        Message("user", "q1"),
        Message("assistant", "a1", reasoning="r1"),
        Message("user", "q2"),
    ]
    kept = render_prompt(turns, [])
    dropped = render_prompt(turns, [], TemplateOptions(drop_past_reasoning=True))
    assert "<think>\nr1\n</think>\n\na1" in kept
    assert "r1" not in dropped
    assert "a1" in dropped
    assert kept.endswith("<|im_start|>assistant\n")


def test_tools_sit_at_the_top_of_the_system_block() -> None:
    prompt = render_prompt([Message("system", "Be brief."), Message("user", "hi")], TOOLS)
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert prompt.index('"read_file"') < prompt.index("Be brief.")


async def _turn(
    client: Any, messages: list[dict[str, Any]], **extra: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    body = chat_body(*messages, tools=TOOLS, stream=True, id_slot=0, **extra)
    events = parse_events(await stream_raw(client, body))
    return assistant_from_events(events), events[-2]["timings"]


async def test_exact_replay_reuses_everything_then_an_edit_does_not() -> None:
    fake = FakeLlama()
    fake.push(
        ScriptedReply(
            reasoning="Look first.", tool_calls=(ScriptedToolCall("read_file", '{"path": "a"}'),)
        ),
        ScriptedReply(reasoning="Got it.", content="The file says hello."),
        ScriptedReply(reasoning="Short.", content="Bye."),
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        user("What is in a?"),
    ]
    timings = []
    async with serving(fake) as (_, client):
        for follow_up in (
            lambda m: {
                "role": "tool",
                "tool_call_id": m["tool_calls"][0]["id"],
                "content": "hello",
            },
            lambda m: user("Thanks, bye."),
            None,
        ):
            assistant, t = await _turn(client, messages)
            timings.append(t)
            messages.append(assistant)
            if follow_up is not None:
                messages.append(follow_up(assistant))
        assert timings[0]["cache_n"] == 0
        for before, after in itertools.pairwise(timings):
            expected = before["cache_n"] + before["prompt_n"] + before["predicted_n"] - 1
            assert after["cache_n"] == expected
            assert 0 < after["prompt_n"] < 40
        edited = [dict(m) for m in messages]
        edited[1] = user("What is in b?")
        _, after_edit = await _turn(client, edited)
        assert 0 < after_edit["cache_n"] < timings[0]["prompt_n"]
        _, no_cache = await _turn(client, messages, cache_prompt=False)
        assert no_cache["cache_n"] == 0
    records = fake.chat_records()
    assert [r.cache_n for r in records[:3]] == [t["cache_n"] for t in timings]
    assert all(r.slot == 0 and r.outcome == "ok" for r in records)


async def test_changing_tools_invalidates_the_whole_prefix() -> None:
    fake = FakeLlama()
    messages = [{"role": "system", "content": "You are terse."}, user("hello there")]
    async with serving(fake) as (_, client):
        assistant, first = await _turn(client, messages)
        messages += [assistant, user("again")]
        more_tools = [*TOOLS, {"type": "function", "function": {"name": "ls", "parameters": {}}}]
        body = chat_body(*messages, tools=more_tools, stream=True, id_slot=0)
        second = parse_events(await stream_raw(client, body))[-2]["timings"]
    assert second["cache_n"] <= 15  # only "<|im_start|>system\n# Tools ... these"
    assert second["prompt_n"] > first["prompt_n"]


async def test_drop_past_reasoning_rereads_the_previous_answer() -> None:
    keep = FakeLlama()
    drop = FakeLlama([ModelSpec(template=TemplateOptions(drop_past_reasoning=True))])
    results = []
    for fake in (keep, drop):
        messages = [user("first question here")]
        async with serving(fake) as (_, client):
            assistant, first = await _turn(client, messages)
            messages += [assistant, user("second")]
            _, second = await _turn(client, messages)
        results.append(second["cache_n"] - first["prompt_n"])
    assert results[0] > results[1]


async def test_unpinned_request_picks_the_slot_with_its_prefix() -> None:
    fake = FakeLlama()
    long_text = "shared words " * 30
    async with serving(fake) as (_, client):
        await client.post("/v1/chat/completions", json=chat_body(user("other " * 40), id_slot=0))
        await client.post("/v1/chat/completions", json=chat_body(user(long_text), id_slot=1))
        await client.post("/v1/chat/completions", json=chat_body(user(long_text + "more")))
    assert fake.chat_records()[-1].slot == 1
    assert (fake.chat_records()[-1].cache_n or 0) > 30
