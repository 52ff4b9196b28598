"""brokerd's audit log: versioned, append-only, and readable after an upgrade."""

import sqlite3
from pathlib import Path

import pytest

from brokerd.tools.audit import MIGRATIONS, AuditLog, AuditLogError
from brokerd.tools.calls import CallRequest, RecordedCall
from tests.storage.storage_support import add_migration_record, copied_fixture, query, schema


@pytest.fixture
def old_audit(tmp_path: Path) -> Path:
    return copied_fixture("brokerd-audit-0.1.0.db", tmp_path)


def test_a_0_1_0_audit_log_reads_back_after_the_upgrade(old_audit: Path) -> None:
    audit = AuditLog.open(old_audit)
    try:
        assert audit.shown_names("alpha") == {"gate", "lamp"}
        assert audit.recorded_call("alpha", "call_b2") == RecordedCall(
            "alpha",
            "call_b2",
            "gate",
            '{"x": 1}',
            "2025-01-02T03:04:06.000+00:00",
            "ok",
            "opened",
            "2025-01-02T03:04:07.000+00:00",
        )
        unfinished = audit.recorded_call("alpha", "call_c1")
        assert unfinished is not None
        assert (unfinished.tool, unfinished.status) == ("lamp", None)
        # A started key is still claimed: the same call is not started twice.
        with pytest.raises(AuditLogError, match="UNIQUE constraint failed"):
            audit.record_start(CallRequest("alpha", "call_c1", "lamp", "{}"))
        audit.record_end("alpha", "call_c1", "interrupted", "brokerd stopped")
    finally:
        audit.close()
    assert query(old_audit, "SELECT name FROM _migrations") == [(n,) for n in MIGRATIONS.names]
    assert query(old_audit, "PRAGMA user_version") == [(len(MIGRATIONS.names),)]


def test_an_upgraded_audit_log_has_the_schema_of_a_new_one(old_audit: Path, tmp_path: Path) -> None:
    AuditLog.open(old_audit).close()
    AuditLog.open(tmp_path / "new.db").close()
    assert schema(old_audit) == schema(tmp_path / "new.db")


@pytest.mark.parametrize(
    "statement",
    ["DELETE FROM call_started", "UPDATE call_ended SET result = 'x'", "DELETE FROM _migrations"],
)
def test_the_audit_log_is_append_only(tmp_path: Path, statement: str) -> None:
    audit = AuditLog.open(tmp_path / "audit.db")
    audit.record_start(CallRequest("s", "c", "gate", "{}"))
    audit.record_end("s", "c", "ok", "done")
    audit.close()
    conn = sqlite3.connect(tmp_path / "audit.db")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute(statement)
    conn.close()


def test_an_audit_log_from_a_newer_brokerd_is_refused_in_one_line(old_audit: Path) -> None:
    AuditLog.open(old_audit).close()
    later = f"m{len(MIGRATIONS.names) + 1:03d}_later"
    add_migration_record(old_audit, later)
    with pytest.raises(AuditLogError) as raised:
        AuditLog.open(old_audit)
    message = str(raised.value)
    version = len(MIGRATIONS.names) + 1
    assert message.startswith(
        f"{old_audit}: cannot open the audit database: schema version {version}"
    )
    assert f"({later})" in message
    assert "\n" not in message
