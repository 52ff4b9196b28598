"""The scripted session: 30 requests, replayable messages, one of them the recorded call."""

import json

import pytest

from bench.parsers import STREAMS
from bench.script import RECORDED_TOOL_CALL, SCRIPT, TOOLS, call_id, request_count, scripted
from loopcommon.jsonbytes import dumps
from loopd.sessionlog.assistant import tool_calls_of
from loopd.tools.spec import parse_tools_spec
from loopd.wire import EventDecoder, StreamAssembler


def test_the_session_has_30_requests_in_10_user_turns() -> None:
    assert request_count() == 30
    assert len(SCRIPT) == 10
    assert sum(1 for turn in SCRIPT for _ in turn.calls) == 20


def test_the_recorded_call_is_the_one_the_server_streamed() -> None:
    data = (STREAMS / "tool_call.sse").read_bytes()
    decoder, assembler = EventDecoder(), StreamAssembler()
    assembler.apply_all(decoder.feed(data))
    assembler.apply_all(decoder.flush())
    assert dumps(assembler.message().to_wire()) == RECORDED_TOOL_CALL
    assert SCRIPT[0].calls[0].message == RECORDED_TOOL_CALL
    assert SCRIPT[0].calls[0].recorded


def test_every_scripted_message_is_one_the_log_accepts() -> None:
    ids: list[str] = []
    for turn in SCRIPT:
        for call in turn.calls:
            refs = tool_calls_of(call.message)  # raises on a message the log would refuse
            assert [ref.id for ref in refs] == list(call.call_ids)
            assert len(call.results) == len(refs)
            ids.extend(call.call_ids)
    assert len(set(ids)) == len(ids)


def test_arguments_are_compact_json_as_the_server_streams_them() -> None:
    for turn in SCRIPT:
        for call in turn.calls:
            for tool_call in json.loads(call.message)["tool_calls"]:
                arguments = tool_call["function"]["arguments"]
                assert dumps(json.loads(arguments)) == arguments


def test_the_tools_are_a_valid_tools_file() -> None:
    spec = parse_tools_spec(dumps(TOOLS), source="bench")
    assert spec.names == ("read_file", "run_command")


def test_a_scripted_call_needs_one_result_per_call() -> None:
    with pytest.raises(ValueError, match="exactly one result"):
        scripted(1, 0, "think", [("read_file", "{}")])
    assert len(call_id(3, 4)) == 32
