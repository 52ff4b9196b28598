"""Acceptance property: request k+1 begins, byte for byte, with request k and its answer."""

import itertools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.sessionlog import SessionLog, messages_array
from loopd.sessionlog.verify import verify
from tests.sessionlog.sessionlog_support import SYSTEM, TOOLS, request_for

S = "thread"

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
separators = st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :  "), (",\n", ":\t")])


@st.composite
def odd_json(draw: st.DrawFn, value: Any) -> str:
    """``value`` as JSON with arbitrary spacing, indentation, escaping and key order."""
    if isinstance(value, dict):
        keys = draw(st.permutations(list(value)))
        value = {key: value[key] for key in keys}
    return json.dumps(
        value,
        separators=draw(separators),
        indent=draw(st.sampled_from([None, 1, "\t"])),
        ensure_ascii=draw(st.booleans()),
    )


@st.composite
def assistant_messages(draw: st.DrawFn, call_prefix: str) -> tuple[str, list[str]]:
    """An assistant message as assembled from a stream, and the ids of its tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.text())}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(st.text())
    calls = []
    for index in range(draw(st.integers(0, 3))):
        arguments = draw(odd_json(draw(st.dictionaries(st.text(max_size=8), json_values))))
        name = draw(st.sampled_from(["read_file", "write_file", "call_tool"]))
        call = {"id": f"{call_prefix}-{index}", "type": "function"}
        call["function"] = {"name": name, "arguments": arguments}  # type: ignore[assignment]
        calls.append(call)
    if calls:
        message["tool_calls"] = calls
    return draw(odd_json(message)), [str(call["id"]) for call in calls]


@dataclass(frozen=True)
class Sent:
    epoch: int
    messages: list[str]
    answer: str


steps = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.text()),
        st.tuples(st.just("assistant"), st.booleans()),  # answer the calls it makes?
        st.tuples(st.just("epoch"), st.booleans()),  # carry the conversation over?
        st.tuples(st.just("broken"), st.text(max_size=30)),
        st.tuples(st.just("note"), st.text(max_size=30)),
    ),
    max_size=14,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=steps, data=st.data())
def test_each_request_extends_the_previous_one_byte_for_byte(
    steps: list[tuple[str, Any]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = SessionLog.open(Path(directory) / "loopd.db")
        log.ensure_session(S, 0)
        log.start_epoch(S, reason="start", tools_text=TOOLS, system_text=SYSTEM)
        sent = _play(log, steps, data)
        assert verify(log) == []
        log.close()
    for before, after in itertools.pairwise(sent):
        if before.epoch != after.epoch:
            continue
        expected = [*before.messages, before.answer]
        assert after.messages[: len(expected)] == expected
        assert messages_array(after.messages).startswith(messages_array(expected)[:-1])


def _play(log: SessionLog, steps: list[tuple[str, Any]], data: st.DataObject) -> list[Sent]:
    sent: list[Sent] = []
    for number, (step, arg) in enumerate(steps):
        if step == "user":
            log.append_user(S, arg, external_key=f"post-{number}")
        elif step == "epoch":
            tools = data.draw(st.sampled_from([TOOLS, "[]", '[ {"type" : "function"} ]']))
            log.start_epoch(S, reason="change", tools_text=tools, system_text="s", carry_over=arg)
            assert log.current_epoch(S).tools_text == tools
        elif step == "broken":
            log.append_broken(S, partial_text=arg, reason="stream broke")
        elif step == "note":
            log.append_note(S, arg)
        else:
            sent.append(_request(log, number, answer_calls=arg, data=data))
    return sent


def _request(log: SessionLog, number: int, *, answer_calls: bool, data: st.DataObject) -> Sent:
    for call in log.state(S).interrupted_calls:  # a request only follows answered calls
        log.append_tool_result(S, tool_call_id=call.call_id, content="interrupted")
    messages = log.replay_messages(S)
    answer, call_ids = data.draw(assistant_messages(f"call-{number}"))
    log.append_assistant(S, answer, request=request_for(log, S))
    assert log.replay_messages(S) == [*messages, answer]
    if answer_calls:
        for call_id in data.draw(st.permutations(call_ids)):
            log.append_tool_result(S, tool_call_id=call_id, content=data.draw(st.text()))
    return Sent(log.current_epoch(S).number, messages, answer)
