"""Recorded llama-server streams (tests/data/streams, see scripts/record_streams.py).

The property that matters most: however the network splits a response, the events and the
assembled message are the same as when the body arrives whole.
"""

import functools
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.wire import (
    AssistantMessage,
    EventDecoder,
    Foreign,
    KeepAlive,
    ServerError,
    SSEDecoder,
    SSEItem,
    StreamAssembler,
    StreamEvent,
    StreamOutcome,
    ToolCall,
    ToolCallDelta,
    Usage,
    events_from_item,
)

STREAMS = Path(__file__).resolve().parent.parent / "data" / "streams"
RECORDED = {path.stem: path.read_bytes() for path in sorted(STREAMS.glob("*.sse"))}


def events_of(chunks: list[bytes]) -> list[StreamEvent]:
    decoder = EventDecoder()
    events: list[StreamEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events + decoder.flush()


def assembled(events: list[StreamEvent]) -> StreamAssembler:
    assembler = StreamAssembler()
    assembler.apply_all(events)
    return assembler


def test_the_recordings_are_there() -> None:
    assert set(RECORDED) >= {
        "plain",
        "usage",
        "thinking",
        "thinking_capped",
        "tool_call",
        "tool_call_streamed",
    }


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_stream_is_complete_and_well_formed(name: str) -> None:
    assembler = assembled(events_of([RECORDED[name]]))
    assert assembler.outcome is StreamOutcome.COMPLETE, assembler.problems
    assert assembler.completion_id is not None
    assert assembler.completion_id.startswith("chatcmpl-")
    assert assembler.model == "smollm2-135m"
    assert assembler.timings is not None
    assert assembler.foreign_lines == []


def test_plain_answer() -> None:
    assembler = assembled(events_of([RECORDED["plain"]]))
    assert assembler.message() == AssistantMessage("The capital of France is Paris.")
    assert assembler.finish_reason == "stop"
    assert assembler.thinking_tokens == 0
    assert assembler.progress is not None
    assert assembler.progress.processed == assembler.progress.total


def test_usage_chunk() -> None:
    assembler = assembled(events_of([RECORDED["usage"]]))
    assert assembler.timings is not None
    assert assembler.usage == Usage(
        prompt_tokens=assembler.timings.cache_n + assembler.timings.prompt_n,
        completion_tokens=assembler.timings.predicted_n,
        cached_tokens=assembler.timings.cache_n,
    )


def test_thinking_only() -> None:
    assembler = assembled(events_of([RECORDED["thinking"]]))
    message = assembler.message()
    assert message.content == ""
    assert message.reasoning_content.startswith("17 * 23")
    assert assembler.timings is not None
    assert assembler.thinking_tokens == assembler.timings.predicted_n


def test_thinking_ended_by_the_control_call() -> None:
    assembler = assembled(events_of([RECORDED["thinking_capped"]]))
    message = assembler.message()
    assert message.reasoning_content
    assert message.content
    assert assembler.timings is not None
    assert 0 < assembler.thinking_tokens < assembler.timings.predicted_n
    assert list(message.to_wire()) == ["role", "content", "reasoning_content"]


def test_tool_call() -> None:
    assembler = assembled(events_of([RECORDED["tool_call"]]))
    [call] = assembler.message().tool_calls
    assert call.name == "read_file"
    assert call.arguments == '{"path":"notes.txt"}'
    assert len(call.id) == 32
    assert assembler.message().to_wire()["content"] is None


def test_tool_call_streamed_fragment_by_fragment() -> None:
    events = events_of([RECORDED["tool_call_streamed"]])
    fragments = [event for event in events if isinstance(event, ToolCallDelta)]
    assert len(fragments) > 10
    [call] = assembled(events).message().tool_calls
    assert call == ToolCall(call.id, "read_file", call.arguments)
    assert call.arguments.startswith('{"path":"')


@functools.cache
def cached_events(item: SSEItem) -> tuple[StreamEvent, ...]:
    # parse_payload is pure, so a payload already parsed gives the same events again; caching
    # keeps the every-offset test about splitting, and fast enough to run on every stream.
    return tuple(events_from_item(item))


def events_via_cache(chunks: list[bytes]) -> list[StreamEvent]:
    decoder = SSEDecoder()
    items = [item for chunk in chunks for item in decoder.feed(chunk)] + decoder.flush()
    return [event for item in items for event in cached_events(item)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECORDED))
def test_split_at_every_byte_offset(name: str) -> None:
    body = RECORDED[name]
    whole = events_of([body])
    message = assembled(whole).message()
    assert events_via_cache([body]) == whole
    for offset in range(len(body) + 1):
        events = events_via_cache([body[:offset], body[offset:]])
        assert events == whole, f"split at byte {offset}"
        assert assembled(events).message() == message


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_one_byte_at_a_time(name: str) -> None:
    body = RECORDED[name]
    events = events_of([body[i : i + 1] for i in range(len(body))])
    assert events == events_of([body])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(RECORDED)), data=st.data())
def test_random_chunkings(name: str, data: st.DataObject) -> None:
    body = RECORDED[name]
    offsets = data.draw(st.lists(st.integers(0, len(body)), max_size=40).map(sorted))
    bounds = [0, *offsets, len(body)]
    chunks = [body[start:end] for start, end in pairwise(bounds)]
    events = events_of(chunks)
    assert events == events_of([body])
    assert assembled(events).message() == assembled(events_of([body])).message()


def test_crlf_framing_gives_the_same_events() -> None:
    body = RECORDED["thinking_capped"]
    assert events_of([body.replace(b"\n", b"\r\n")]) == events_of([body])


def test_pings_between_events_change_nothing_but_keep_alives() -> None:
    body = RECORDED["tool_call"]
    pinged = body.replace(b"\n\ndata: ", b"\n\n:\n\ndata: ")
    events = events_of([pinged])
    assert [event for event in events if not isinstance(event, KeepAlive)] == events_of([body])
    assert events.count(KeepAlive("")) == body.count(b"\n\ndata: ")


def test_stream_cut_before_done_is_truncated() -> None:
    body = RECORDED["plain"]
    cut = body[: body.rindex(b"data: [DONE]")]
    assembler = assembled(events_of([cut]))
    assert assembler.outcome is StreamOutcome.TRUNCATED
    assert assembler.finish_reason == "stop"
    assert assembler.message() == assembled(events_of([body])).message()


def test_stream_cut_mid_event_is_truncated_and_the_torn_chunk_is_malformed() -> None:
    body = RECORDED["plain"]
    cut = body[: len(body) // 2]
    assembler = assembled(events_of([cut]))
    assert assembler.outcome is StreamOutcome.ERROR
    assert any(problem.startswith("malformed chunk (not JSON") for problem in assembler.problems)


def test_error_mid_stream() -> None:
    body = RECORDED["thinking"]
    events_part = body.split(b"\n\n")
    error = (
        b'data: {"error":{"code":500,"message":"Context size has been exceeded.",'
        b'"type":"server_error"}}'
    )
    broken = b"\n\n".join([*events_part[:6], error]) + b"\n\n"
    assembler = assembled(events_of([broken]))
    assert assembler.server_error == ServerError(
        500, "Context size has been exceeded.", "server_error"
    )
    assert assembler.outcome is StreamOutcome.ERROR
    assert assembler.reasoning  # what came before the error is kept, for the log


def test_router_proxy_error_after_a_dead_child() -> None:
    body = RECORDED["tool_call_streamed"]
    cut = body[: body.index(b"data: ", len(body) // 2)]
    events = events_of([cut + b"proxy error: child process exited"])
    assert events[-1] == Foreign("proxy error: child process exited")
    assembler = assembled(events)
    assert assembler.outcome is StreamOutcome.TRUNCATED
    assert assembler.foreign_lines == ["proxy error: child process exited"]
