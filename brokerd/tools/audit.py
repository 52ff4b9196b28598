"""The audit log: SQLite on the host, append-only, and the source of truth for idempotency.

A call is two rows: ``call_started`` is written (and committed) before the tool runs, and
``call_ended`` when it has a result. Nothing is ever updated or deleted (triggers refuse it), so a
started row without an end row is exactly a call that brokerd never finished. ``find_tool_calls``
records what each session was shown; the names a session may call are derived from it, so they
survive a restart. The view ``calls`` joins the two halves for reading.

What the box sends is stored bounded (``brokerd.tools.auditbounds``): a query, a call's arguments
and a result keep their first bytes, their whole length and a sha256 of the whole (a retry is
recognised by the hash), and beyond a session's per-minute budget a row keeps no text at all.

Rows are never updated. They are deleted only by ``prune``, and only those older than a cutoff
that ``prune`` first records in ``audit_prunes`` (itself append-only): the triggers refuse the
deletion of any row at or after the latest recorded cutoff, so what is kept stays append-only.

Each write is a single statement in autocommit mode and takes well under a millisecond, so the
store is called synchronously from the event loop: that also makes "check the key, then claim it"
free of interleaving between coroutines. The schema is versioned by ``loopcommon.migrations``.
"""

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from brokerd.approval import Asked
from brokerd.tools.auditbounds import Excerpt, WriteBudget, excerpt, reduced
from brokerd.tools.calls import CallRequest, RecordedCall
from brokerd.tools.errors import BrokerError
from brokerd.tools.settings import BrokerSettings
from loopcommon.approvals import Verdict
from loopcommon.callstatus import CALL_STATUSES, CallStatus
from loopcommon.migrations import (
    MigrationError,
    Migrations,
    append_only_triggers,
    execute_script,
)
from loopcommon.sqlitefile import UnusableFileError, open_sqlite

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


# The time column each table is pruned by.
PRUNED_BY: dict[str, str] = {
    "call_ended": "ended_at",
    "call_started": "started_at",
    "find_tool_calls": "at",
}


def _prunable_triggers(pruned_by: dict[str, str], *, replacing: bool = True) -> str:
    return "".join(
        (f"DROP TRIGGER {table}_no_delete;\n" if replacing else "")
        + f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}\n"
        f"WHEN OLD.{column} >= coalesce((SELECT max(before) FROM audit_prunes), '')\n"
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only (but for rows older than a "
        "recorded prune)'); END;\n"
        for table, column in pruned_by.items()
    )


@MIGRATIONS.step
def m002_bounded_rows_and_prunes(db: sqlite3.Connection) -> None:
    execute_script(
        db,
        """
ALTER TABLE call_started ADD COLUMN call_sha256 TEXT;  -- of [tool, arguments]; NULL: older rows
ALTER TABLE call_started ADD COLUMN arguments_bytes INTEGER;  -- the whole's length
ALTER TABLE call_ended ADD COLUMN result_sha256 TEXT;
ALTER TABLE call_ended ADD COLUMN result_bytes INTEGER;
ALTER TABLE find_tool_calls ADD COLUMN query_sha256 TEXT;
ALTER TABLE find_tool_calls ADD COLUMN query_bytes INTEGER;
ALTER TABLE find_tool_calls ADD COLUMN result_bytes INTEGER;
CREATE TABLE audit_prunes (
    id INTEGER PRIMARY KEY,
    before TEXT NOT NULL,  -- rows older than this were deleted
    rows INTEGER NOT NULL,
    at TEXT NOT NULL
);
DROP VIEW calls;
CREATE VIEW calls AS
    SELECT s.session, s.call_id, s.tool, s.arguments, s.started_at, e.status, e.result,
        e.ended_at, s.call_sha256, e.result_bytes
    FROM call_started AS s LEFT JOIN call_ended AS e USING (session, call_id);
"""
        + append_only_triggers("audit_prunes")
        + _prunable_triggers(PRUNED_BY),
    )


# Approvals (``brokerd.approval``): the id issued for a call that waits for a person, and the
# decision loopd brought back. Append-only like the rest; pruned by their own time.
APPROVAL_PRUNED_BY: dict[str, str] = {
    "approval_decided": "decided_at",
    "approval_asked": "asked_at",
}


@MIGRATIONS.step
def m003_approvals(db: sqlite3.Connection) -> None:
    execute_script(
        db,
        """
CREATE TABLE approval_asked (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    call_sha256 TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,  -- bounded like a call's
    asked_at TEXT NOT NULL,
    UNIQUE (session, call_id)
);
CREATE TABLE approval_decided (
    id TEXT PRIMARY KEY REFERENCES approval_asked (id),
    decision TEXT NOT NULL,
    by TEXT NOT NULL,
    decided_at TEXT NOT NULL
);
CREATE VIEW approvals AS
    SELECT a.id, a.session, a.call_id, a.call_sha256, a.tool, a.asked_at, d.decision, d.by
    FROM approval_asked AS a LEFT JOIN approval_decided AS d USING (id);
"""
        + "".join(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table}\n"
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END;\n"
            for table in APPROVAL_PRUNED_BY
        )
        + _prunable_triggers(APPROVAL_PRUNED_BY, replacing=False),
    )


def utc_now() -> datetime:
    return datetime.now(UTC)


def open_audit_log(settings: BrokerSettings) -> "AuditLog":
    """The audit log that ``settings`` name, with their bounds."""
    bounds = AuditBounds(
        excerpt_bytes=settings.audit_excerpt_bytes,
        result_bytes=settings.audit_result_bytes,
        session_bytes_per_minute=settings.audit_session_bytes_per_minute,
        bytes_per_minute=settings.audit_bytes_per_minute,
    )
    return AuditLog.open(settings.audit_db, bounds=bounds)


def prune_audit_log(audit: "AuditLog", days: float) -> int:
    """Prune the rows older than ``days`` days; how many were deleted."""
    return audit.prune(utc_now() - timedelta(days=days))


class AuditLogError(BrokerError):
    """The audit database cannot be opened or written."""


@dataclass(frozen=True)
class AuditBounds:
    """What the box's requests may make the audit log store (``BrokerSettings``' audit_*)."""

    excerpt_bytes: int = 4096
    result_bytes: int = 80 * 1024
    session_bytes_per_minute: int = 1024 * 1024
    bytes_per_minute: int = 16 * 1024 * 1024


class AuditLog:
    """Append-only record of every find_tool and call_tool, in one SQLite file."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        clock: Callable[[], datetime],
        bounds: AuditBounds = AuditBounds(),
    ) -> None:
        self._db = connection
        self._clock = clock
        self._bounds = bounds
        self._budget = WriteBudget(bounds.session_bytes_per_minute, bounds.bytes_per_minute)

    @classmethod
    def open(
        cls,
        path: Path,
        clock: Callable[[], datetime] = utc_now,
        bounds: AuditBounds = AuditBounds(),
    ) -> "AuditLog":
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: every write below is one statement, durable when it returns.
            connection = open_sqlite(path, migrations=MIGRATIONS)
        except (OSError, sqlite3.Error, MigrationError, UnusableFileError) as exc:
            raise AuditLogError(f"{path}: cannot open the audit database: {exc}") from exc
        return cls(connection, clock, bounds)

    def close(self) -> None:
        self._db.close()

    def record_find(self, session: str, query: str, names: Sequence[str], result: str) -> None:
        asked, said = self._bounded(
            session,
            excerpt(query, self._bounds.excerpt_bytes),
            excerpt(result, self._bounds.result_bytes),
        )
        self._write(
            "INSERT INTO find_tool_calls (session, query, names, result, at, query_sha256, "
            "query_bytes, result_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session,
                asked.text,
                json.dumps(list(names)),
                said.text,
                self._now(),
                asked.sha256,
                asked.size,
                said.size,
            ),
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
        (arguments,) = self._bounded(
            request.session, excerpt(request.arguments, self._bounds.excerpt_bytes)
        )
        self._write(
            "INSERT INTO call_started (session, call_id, tool, arguments, started_at, "
            "call_sha256, arguments_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                request.session,
                request.call_id,
                request.name,
                arguments.text,
                self._now(),
                request.sha256,
                arguments.size,
            ),
        )

    def record_end(self, session: str, call_id: str, status: CallStatus, result: str) -> None:
        (kept,) = self._bounded(session, excerpt(result, self._bounds.result_bytes))
        self._write(
            "INSERT INTO call_ended (session, call_id, status, result, ended_at, result_sha256, "
            "result_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (session, call_id, status, kept.text, self._now(), kept.sha256, kept.size),
        )

    def prune(self, older_than: datetime) -> int:
        """Delete the rows older than ``older_than``, recording the cutoff first; how many."""
        before = older_than.astimezone(UTC).isoformat(timespec="milliseconds")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # A call's start row goes only with its end row (or when it has none).
                where = {
                    "call_ended": "ended_at < :before",
                    "call_started": "started_at < :before AND NOT EXISTS (SELECT 1 FROM "
                    "call_ended AS e WHERE e.session = call_started.session AND e.call_id = "
                    "call_started.call_id AND e.ended_at >= :before)",
                    "find_tool_calls": "at < :before",
                    "approval_decided": "decided_at < :before",
                    "approval_asked": "asked_at < :before AND NOT EXISTS (SELECT 1 FROM "
                    "approval_decided AS d WHERE d.id = approval_asked.id)",
                }
                counted = {"before": before}
                rows = sum(
                    int(
                        self._db.execute(f"SELECT count(*) FROM {t} WHERE {w}", counted).fetchone()[
                            0
                        ]
                    )
                    for t, w in where.items()
                )
                self._db.execute(
                    "INSERT INTO audit_prunes (before, rows, at) VALUES (?, ?, ?)",
                    (before, rows, self._now()),
                )
                for table, condition in where.items():
                    self._db.execute(f"DELETE FROM {table} WHERE {condition}", counted)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise AuditLogError(f"cannot prune the audit log: {exc}") from exc
        return rows

    def recorded_call(self, session: str, call_id: str) -> RecordedCall | None:
        row = self._db.execute(
            "SELECT session, call_id, tool, arguments, started_at, status, result, ended_at, "
            "call_sha256, result_bytes FROM calls WHERE session = ? AND call_id = ?",
            (session, call_id),
        ).fetchone()
        if row is None:
            return None
        status = row[5]
        if status is not None and status not in CALL_STATUSES:
            raise AuditLogError(f"call {call_id!r} has an unknown recorded status {status!r}")
        return RecordedCall(*row)

    def approval_for(self, session: str, call_id: str) -> Asked | None:
        """The approval issued for this call key, with its decision if one came."""
        row = self._db.execute(
            "SELECT id, session, call_id, call_sha256, tool, asked_at, decision, by "
            "FROM approvals WHERE session = ? AND call_id = ?",
            (session, call_id),
        ).fetchone()
        return Asked(*row) if row is not None else None

    def record_asked(self, approval_id: str, request: CallRequest) -> None:
        """The call waits for a person under ``approval_id``."""
        (arguments,) = self._bounded(
            request.session, excerpt(request.arguments, self._bounds.excerpt_bytes)
        )
        self._write(
            "INSERT INTO approval_asked (id, session, call_id, call_sha256, tool, arguments, "
            "asked_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                approval_id,
                request.session,
                request.call_id,
                request.sha256,
                request.name,
                arguments.text,
                self._now(),
            ),
        )

    def record_decided(self, approval_id: str, decision: Verdict, by: str) -> None:
        self._write(
            "INSERT INTO approval_decided (id, decision, by, decided_at) VALUES (?, ?, ?, ?)",
            (approval_id, decision, by, self._now()),
        )

    def _bounded(self, session: str, *fields: Excerpt) -> tuple[Excerpt, ...]:
        """The excerpts as stored: whole, or reduced to no text past the write budget."""
        size = sum(len(field.text.encode("utf-8", "surrogatepass")) for field in fields)
        minute = int(self._clock().timestamp() // 60)
        if self._budget.allow(session, size, minute):
            return fields
        return tuple(reduced(field) for field in fields)

    def _write(self, sql: str, parameters: Sequence[object]) -> None:
        try:
            self._db.execute(sql, parameters)
        except sqlite3.Error as exc:
            raise AuditLogError(f"cannot write the audit log: {exc}") from exc

    def _now(self) -> str:
        return self._clock().astimezone(UTC).isoformat(timespec="milliseconds")
