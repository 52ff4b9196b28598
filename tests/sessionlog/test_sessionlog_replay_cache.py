"""replay_messages reads only the rows appended since its last build, and is never wrong for it."""

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.sessionlog import SessionLog
from tests.sessionlog.sessionlog_support import (
    SYSTEM,
    TOOLS,
    assistant_text,
    open_started,
    request_for,
)


def test_each_build_sees_the_rows_appended_since(tmp_path: Path) -> None:
    with open_started(tmp_path / "log.db") as log:
        first = log.replay_messages("thread-1")
        log.append_user("thread-1", "one", external_key="k1")
        second = log.replay_messages("thread-1")
        assert second[: len(first)] == first
        assert second[-1] == '{"role":"user","content":"one"}'
        first.append("changed by a caller")  # the caller's list is its own
        assert log.replay_messages("thread-1") == second


def test_a_new_epoch_starts_from_its_own_rows(tmp_path: Path) -> None:
    with open_started(tmp_path / "log.db") as log:
        log.append_user("thread-1", "one", external_key="k1")
        log.replay_messages("thread-1")
        log.start_epoch("thread-1", reason="test", tools_text=TOOLS, system_text="other")
        assert log.replay_messages("thread-1") == ['{"role":"system","content":"other"}']
        assert SYSTEM not in "".join(log.replay_messages("thread-1"))


def test_rows_of_a_rolled_back_transaction_are_never_kept(tmp_path: Path) -> None:
    with open_started(tmp_path / "log.db") as log:
        before = log.replay_messages("thread-1")
        seen: list[str] = []
        with pytest.raises(RuntimeError, match="roll back"):
            _append_then_fail(log, seen)
        assert seen[-1].endswith('"gone"}')  # visible inside the transaction
        assert log.replay_messages("thread-1") == before


def _append_then_fail(log: SessionLog, seen: list[str]) -> None:
    with log.transaction():
        log.append_user("thread-1", "gone", external_key="k-gone")
        seen.extend(log.replay_messages("thread-1"))
        raise RuntimeError("roll back")


def test_another_connection_sees_what_this_one_appended(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with open_started(path) as writer, SessionLog.open(path) as reader:
        reader.replay_messages("thread-1")
        writer.append_user("thread-1", "late", external_key="k-late")
        assert reader.replay_messages("thread-1")[-1].endswith('"late"}')


# One step of a session: a user message, an assistant message calling a tool and its result,
# an answer, a note, or a new epoch; after each, the replay is read while a turn holds it.
_steps = st.lists(st.sampled_from(["user", "call", "answer", "note", "epoch"]), max_size=40)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=_steps)
def test_the_replay_extended_during_a_turn_equals_a_full_read(
    tmp_path: Path, steps: list[str]
) -> None:
    path = tmp_path / f"log-{uuid.uuid4().hex}.db"
    with open_started(path) as log, SessionLog.open(path) as fresh:
        with log.holding_replay("thread-1"):
            for index, step in enumerate(steps):
                _step(log, step, index)
                held = log.replay_messages("thread-1")
                # A log with no cache reads the epoch whole: the extended replay is the same.
                assert held == fresh.replay_messages("thread-1")
        assert "thread-1" not in log._replayed  # the session's text is let go after its turn
        assert log.replay_messages("thread-1") == fresh.replay_messages("thread-1")


def _step(log: SessionLog, step: str, index: int) -> None:
    if step == "user":
        log.append_user("thread-1", f"message {index}", external_key=f"k-{index}")
    elif step == "call":
        calls = [(f"call-{index}", "read_file", '{"path": "a"}')]
        log.append_assistant(
            "thread-1", assistant_text(calls=calls), request=request_for(log, "thread-1")
        )
        log.append_tool_result("thread-1", tool_call_id=f"call-{index}", content="a's text")
    elif step == "answer":
        log.append_assistant(
            "thread-1", assistant_text(f"answer {index}"), request=request_for(log, "thread-1")
        )
    elif step == "note":
        log.append_note("thread-1", f"note {index}")
    else:
        log.start_epoch("thread-1", reason="test", tools_text=TOOLS, system_text=f"v{index}")
