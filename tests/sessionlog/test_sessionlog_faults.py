"""Bad files and storage faults: a clear error naming the file, and nothing half-written."""

import sqlite3
from pathlib import Path

import pytest

from loopd.sessionlog import (
    CorruptLogError,
    DiskFullError,
    LockedError,
    LogNotFoundError,
    NotALogError,
    SchemaTooNewError,
    SessionLog,
    StorageError,
)
from loopd.sessionlog.verify import verify
from tests.sessionlog.sessionlog_support import assistant_text, open_started, request_for

S = "thread-1"


def test_missing_file_is_not_created_when_not_asked(db_path: Path) -> None:
    with pytest.raises(LogNotFoundError, match=str(db_path)):
        SessionLog.open(db_path, create=False)
    assert not db_path.exists()


def test_a_foreign_file_is_refused_and_left_alone(db_path: Path) -> None:
    db_path.write_text("these are somebody's notes, not a database\n" * 100)
    before = db_path.read_bytes()
    with pytest.raises(NotALogError, match=str(db_path)):
        SessionLog.open(db_path)
    assert db_path.read_bytes() == before


def test_a_foreign_sqlite_database_is_refused(db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(NotALogError, match=r"not a session log \(tables: \['invoices'\]\)"):
        SessionLog.open(db_path)


def test_a_directory_at_the_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotALogError, match="not a regular file"):
        SessionLog.open(tmp_path)


def test_a_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "loopd.db"
    with pytest.raises(StorageError, match=str(path)):
        SessionLog.open(path)


def test_a_newer_schema_is_refused(db_path: Path) -> None:
    open_started(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchemaTooNewError, match=r"schema version 99 .* upgrade loopd"):
        SessionLog.open(db_path)


def _filled(db_path: Path, entries: int) -> None:
    with open_started(db_path) as log, log.transaction():
        for index in range(entries):
            log.append_user(S, f"message {index} " + "x" * 500, external_key=f"p{index}")


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_file_is_reported_as_damaged(db_path: Path, keep: float) -> None:
    _filled(db_path, 400)
    data = db_path.read_bytes()
    db_path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CorruptLogError, match=str(db_path)):
        SessionLog.open(db_path)


def test_overwritten_pages_are_reported_as_damaged(db_path: Path) -> None:
    _filled(db_path, 400)
    data = bytearray(db_path.read_bytes())
    page = 4096
    data[3 * page : 6 * page] = b"\xa5" * (3 * page)
    db_path.write_bytes(bytes(data))
    with pytest.raises((CorruptLogError, NotALogError), match=str(db_path)):
        SessionLog.open(db_path)


def test_a_full_disk_keeps_nothing_of_the_failed_write(db_path: Path, log: SessionLog) -> None:
    log.append_user(S, "before", external_key="p0")
    before = log.entries(S)
    pages = log._conn.execute("PRAGMA page_count").fetchone()[0]
    # max_page_count makes SQLite report SQLITE_FULL as a full disk would.
    log._conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(DiskFullError, match=f"{db_path}.*SQLITE_FULL"):
        log.append_assistant(S, assistant_text("y" * 200_000), request=request_for(log, S))
    assert log.entries(S) == before
    assert log.requests(S) == []
    log._conn.execute("PRAGMA max_page_count = 1073741823")
    log.append_assistant(S, assistant_text("fits now"), request=request_for(log, S))
    assert verify(log) == []


def test_a_locked_database_is_reported_and_nothing_is_lost(db_path: Path) -> None:
    open_started(db_path).close()
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    log = SessionLog.open(db_path, busy_timeout_ms=50)
    with pytest.raises(LockedError, match=str(db_path)):
        log.append_user(S, "hello", external_key="p1")
    holder.execute("ROLLBACK")
    holder.close()
    assert log.append_user(S, "hello", external_key="p1").is_new
    assert len(log.entries(S)) == 2
    log.close()
