"""parse_payload and EventDecoder: every event kind, their order, and bad input as Malformed."""

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.wire.events import (
    ChunkMeta,
    ContentDelta,
    Done,
    EventDecoder,
    Finish,
    Foreign,
    KeepAlive,
    Malformed,
    Progress,
    ReasoningDelta,
    RoleStart,
    ServerError,
    Timings,
    ToolCallDelta,
    Usage,
    events_from_item,
    parse_payload,
)
from loopd.wire.sse import SSEComment, SSEData, SSEForeign

ID = "chatcmpl-0123456789abcdefghijABCDEFGHIJ"
META = ChunkMeta(ID, "smollm2")
TIMINGS = {
    "cache_n": 236,
    "prompt_n": 12,
    "prompt_ms": 30.9,
    "prompt_per_token_ms": 2.6,
    "prompt_per_second": 388.1,
    "predicted_n": 35,
    "predicted_ms": 661,
    "predicted_per_token_ms": 19.4,
    "predicted_per_second": 51.4,
}
TIMINGS_EVENT = Timings(236, 12, 35, 30.9, 661.0, 388.1, 51.4)


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A chunk object shaped like the server's, key order included."""
    choices = [] if delta is None else [{"finish_reason": finish, "index": 0, "delta": delta}]
    return {
        "choices": choices,
        "created": 1760000000,
        "id": ID,
        "model": "smollm2",
        "system_fingerprint": "b11434-abc",
        "object": "chat.completion.chunk",
        **extra,
    }


def parse(value: Any) -> list[Any]:
    return list(parse_payload(json.dumps(value, ensure_ascii=False)))


def test_content_delta() -> None:
    assert parse(chunk({"content": "Hel"})) == [META, ContentDelta("Hel")]


def test_reasoning_delta() -> None:
    assert parse(chunk({"reasoning_content": "Need"})) == [META, ReasoningDelta("Need")]


def test_role_chunk_with_null_content() -> None:
    assert parse(chunk({"role": "assistant", "content": None})) == [META, RoleStart()]


def test_progress_chunk_with_role_and_timings() -> None:
    progress = {"total": 5000, "cache": 4096, "processed": 4096, "time_ms": 0}
    value = chunk({"role": "assistant", "content": None}, prompt_progress=progress)
    value["timings"] = TIMINGS
    assert parse(value) == [META, Progress(5000, 4096, 4096, 0.0), RoleStart(), TIMINGS_EVENT]


def test_first_and_later_tool_call_deltas() -> None:
    first = {
        "index": 0,
        "id": "Jx9",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"pa'},
    }
    later = {"index": 0, "function": {"arguments": 'th": "a.txt"}'}}
    assert parse(chunk({"tool_calls": [first]})) == [
        META,
        ToolCallDelta(0, "Jx9", "read_file", '{"pa'),
    ]
    assert parse(chunk({"tool_calls": [later]})) == [
        META,
        ToolCallDelta(0, None, None, 'th": "a.txt"}'),
    ]


def test_tool_call_delta_without_arguments_has_an_empty_fragment() -> None:
    call = {"index": 1, "id": "k", "type": "function", "function": {"name": "ls"}}
    assert parse(chunk({"tool_calls": [call]})) == [META, ToolCallDelta(1, "k", "ls", "")]


def test_delta_keys_come_out_in_server_order() -> None:
    delta = {
        "tool_calls": [{"index": 0, "function": {"arguments": "{}"}}],
        "content": "c",
        "reasoning_content": "r",
    }
    assert parse(chunk(delta)) == [
        META,
        ReasoningDelta("r"),
        ContentDelta("c"),
        ToolCallDelta(0, None, None, "{}"),
    ]


def test_empty_text_deltas_are_dropped() -> None:
    assert parse(chunk({"content": "", "reasoning_content": ""})) == [META]


def test_finish_chunk_with_timings() -> None:
    assert parse(chunk({}, finish="tool_calls", timings=TIMINGS)) == [
        META,
        Finish("tool_calls"),
        TIMINGS_EVENT,
    ]


def test_usage_chunk_has_no_choices() -> None:
    usage = {
        "completion_tokens": 7,
        "prompt_tokens": 40,
        "total_tokens": 47,
        "prompt_tokens_details": {"cached_tokens": 30},
    }
    assert parse(chunk(usage=usage, timings=TIMINGS)) == [META, Usage(40, 7, 30), TIMINGS_EVENT]


def test_usage_without_details() -> None:
    usage = {"completion_tokens": 1, "prompt_tokens": 2}
    assert parse(chunk(usage=usage)) == [META, Usage(2, 1, None)]


def test_done() -> None:
    assert parse_payload("[DONE]") == [Done()]


def test_server_error() -> None:
    error = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "x"}}
    assert parse(error) == [ServerError(500, "Context size has been exceeded.", "x")]


def test_server_error_with_extra_fields_and_missing_code() -> None:
    error = {"error": {"message": "too long", "type": "exceed_context_size_error", "n_ctx": 4}}
    assert parse(error) == [ServerError(None, "too long", "exceed_context_size_error")]


def test_server_error_as_plain_string() -> None:
    assert parse({"error": "boom"}) == [ServerError(None, "boom", "")]


def test_unknown_keys_are_ignored() -> None:
    value = chunk({"content": "x", "new_field": [1]}, finish=None, newer={"a": 1})
    assert parse(value) == [META, ContentDelta("x")]


def test_unicode_survives() -> None:
    text = "🦙 中文 e\u0301"
    assert parse(chunk({"content": text})) == [META, ContentDelta(text)]


@pytest.mark.parametrize(
    ("item", "events"),
    [
        (SSEComment(""), [KeepAlive("")]),
        (SSEForeign("proxy error: gone"), [Foreign("proxy error: gone")]),
        (SSEData("[DONE]"), [Done()]),
    ],
)
def test_events_from_items(item: Any, events: list[Any]) -> None:
    assert events_from_item(item) == events


def bad(value: Any) -> str:
    """The reason parse_payload gives for a value that must be Malformed."""
    raw = json.dumps(value)
    [event] = parse_payload(raw)
    assert isinstance(event, Malformed)
    assert event.raw == raw
    return event.reason


def test_not_json() -> None:
    [event] = parse_payload('{"choices": [')
    assert isinstance(event, Malformed)
    assert event.raw == '{"choices": ['
    assert event.reason.startswith("not JSON")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([1, 2], "payload must be an object, got a list"),
        ("DONE", "payload must be an object, got a string"),
        ({**chunk(), "choices": {"0": {}}}, "'choices' must be a list, got an object"),
        ({**chunk(), "choices": None}, "'choices' must be a list, got null or nothing"),
        ({**chunk(), "id": 5}, "id must be a string, got a number"),
        ({k: v for k, v in chunk().items() if k != "model"}, "model must be a string"),
        (chunk({"content": 5}), "content must be a string, got a number"),
        (chunk({"reasoning_content": ["a"]}), "reasoning_content must be a string, got a list"),
        (chunk({"role": "user"}), "'role' must be 'assistant', got 'user'"),
        (chunk({"tool_calls": {"index": 0}}), "'tool_calls' must be a list"),
        (chunk({"tool_calls": ["x"]}), "tool call must be an object"),
        (chunk({"tool_calls": [{"function": {}}]}), "tool call 'index' must be an integer"),
        (chunk({"tool_calls": [{"index": True}]}), "got a boolean"),
        (
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": {"path": "a"}}}]}),
            "tool call 'arguments' must be a string, got an object",
        ),
        (chunk({"tool_calls": [{"index": 0, "function": "f"}]}), "'function' must be an object"),
        (chunk({"tool_calls": [{"index": 0, "function": {"name": 1}}]}), "'name' must be a string"),
        (chunk({"content": "x"}, finish=3), "finish_reason must be a string"),  # type: ignore[arg-type]
        ({**chunk(), "choices": [{"index": 1, "delta": {}}]}, "only choice 0 is supported"),
        ({**chunk(), "choices": ["x"]}, "choices[0] must be an object"),
        ({**chunk(), "choices": [{"delta": "x"}]}, "delta must be an object"),
        (chunk(timings={**TIMINGS, "predicted_n": "3"}), "timings 'predicted_n' must be an int"),
        (chunk(timings={"cache_n": 1}), "timings 'prompt_n' must be an integer"),
        (chunk(timings=[]), "timings must be an object"),
        (chunk(timings={**TIMINGS, "prompt_ms": 10**400}), "too large for a float"),
        (chunk(prompt_progress={"total": 1}), "prompt_progress 'cache' must be an integer"),
        (chunk(usage={"prompt_tokens": 1.5}), "usage 'prompt_tokens' must be an integer"),
        (
            chunk(usage={"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": 0}),
            "prompt_tokens_details must be an object",
        ),
        ({"error": {"code": "500"}}, "error 'code' must be an integer"),
        ({"error": {"message": None, "type": 1}}, "error 'type' must be a string"),
        ({"error": 1}, "error must be an object"),
    ],
)
def test_wrong_shapes_become_malformed(value: Any, reason: str) -> None:
    assert reason in bad(value)


def test_one_bad_part_makes_the_whole_chunk_malformed() -> None:
    # A chunk is trusted whole or not at all: half a chunk would assemble a message that never was.
    value = chunk({"content": "fine"}, timings={"cache_n": "x"})
    assert "timings 'cache_n'" in bad(value)


def test_deep_nesting_is_malformed_not_a_crash() -> None:
    raw = "[" * 100_000 + "]" * 100_000
    [event] = parse_payload(raw)
    assert isinstance(event, Malformed)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "delta",
                    "content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "index",
                    "id",
                    "model",
                    "error",
                    "timings",
                    "usage",
                    "prompt_progress",
                    "role",
                    "finish_reason",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_any_json_value_parses_without_raising(value: Any) -> None:
    events = parse_payload(json.dumps(value))
    assert events
    assert all(not isinstance(event, Done) for event in events)


@given(st.text(max_size=50))
def test_any_text_parses_without_raising(text: str) -> None:
    assert parse_payload(text)


def test_event_decoder_turns_bytes_into_events() -> None:
    body = (
        b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"hi"}}],'
        b'"id":"chatcmpl-1","model":"m"}\n\n:\n\ndata: [DONE]\n\nproxy error: late'
    )
    decoder = EventDecoder()
    assert decoder.feed(body[:40]) == []
    assert decoder.feed(body[40:]) == [
        ChunkMeta("chatcmpl-1", "m"),
        ContentDelta("hi"),
        KeepAlive(""),
        Done(),
    ]
    assert decoder.flush() == [Foreign("proxy error: late")]
