"""The chat state file (``chat.db``): versioned, append-only, and readable after an upgrade."""

import sqlite3
from pathlib import Path

import pytest

from loopd.chat.cursor import ChatState, ChatStateError, Cursor
from tests.storage.storage_support import add_migration_record, copied_fixture, query, schema

# Written before versions: by loopd 0.1.0, and by the loopd that added ``held`` (with held rows).
FIXTURES = ["chat-0.1.0.db", "chat-0.1.0-held.db"]


@pytest.fixture(params=FIXTURES)
def old_state(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    return copied_fixture(request.param, tmp_path)


def test_an_old_chat_state_reads_back_after_the_upgrade(old_state: Path) -> None:
    state = ChatState.open(old_state)
    try:
        assert state.cursor("chan-1") == Cursor(1_700_000_000_500, "post-b")
        assert state.cursor("chan-2") == Cursor(1_700_000_000_100, "post-c")
        saved = state.connection()
        assert saved is not None
        assert (saved.connection_id, saved.next_seq) == ("conn-2", 3)
        assert (state.seen("post-a"), state.seen("post-b"), state.seen("post-z")) == (
            "stored",
            "stopped",
            None,
        )
        assert state.thread_channel("root-1") == "chan-1"
        assert state.planned_parts("root-1#4") == 2
        assert state.posted_parts("root-1#4") == {0: "reply-1"}
        assert state.planned_parts("root-1#9") == 1
        state.advance("chan-1", 1_700_000_001_000, "post-d")  # and it takes new rows
        assert state.cursor("chan-1") == Cursor(1_700_000_001_000, "post-d")
    finally:
        state.close()
    # With no version before, every step ran, creating only what the file lacked.
    recorded = query(
        old_state, "SELECT name, applied_at IS NOT NULL FROM _migrations ORDER BY rowid"
    )
    assert recorded == [
        ("m001_initial", 1),
        ("m002_held", 1),
        ("m003_append_only", 1),
        ("m004_thread_labels", 1),
        ("m005_stops", 1),
    ]
    assert query(old_state, "PRAGMA user_version") == [(5,)]


def test_held_messages_are_kept_by_the_upgrade_and_can_still_be_released(tmp_path: Path) -> None:
    path = copied_fixture("chat-0.1.0-held.db", tmp_path)
    state = ChatState.open(path)
    try:
        assert state.held("mm:root-1") == [("post-h2", "second, still held ✓")]
        state.release("post-h2")  # held rows are the ones that are removed
        assert state.held("mm:root-1") == []
    finally:
        state.close()


def test_a_0_1_0_chat_state_gets_the_held_table(tmp_path: Path) -> None:
    state = ChatState.open(copied_fixture("chat-0.1.0.db", tmp_path))
    try:
        state.hold("post-x", "mm:root-1", "while busy")
        assert state.held("mm:root-1") == [("post-x", "while busy")]
    finally:
        state.close()


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM seen",
        "UPDATE seen SET decision = 'stored'",
        "DELETE FROM threads",
        "DELETE FROM connections",
        "DELETE FROM cursors",
        "DELETE FROM outbox",
    ],
)
def test_an_upgraded_chat_state_is_append_only(old_state: Path, statement: str) -> None:
    ChatState.open(old_state).close()
    conn = sqlite3.connect(old_state)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute(statement)
    conn.close()


def test_an_upgraded_chat_state_has_the_schema_of_a_new_one(
    old_state: Path, tmp_path: Path
) -> None:
    ChatState.open(old_state).close()
    ChatState.open(tmp_path / "new.db").close()
    assert schema(old_state) == schema(tmp_path / "new.db")


def test_a_chat_state_from_a_newer_loopd_is_refused_in_one_line(old_state: Path) -> None:
    ChatState.open(old_state).close()
    add_migration_record(old_state, "m006_later")
    with pytest.raises(ChatStateError) as raised:
        ChatState.open(old_state)
    message = str(raised.value)
    assert message.startswith(f"chat state {old_state}: schema version 6 (m006_later)")
    assert "\n" not in message


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    path.write_text("not a database\n" * 100)
    with pytest.raises(ChatStateError, match=f"chat state {path}: file is not a database"):
        ChatState.open(path)
