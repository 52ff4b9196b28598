"""Versioned schemas for every SQLite file loopd and brokerd own, by one mechanism (the design
document in ``docs/``, section Storage).

A kind of file (the session log, the chat state, brokerd's audit log) lists its migrations in
order, each a function named ``mNNN_what`` that changes the schema through the connection it is
given::

    MIGRATIONS = Migrations()

    @MIGRATIONS.step
    def m001_initial(db: sqlite3.Connection) -> None:
        execute_script(db, "CREATE TABLE ...;")

``MIGRATIONS.apply(db)`` runs the steps the file lacks, in order, each in its own ``BEGIN
IMMEDIATE`` transaction together with its row in the ``_migrations`` table: a crash leaves the
file before or after a step, never in between, and a second process opening the file meanwhile
waits for the write lock and then finds the step done. A step must not call
``sqlite3.Connection.executescript``, which commits the open transaction first; ``execute_script``
runs a script statement by statement inside it. A released step is never edited: a change of
schema is a new step.

``PRAGMA user_version`` holds the number of steps applied, so a file changed by a newer program is
refused by the version alone (``NewerSchemaError``), also by a program that predates the table.
Files written before the ``_migrations`` table existed counted their steps in ``user_version``
only, so the first ``user_version`` steps of such a file count as applied (recorded with no
time). A step whose file kind had no version before (version 0) is written to find a file that
may already have its tables: it says ``IF NOT EXISTS``.
"""

import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from loopcommon.errors import DaemonError

Step = Callable[[sqlite3.Connection], None]

MIGRATIONS_TABLE = "_migrations"
_STEP_NAME = re.compile(r"m(\d{3})_[a-z0-9_]+")


class MigrationError(DaemonError):
    """A file's schema cannot be brought up to date; the owner of the file adds its path."""


class NewerSchemaError(MigrationError):
    """The file was changed by a newer program: it has steps this one does not know."""

    def __init__(self, version: int, known: int, unknown: Sequence[str]) -> None:
        self.version = version
        self.known = known
        self.unknown = tuple(unknown)
        names = f" ({', '.join(self.unknown)})" if self.unknown else ""
        self.schema = f"schema version {version}{names}"
        super().__init__(f"{self.schema} is newer than this program knows (up to {known})")


def append_only_triggers(*tables: str) -> str:
    """Triggers that refuse UPDATE and DELETE on each table (``{table}_no_update``, ...)."""
    return "".join(
        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{action} BEFORE {action.upper()} ON {table}\n"
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END;\n"
        for table in tables
        for action in ("update", "delete")
    )


_TABLE = f"""
CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
    name TEXT PRIMARY KEY,
    applied_at TEXT  -- NULL: applied before this table existed (counted in user_version only)
) STRICT;
{append_only_triggers(MIGRATIONS_TABLE)}"""


def execute_script(db: sqlite3.Connection, script: str) -> None:
    """Run an SQL script one statement at a time, inside the caller's transaction."""
    statement = ""
    for piece in script.split(";"):
        statement += piece + ";"
        # Complete only at a ';' that ends a statement (not one in a string, a comment or a
        # trigger body); SQLite's own tokenizer decides.
        if sqlite3.complete_statement(statement):
            if statement.strip(" \t\n;"):
                db.execute(statement)
            statement = ""
    if statement.strip(" \t\n;"):
        raise ValueError(f"incomplete SQL statement at the end of the script: {statement!r}")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Migrations:
    """The ordered migrations of one kind of file."""

    def __init__(self) -> None:
        self._steps: list[Step] = []

    def step(self, function: Step) -> Step:
        """Decorator: append ``function`` as the next step (named ``m001_...``, ``m002_...``)."""
        number = len(self._steps) + 1
        match = _STEP_NAME.fullmatch(function.__name__)
        if match is None or int(match[1]) != number:
            raise ValueError(f"migration {function.__name__!r} must be named m{number:03d}_<what>")
        self._steps.append(function)
        return function

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.__name__ for step in self._steps)

    def pending(self, db: sqlite3.Connection) -> list[str]:
        """The steps the file lacks, in order, read without taking the write lock.

        Raises ``NewerSchemaError`` for a file changed by a newer program.
        """
        applied = self._applied(db)
        return [name for name in self.names if name not in applied]

    def apply(self, db: sqlite3.Connection, clock: Callable[[], str] = utc_now) -> list[str]:
        """Run the steps the file lacks; the names of those this call ran.

        ``db`` must not be in a transaction. A file that is up to date costs two reads and no
        write lock.
        """
        if db.in_transaction:
            raise MigrationError("migrations run outside any open transaction")
        if self._has_table(db) and not self.pending(db):
            return []
        ran: list[str] = []
        while True:
            with _immediate(db):
                # Read under the write lock: another process may have migrated meanwhile.
                applied = self._record(db)
                todo = next((s for s in self._steps if s.__name__ not in applied), None)
                if todo is None:
                    break
                todo(db)
                if not db.in_transaction:
                    raise MigrationError(f"{todo.__name__} ended its transaction (executescript?)")
                db.execute(
                    f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES (?, ?)",
                    (todo.__name__, clock()),
                )
                db.execute(f"PRAGMA user_version = {len(applied) + 1}")
            ran.append(todo.__name__)
        return ran

    def _applied(self, db: sqlite3.Connection) -> list[str]:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if self._has_table(db):
            rows = db.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()
            applied = [str(row[0]) for row in rows]
        else:
            applied = list(self.names[:version])
        unknown = sorted(set(applied) - set(self.names))
        if unknown or version > len(self.names):
            raise NewerSchemaError(max(version, len(applied)), len(self.names), unknown)
        return applied

    def _record(self, db: sqlite3.Connection) -> list[str]:
        """The applied steps, creating the table (and the rows of a file that predates it)."""
        applied = self._applied(db)
        if not self._has_table(db):
            execute_script(db, _TABLE)
            db.executemany(
                f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES (?, NULL)",
                [(name,) for name in applied],
            )
        return applied

    @staticmethod
    def _has_table(db: sqlite3.Connection) -> bool:
        row = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MIGRATIONS_TABLE,)
        ).fetchone()
        return row is not None


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
