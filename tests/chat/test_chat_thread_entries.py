"""A thread's recent entries, read from the end, give every derivation of the chat layer what
the session's whole log gives it."""

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.chat import threads
from loopd.contextwindow.compaction import INSTRUCTION, instruction_key
from loopd.sessionlog import SessionLog
from loopd.turnstop import record_stop
from tests.sessionlog.sessionlog_support import assistant_text, open_started, request_for

S = "mm:root"
_steps = st.lists(
    st.sampled_from(["user", "call", "answer", "stop", "instruction", "epoch"]), max_size=60
)


def _step(log: SessionLog, step: str, index: int) -> None:
    if step == "user":
        log.append_user(S, f"@ana: message {index}", external_key=f"k-{index}")
    elif step == "call":
        calls = [(f"call-{index}", "read_file", "{}")]
        log.append_assistant(S, assistant_text(calls=calls), request=request_for(log, S))
        log.append_tool_result(S, tool_call_id=f"call-{index}", content="text")
    elif step == "answer":
        log.append_assistant(S, assistant_text(f"answer {index}"), request=request_for(log, S))
    elif step == "stop":
        record_stop(log, S, "ana")
    elif step == "instruction":
        number = log.current_epoch(S).number
        log.append_user(S, INSTRUCTION, external_key=f"{instruction_key(S, number)}:{index}")
    else:
        log.start_epoch(S, reason="test", tools_text="[]", system_text=f"v{index}")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=_steps)
def test_recent_entries_derive_what_the_whole_log_derives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[str]
) -> None:
    monkeypatch.setattr(threads, "RECENT_ENTRIES", 2)  # so that the reads grow, as on long logs
    with open_started(tmp_path / f"{uuid.uuid4().hex}.db", S) as log:
        for index, step in enumerate(steps):
            _step(log, step, index)
            whole, recent = log.entries(S), threads.thread_entries(log, S)
            assert recent == whole[len(whole) - len(recent) :]  # a tail of the log
            answer = threads.latest_answer(whole)
            assert threads.latest_answer(recent) == answer
            assert threads.recent_turns(recent) == threads.recent_turns(whole)
            assert threads.requesters(recent) == threads.requesters(whole)
            if answer is not None:
                assert threads.since_last_turn(recent, answer.seq) == threads.since_last_turn(
                    whole, answer.seq
                )


def test_a_long_thread_is_read_from_its_end(tmp_path: Path) -> None:
    with open_started(tmp_path / "log.db", S) as log:
        for index in range(300):
            _step(log, "user", index)
            _step(log, "answer", index)
        recent = threads.thread_entries(log, S)
        assert len(recent) < threads.RECENT_ENTRIES
        assert threads.latest_answer(recent) == threads.latest_answer(log.entries(S))
