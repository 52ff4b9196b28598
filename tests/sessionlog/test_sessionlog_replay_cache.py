"""replay_messages reads only the rows appended since its last build, and is never wrong for it."""

from pathlib import Path

import pytest

from loopd.sessionlog import SessionLog
from tests.sessionlog.sessionlog_support import SYSTEM, TOOLS, open_started


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
