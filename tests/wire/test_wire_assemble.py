"""StreamAssembler and AssistantMessage: exact assembly, outcomes, thinking count, wire form."""

from loopcommon.jsonbytes import dumps
from loopd.wire.assemble import AssistantMessage, StreamAssembler, StreamOutcome, ToolCall
from loopd.wire.events import (
    ChunkMeta,
    ContentDelta,
    Done,
    Finish,
    Foreign,
    KeepAlive,
    Malformed,
    Progress,
    ReasoningDelta,
    RoleStart,
    ServerError,
    StreamEvent,
    Timings,
    ToolCallDelta,
    Usage,
)

META = ChunkMeta("chatcmpl-abc", "smollm2")


def timings(predicted_n: int) -> Timings:
    return Timings(10, 5, predicted_n, 1.0, 2.0, 3.0, 4.0)


def assemble(*events: StreamEvent) -> StreamAssembler:
    assembler = StreamAssembler()
    assembler.apply_all(events)
    return assembler


def test_plain_answer_is_complete() -> None:
    assembler = assemble(
        META,
        Progress(20, 0, 20, 3.0),
        RoleStart(),
        META,
        RoleStart(),
        META,
        ContentDelta("Hel"),
        META,
        ContentDelta("lo"),
        META,
        Finish("stop"),
        timings(2),
        Done(),
    )
    assert assembler.completion_id == "chatcmpl-abc"
    assert assembler.model == "smollm2"
    assert assembler.content == "Hello"
    assert assembler.finish_reason == "stop"
    assert assembler.done
    assert assembler.progress == Progress(20, 0, 20, 3.0)
    assert assembler.timings == timings(2)
    assert assembler.outcome is StreamOutcome.COMPLETE
    assert assembler.problems == []
    assert assembler.message() == AssistantMessage("Hello")


def test_role_chunks_between_deltas_are_not_boundaries() -> None:
    assembler = assemble(
        RoleStart(), ContentDelta("a"), RoleStart(), ContentDelta("b"), Finish("stop"), Done()
    )
    assert assembler.content == "ab"


def test_reasoning_and_thinking_tokens_until_the_answer() -> None:
    assembler = assemble(
        META,
        Progress(9, 0, 9, 0.0),
        timings(0),  # progress chunks carry zeroed timings before any reasoning
        ReasoningDelta("Let me"),
        timings(3),
        ReasoningDelta(" think"),
        timings(4),
    )
    assert assembler.thinking_tokens == 4
    assembler.apply_all([ContentDelta("Answer"), timings(7), ReasoningDelta("more"), timings(9)])
    assert assembler.thinking_tokens == 4
    assert assembler.reasoning == "Let me thinkmore"
    assert assembler.timings == timings(9)


def test_no_thinking_tokens_without_reasoning() -> None:
    assembler = assemble(ContentDelta("Hi"), timings(1), ContentDelta("!"), timings(2))
    assert assembler.thinking_tokens == 0


def test_a_tool_call_ends_the_thinking_count() -> None:
    assembler = assemble(
        ReasoningDelta("r"), timings(2), ToolCallDelta(0, "i", "f", "{"), timings(5)
    )
    assert assembler.thinking_tokens == 2


def test_tool_call_fragments_concatenate_exactly() -> None:
    fragments = ['{"pa', 'th": ', '"a b.txt",  ', '"n":1.50', "}"]
    events: list[StreamEvent] = [ToolCallDelta(0, "Jx9", "read_file", fragments[0])]
    events += [ToolCallDelta(0, None, None, fragment) for fragment in fragments[1:]]
    assembler = assemble(*events, Finish("tool_calls"), Done())
    expected = ToolCall("Jx9", "read_file", '{"path": "a b.txt",  "n":1.50}')
    assert assembler.tool_calls == {0: expected}
    assert assembler.message() == AssistantMessage("", "", (expected,))
    assert assembler.outcome is StreamOutcome.COMPLETE


def test_several_tool_calls_come_out_in_index_order() -> None:
    assembler = assemble(
        ToolCallDelta(1, "b", "second", "{}"),
        ToolCallDelta(0, "a", "first", "{"),
        ToolCallDelta(0, None, None, "}"),
    )
    assert [call.name for call in assembler.message().tool_calls] == ["first", "second"]
    assert assembler.tool_calls[0].arguments == "{}"


def test_a_repeated_name_or_id_replaces_the_old_one() -> None:
    assembler = assemble(
        ToolCallDelta(0, "a", "read", '{"x"'),
        ToolCallDelta(0, None, "read_file", ":"),
        ToolCallDelta(0, "b", None, "1}"),
    )
    assert assembler.tool_calls[0] == ToolCall("b", "read_file", '{"x":1}')


def test_tool_call_without_name_is_a_problem() -> None:
    assembler = assemble(ToolCallDelta(0, "a", None, "{}"), Finish("tool_calls"), Done())
    assert assembler.problems == ["tool call 0 has no name"]
    assert assembler.outcome is StreamOutcome.ERROR


def test_stream_without_done_is_truncated() -> None:
    assembler = assemble(META, ContentDelta("partial"), Finish("stop"))
    assert assembler.outcome is StreamOutcome.TRUNCATED
    assert assembler.message().content == "partial"


def test_empty_stream_is_truncated() -> None:
    assert StreamAssembler().outcome is StreamOutcome.TRUNCATED


def test_done_without_finish_is_an_error() -> None:
    assembler = assemble(ContentDelta("x"), Done())
    assert assembler.problems == ["[DONE] without a finish_reason"]
    assert assembler.outcome is StreamOutcome.ERROR


def test_server_error_mid_stream_keeps_the_first_error() -> None:
    first = ServerError(500, "Context size has been exceeded.", "server_error")
    assembler = assemble(
        META, ReasoningDelta("hm"), first, ServerError(500, "later", "server_error")
    )
    assert assembler.server_error == first
    assert assembler.outcome is StreamOutcome.ERROR
    assert assembler.reasoning == "hm"


def test_malformed_chunk_is_an_error_even_with_done() -> None:
    assembler = assemble(ContentDelta("a"), Malformed("{", "not JSON"), Finish("stop"), Done())
    assert assembler.problems == ["malformed chunk (not JSON): '{'"]
    assert assembler.outcome is StreamOutcome.ERROR


def test_foreign_lines_and_pings_are_kept_but_harmless() -> None:
    assembler = assemble(
        KeepAlive(""), ContentDelta("a"), Finish("stop"), Done(), Foreign("proxy error: x")
    )
    assert assembler.foreign_lines == ["proxy error: x"]
    assert assembler.outcome is StreamOutcome.COMPLETE


def test_content_after_done_is_a_problem() -> None:
    assembler = assemble(Finish("stop"), Done(), ContentDelta("late"))
    assert assembler.problems == ["event after [DONE]: ContentDelta(text='late')"]
    assert assembler.outcome is StreamOutcome.ERROR


def test_second_finish_is_a_problem() -> None:
    assembler = assemble(Finish("stop"), Finish("length"), Done())
    assert assembler.finish_reason == "stop"
    assert assembler.problems == ["second finish_reason 'length' after 'stop'"]


def test_changed_completion_id_is_a_problem() -> None:
    assembler = assemble(META, ChunkMeta("chatcmpl-other", "smollm2"))
    assert assembler.completion_id == "chatcmpl-abc"
    assert assembler.problems == ["completion id changed from 'chatcmpl-abc' to 'chatcmpl-other'"]


def test_usage_is_kept() -> None:
    assert assemble(Usage(40, 7, 30)).usage == Usage(40, 7, 30)


def test_wire_form_of_a_plain_answer() -> None:
    assert dumps(AssistantMessage("Hi 🦙").to_wire()) == '{"role":"assistant","content":"Hi 🦙"}'


def test_wire_form_of_an_empty_answer_has_empty_content() -> None:
    assert dumps(AssistantMessage("").to_wire()) == '{"role":"assistant","content":""}'


def test_wire_form_with_reasoning_and_tool_calls() -> None:
    message = AssistantMessage(
        content="",
        reasoning_content="Need the file.",
        tool_calls=(ToolCall("Jx9", "read_file", '{"path": "a.txt"}'),),
    )
    assert dumps(message.to_wire()) == (
        '{"role":"assistant","content":null,"reasoning_content":"Need the file.",'
        '"tool_calls":[{"id":"Jx9","type":"function",'
        '"function":{"name":"read_file","arguments":"{\\"path\\": \\"a.txt\\"}"}}]}'
    )


def test_wire_form_keeps_content_beside_tool_calls() -> None:
    message = AssistantMessage("Reading it.", "", (ToolCall("i", "ls", "{}"),))
    wire = message.to_wire()
    assert list(wire) == ["role", "content", "tool_calls"]
    assert wire["content"] == "Reading it."


def test_arguments_that_are_not_json_are_replayed_untouched() -> None:
    # Only the server may judge arguments; the replay must be what it sent.
    message = AssistantMessage("", "", (ToolCall("i", "f", '{"a": 1'),))
    assert message.to_wire()["tool_calls"][0]["function"]["arguments"] == '{"a": 1'
