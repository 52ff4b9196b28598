"""A session log written by loopd 0.1.0 (``tests/data/db``) opens, migrates and reads back."""

from pathlib import Path

import pytest

from loopd.sessionlog import (
    EntryKind,
    InterruptedCall,
    Perf,
    RequestKind,
    SchemaTooNewError,
    SessionLog,
    StorageError,
)
from loopd.sessionlog import migrations as sessionlog_migrations
from loopd.sessionlog.verify import verify
from loopd.wire.assemble import ToolCall
from tests.sessionlog.sessionlog_support import assistant_text, request_for
from tests.storage.storage_support import add_migration_record, copied_fixture, query, schema

KINDS_OF_ALPHA = [
    *("epoch", "user", "assistant", "tool", "assistant", "user", "broken", "note"),
    # Epoch 2: the conversation carried over, then a turn with two calls, one answered.
    *("epoch", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"),
]


@pytest.fixture
def old_log(tmp_path: Path) -> Path:
    return copied_fixture("loopd-0.1.0.db", tmp_path)


def test_a_0_1_0_log_verifies_after_the_upgrade(old_log: Path) -> None:
    with SessionLog.open(old_log, create=False) as log:
        # The hash chain of 0.1.0, recomputed from the fields as read now: same order, same bytes.
        assert verify(log) == []
    applied = query(old_log, "SELECT name, applied_at FROM _migrations ORDER BY name")
    assert applied[0] == ("m001_initial", None)  # applied by 0.1.0, counted in user_version only
    assert [name for name, _ in applied] == list(sessionlog_migrations.MIGRATIONS.names)
    assert applied[1][1] is not None  # the indexes of the per-request reads, added on opening
    assert query(old_log, "PRAGMA user_version") == [(len(applied),)]


def test_the_upgrade_adds_the_indexes_of_the_per_request_reads(old_log: Path) -> None:
    indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    before = {name for (name,) in query(old_log, indexes)}
    with SessionLog.open(old_log, create=False) as log:
        states = {name: log.state(name) for name in ("alpha", "beta")}
        counted = [
            r
            for r in log.requests("alpha")
            if r.record.kind is not RequestKind.SELFTEST and r.record.perf.cache_n is not None
        ]
        assert log.latest_request("alpha", counted=True) == counted[-1]
        assert [e.seq for e in log.epoch_entries("alpha", 2)] == list(range(9, 17))
    after = {name for (name,) in query(old_log, indexes)}
    assert after - before == {"entries_by_epoch", "entries_by_epoch_kind", "requests_by_epoch"}
    with SessionLog.open(old_log, create=False) as log:  # opened again: nothing more to do
        assert {name: log.state(name) for name in ("alpha", "beta")} == states


def test_a_0_1_0_log_reads_back_what_was_written(old_log: Path) -> None:
    with SessionLog.open(old_log, create=False) as log:
        assert [(s.name, s.slot) for s in log.sessions()] == [("alpha", 1), ("beta", 0)]
        entries = log.entries("alpha")
        assert [e.kind.value for e in entries] == KINDS_OF_ALPHA
        broken, note = entries[6], entries[7]
        assert (broken.kind, broken.fields.text, broken.fields.reason) == (
            EntryKind.BROKEN,
            "It has",
            "stream ended",
        )
        assert (note.fields.text, note.fields.refers_to) == ("the stream broke; retried", 7)
        assert entries[1].fields.external_key == "post-1"
        assert entries[0].fields.created_at == "2025-01-02T03:04:07.000000+00:00"
        assert [e.reason for e in log.epochs("alpha")] == ["new session", "tool set changed"]
        requests = log.requests("alpha")
        assert [r.record.kind for r in requests] == [
            RequestKind.TURN,
            RequestKind.TOOL_FOLLOWUP,
            RequestKind.TURN,
            RequestKind.SELFTEST,
            RequestKind.TURN,
        ]
        assert requests[0].record.perf == Perf(
            cache_n=0, prompt_n=120, predicted_n=30, ttfb_ms=85.5, thinking_tokens=12
        )
        assert requests[1].record.perf.capped
        assert requests[1].record.perf.extra == {"note": "x"}
        assert broken.fields.request_id == requests[2].id
        assert log.state("beta").pending_turn


def test_the_interrupted_call_of_a_0_1_0_log_is_the_call_as_streamed(old_log: Path) -> None:
    with SessionLog.open(old_log, create=False) as log:
        state = log.state("alpha")
    arguments = '{"name": "gate", "arguments": {"x": 1}}'
    assert state.interrupted_calls == (
        InterruptedCall(ToolCall("call_b2", "call_tool", arguments), assistant_seq=15),
    )


def test_appends_to_an_upgraded_log_chain_onto_its_entries(old_log: Path) -> None:
    with SessionLog.open(old_log) as log:
        log.append_tool_result("alpha", tool_call_id="call_b2", content="opened")
        log.append_assistant(
            "alpha", assistant_text("The gate is open."), request=request_for(log, "alpha")
        )
        log.append_user("beta", "Still there?", external_key="local-beta-2")
        assert verify(log) == []
        assert log.state("alpha").idle


def test_an_upgraded_log_has_the_schema_of_a_new_one(old_log: Path, tmp_path: Path) -> None:
    SessionLog.open(old_log).close()
    SessionLog.open(tmp_path / "new.db").close()
    assert schema(old_log) == schema(tmp_path / "new.db")


def test_a_log_with_a_migration_this_loopd_does_not_know_is_refused(old_log: Path) -> None:
    SessionLog.open(old_log).close()
    add_migration_record(old_log, "m099_later")
    newer = len(sessionlog_migrations.MIGRATIONS.names) + 1
    with pytest.raises(
        SchemaTooNewError, match=rf"schema version {newer} \(m099_later\) .* upgrade"
    ):
        SessionLog.open(old_log)


def test_a_failed_migration_leaves_a_file_that_opens_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "loopd.db"
    broken_schema = sessionlog_migrations._V1_TABLES + "CREATE TABLE sessions (x INTEGER);"
    monkeypatch.setattr(sessionlog_migrations, "_V1_TABLES", broken_schema)
    with pytest.raises(StorageError, match="already exists"):
        SessionLog.open(path)
    monkeypatch.undo()
    # Nothing of the failed migration was kept, so the file is not taken for someone else's.
    with SessionLog.open(path) as log:
        assert log.sessions() == []
