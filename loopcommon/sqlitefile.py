"""Opening an SQLite file of loopd's or brokerd's, the one way every such file is opened (the
session log, the chat state, brokerd's audit log, the search index; docs/design.md, Storage).

``open_sqlite`` gives a connection

- in autocommit (``isolation_level=None``): transactions are explicit, nothing opens one behind
  the owner's back;
- usable from any thread (``check_same_thread=False``): each owner serializes its calls itself;
- with a busy timeout, so that a second process waits for the write lock instead of failing;
- in write-ahead-log mode, so that readers (``loopd log ...``, a search) never block a writer; a
  file system that cannot keep the log is refused (``UnusableFileError``);
- with ``synchronous=FULL`` for a record (in WAL mode NORMAL may lose the last commits on power
  loss), NORMAL for derived data that is rebuilt when lost (``durable=False``);
- with foreign keys enforced;
- and the file's migrations applied (``loopcommon.migrations``).

What only the owner knows is checked first by ``check``, before anything here changes the file
(the session log refuses a foreign or newer file unchanged). The owner maps what this raises
(``sqlite3.Error``, ``MigrationError``, ``UnusableFileError``, and its own check's errors) to its
errors with the file's path; the connection is closed on any of them.
"""

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final

from loopcommon.errors import DaemonError
from loopcommon.migrations import Migrations

BUSY_TIMEOUT_S: Final = 5.0


class UnusableFileError(DaemonError):
    """The file opens but cannot be used as every daemon's file is (no write-ahead log here)."""


def open_sqlite(
    path: Path,
    *,
    migrations: Migrations | None = None,
    busy_timeout_s: float = BUSY_TIMEOUT_S,
    durable: bool = True,
    check: Callable[[sqlite3.Connection], None] | None = None,
) -> sqlite3.Connection:
    """Open (and create) the SQLite file at ``path``, set up as the module says."""
    conn = sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        if check is not None:
            check(conn)
        _set_up(conn, durable=durable)
        if migrations is not None:
            migrations.apply(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _set_up(conn: sqlite3.Connection, *, durable: bool) -> None:
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise UnusableFileError("cannot use write-ahead logging on this file system")
    conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
    conn.execute("PRAGMA foreign_keys = ON")
