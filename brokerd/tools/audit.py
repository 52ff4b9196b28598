"""The audit log: SQLite on the host, append-only, and the source of truth for idempotency.

A call is two rows: ``call_started`` is written (and committed) before the tool runs, and
``call_ended`` when it has a result. Nothing is ever updated or deleted (triggers refuse it), so a
started row without an end row is exactly a call that brokerd never finished. ``find_tool_calls``
records what each session was shown; the names a session may call are derived from it, so they
survive a restart. The view ``calls`` joins the two halves for reading.

Each write is a single statement in autocommit mode and takes well under a millisecond, so the
store is called synchronously from the event loop: that also makes "check the key, then claim it"
free of interleaving between coroutines. The schema is versioned by ``loopd.storage.migrations``.
"""

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

from brokerd.tools.calls import CallRequest, RecordedCall
from brokerd.tools.errors import BrokerError
from brokerd.tools.wording import CallStatus
from loopd.storage.migrations import (
    MigrationError,
    Migrations,
    append_only_triggers,
    execute_script,
)

APPEND_ONLY_TABLES = ("call_started", "call_ended", "find_tool_calls")

# brokerd 0.1.0 created these on every open (hence IF NOT EXISTS) and had no version.
_V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS call_started (
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    started_at TEXT NOT NULL,
    PRIMARY KEY (session, call_id)
);
CREATE TABLE IF NOT EXISTS call_ended (
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT NOT NULL,
    ended_at TEXT NOT NULL,
    PRIMARY KEY (session, call_id),
    FOREIGN KEY (session, call_id) REFERENCES call_started (session, call_id)
);
CREATE TABLE IF NOT EXISTS find_tool_calls (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    query TEXT NOT NULL,
    names TEXT NOT NULL,
    result TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS find_tool_calls_session ON find_tool_calls (session);
CREATE VIEW IF NOT EXISTS calls AS
    SELECT s.session, s.call_id, s.tool, s.arguments, s.started_at, e.status, e.result, e.ended_at
    FROM call_started AS s LEFT JOIN call_ended AS e USING (session, call_id);
"""

MIGRATIONS = Migrations()


@MIGRATIONS.step
def m001_initial(db: sqlite3.Connection) -> None:
    execute_script(db, _V1_SCHEMA + append_only_triggers(*APPEND_ONLY_TABLES))


STATUSES: frozenset[str] = frozenset(get_args(CallStatus))


def utc_now() -> datetime:
    return datetime.now(UTC)


class AuditLogError(BrokerError):
    """The audit database cannot be opened or written."""


class AuditLog:
    """Append-only record of every find_tool and call_tool, in one SQLite file."""

    def __init__(self, connection: sqlite3.Connection, clock: Callable[[], datetime]) -> None:
        self._db = connection
        self._clock = clock

    @classmethod
    def open(cls, path: Path, clock: Callable[[], datetime] = utc_now) -> "AuditLog":
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: every write below is one statement, durable when it returns.
            connection = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=5.0
            )
        except (OSError, sqlite3.Error) as exc:
            raise AuditLogError(f"{path}: cannot open the audit database: {exc}") from exc
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA foreign_keys = ON")
            MIGRATIONS.apply(connection)
        except (sqlite3.Error, MigrationError) as exc:
            connection.close()
            raise AuditLogError(f"{path}: cannot open the audit database: {exc}") from exc
        return cls(connection, clock)

    def close(self) -> None:
        self._db.close()

    def record_find(self, session: str, query: str, names: Sequence[str], result: str) -> None:
        self._write(
            "INSERT INTO find_tool_calls (session, query, names, result, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (session, query, json.dumps(list(names)), result, self._now()),
        )

    def shown_names(self, session: str) -> frozenset[str]:
        """Every tool name that find_tool has shown this session."""
        rows = self._db.execute(
            "SELECT DISTINCT value FROM find_tool_calls, json_each(find_tool_calls.names) "
            "WHERE session = ?",
            (session,),
        )
        return frozenset(str(name) for (name,) in rows)

    def record_start(self, request: CallRequest) -> None:
        """Claim the key before the tool runs; a second claim of one key fails."""
        self._write(
            "INSERT INTO call_started (session, call_id, tool, arguments, started_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (request.session, request.call_id, request.name, request.arguments, self._now()),
        )

    def record_end(self, session: str, call_id: str, status: CallStatus, result: str) -> None:
        self._write(
            "INSERT INTO call_ended (session, call_id, status, result, ended_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (session, call_id, status, result, self._now()),
        )

    def recorded_call(self, session: str, call_id: str) -> RecordedCall | None:
        row = self._db.execute(
            "SELECT session, call_id, tool, arguments, started_at, status, result, ended_at "
            "FROM calls WHERE session = ? AND call_id = ?",
            (session, call_id),
        ).fetchone()
        if row is None:
            return None
        status = row[5]
        if status is not None and status not in STATUSES:
            raise AuditLogError(f"call {call_id!r} has an unknown recorded status {status!r}")
        return RecordedCall(*row)

    def _write(self, sql: str, parameters: Sequence[object]) -> None:
        try:
            self._db.execute(sql, parameters)
        except sqlite3.Error as exc:
            raise AuditLogError(f"cannot write the audit log: {exc}") from exc

    def _now(self) -> str:
        return self._clock().astimezone(UTC).isoformat(timespec="milliseconds")
