"""The one way every SQLite file of loopd and brokerd is opened (``loopcommon.sqlitefile``; each
owner's own refusals: tests/sessionlog, tests/chat, tests/brokerd/tools)."""

import sqlite3
import threading
from pathlib import Path

import pytest

from loopcommon.migrations import Migrations
from loopcommon.sqlitefile import UnusableFileError, open_sqlite


def m001_notes(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES notes (id))")


def notes() -> Migrations:
    migrations = Migrations()
    migrations.step(m001_notes)
    return migrations


def settings(conn: sqlite3.Connection) -> tuple[str, int, int, float]:
    """journal_mode, synchronous (2 FULL, 1 NORMAL), foreign_keys and the busy timeout (s)."""
    mode, synchronous, foreign_keys, busy_ms = (
        conn.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
    )
    return mode, synchronous, foreign_keys, busy_ms / 1000


def test_a_file_is_opened_with_the_settings_and_its_migrations(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "a.db", migrations=notes(), busy_timeout_s=2.5)
    assert settings(conn) == ("wal", 2, 1, 2.5)
    assert conn.isolation_level is None  # autocommit: transactions are explicit
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys are enforced
        conn.execute("INSERT INTO notes (parent) VALUES (42)")
    # Any thread may use it (the owner serializes its calls).
    seen: list[int] = []
    worker = threading.Thread(
        target=lambda: seen.append(conn.execute("SELECT count(*) FROM notes").fetchone()[0])
    )
    worker.start()
    worker.join()
    assert seen == [0]
    conn.close()


def test_derived_data_is_not_synced_on_every_commit(tmp_path: Path) -> None:
    conn = open_sqlite(tmp_path / "index.db", durable=False)
    assert settings(conn)[:2] == ("wal", 1)
    conn.close()


def test_the_owners_check_runs_before_the_file_is_changed(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    sqlite3.connect(path).close()

    def refuse(conn: sqlite3.Connection) -> None:
        raise ValueError("not mine")

    with pytest.raises(ValueError, match="not mine"):
        open_sqlite(path, migrations=notes(), check=refuse)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_file_without_a_write_ahead_log_is_refused() -> None:
    # An in-memory database keeps no log on disk: its journal mode stays "memory".
    with pytest.raises(UnusableFileError, match="cannot use write-ahead logging"):
        open_sqlite(Path(":memory:"))
