"""What the adapter must remember across restarts, in ``chat.db`` beside the session log.

Rows are only ever added (the latest row wins), as in the session log, but for ``held``:

- ``cursors``: per channel, the newest (``update_at``, post id) taken in; catch-up starts there.
- ``connections``: the WebSocket's ``{connection_id, next_seq}``, for a resume after a restart.
- ``seen``: post ids already decided (stored, stopped, refused), so a post is acted on once.
- ``threads``: the channel of each thread loopd is in (replies need it after a restart).
- ``outbox``: a reply's intent (before posting) and each part's post id (after), so a restart
  knows which replies may already be in the thread and looks there before posting again.
- ``held``: messages that came while their thread's turn ran, kept here until it ends (a row is
  removed once its message is in the session log).
- ``stops``: a person's stop of a running turn, written before the turn is cancelled, so a
  restart that finds the turn pending with no stop in the session log does not run it again.

The file is opened as every SQLite file of loopd's is (``loopcommon.sqlitefile``: WAL,
``synchronous=FULL``), and its schema versioned by ``loopcommon.migrations``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loopcommon.migrations import (
    MigrationError,
    Migrations,
    append_only_triggers,
    execute_script,
)
from loopcommon.sqlitefile import UnusableFileError, open_sqlite
from loopcommon.statuspage import ThreadView
from loopd.errors import LoopdError

# Before versions, loopd created its tables on every open (hence IF NOT EXISTS in the steps that
# were its schema then): first these, then ``held`` (m002).
_V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS cursors (
    id INTEGER PRIMARY KEY, channel_id TEXT NOT NULL, update_at INTEGER NOT NULL,
    post_id TEXT NOT NULL, saved_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS cursors_channel ON cursors (channel_id, id);
CREATE TABLE IF NOT EXISTS connections (
    id INTEGER PRIMARY KEY, connection_id TEXT NOT NULL, next_seq INTEGER NOT NULL,
    saved_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS seen (
    post_id TEXT PRIMARY KEY, decision TEXT NOT NULL, saved_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS threads (
    root_id TEXT PRIMARY KEY, channel_id TEXT NOT NULL, saved_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, part INTEGER NOT NULL, post_id TEXT,
    saved_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS outbox_key ON outbox (key, part);
CREATE TRIGGER IF NOT EXISTS cursors_no_update BEFORE UPDATE ON cursors
    BEGIN SELECT RAISE(ABORT, 'chat state is append-only'); END;
CREATE TRIGGER IF NOT EXISTS outbox_no_update BEFORE UPDATE ON outbox
    BEGIN SELECT RAISE(ABORT, 'chat state is append-only'); END;
"""

MIGRATIONS = Migrations()


@MIGRATIONS.step
def m001_initial(db: sqlite3.Connection) -> None:
    execute_script(db, _V1_SCHEMA)


@MIGRATIONS.step
def m002_held(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE IF NOT EXISTS held (id INTEGER PRIMARY KEY, post_id TEXT NOT NULL UNIQUE,"
        " session TEXT NOT NULL, text TEXT NOT NULL, saved_at REAL NOT NULL)"
    )


# The tables whose rows are only ever added (all but ``held``).
APPEND_ONLY_TABLES = ("cursors", "connections", "seen", "threads", "outbox")


@MIGRATIONS.step
def m003_append_only(db: sqlite3.Connection) -> None:
    execute_script(db, append_only_triggers(*APPEND_ONLY_TABLES))


@MIGRATIONS.step
def m004_thread_labels(db: sqlite3.Connection) -> None:
    """The status page's label of each thread: written once, when loopd first takes a post of it."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS thread_labels (root_id TEXT PRIMARY KEY, channel TEXT NOT NULL,"
        " person TEXT NOT NULL, first_words TEXT NOT NULL, saved_at REAL NOT NULL)"
    )
    execute_script(db, append_only_triggers("thread_labels"))


@MIGRATIONS.step
def m005_stops(db: sqlite3.Connection) -> None:
    """Stops asked for, by session and the seq of the newest user message the turn answered."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS stops (id INTEGER PRIMARY KEY, session TEXT NOT NULL,"
        " answering_seq INTEGER NOT NULL, who TEXT NOT NULL, saved_at REAL NOT NULL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS stops_session ON stops (session, id)")
    execute_script(db, append_only_triggers("stops"))


class ChatStateError(LoopdError):
    """The chat state file cannot be opened or written. ``passing``: the file is full, busy or
    failed to write for now (SQLite's FULL, BUSY, LOCKED, IOERR), so the same write may succeed
    later; otherwise it will not (a damaged or foreign file)."""

    def __init__(self, message: str, *, passing: bool = False) -> None:
        super().__init__(message)
        self.passing = passing


# SQLite's primary result codes for a write that may succeed later.
_PASSING_CODES = frozenset({5, 6, 10, 13})  # BUSY, LOCKED, IOERR, FULL


def _state_error(path: Path, exc: sqlite3.Error) -> ChatStateError:
    code = getattr(exc, "sqlite_errorcode", None)
    passing = isinstance(code, int) and code & 0xFF in _PASSING_CODES
    return ChatStateError(f"chat state {path}: {exc}", passing=passing)


@dataclass(frozen=True)
class Cursor:
    update_at: int
    post_id: str


@dataclass(frozen=True)
class StopAsked:
    """A person stopped the turn that answered the user message ``answering_seq``."""

    answering_seq: int
    who: str


@dataclass(frozen=True)
class SavedConnection:
    connection_id: str
    next_seq: int
    saved_at: float


class ChatState:
    """The adapter's small append-only SQLite file."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn
        self._lock = threading.RLock()  # ``together`` holds it across several ``_run``

    @classmethod
    def open(cls, path: Path) -> ChatState:
        try:
            conn = open_sqlite(path, migrations=MIGRATIONS)
        except (sqlite3.Error, MigrationError, UnusableFileError) as exc:
            raise ChatStateError(f"chat state {path}: {exc}") from exc
        return cls(path, conn)

    def close(self) -> None:
        self._conn.close()

    def _run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            with self._lock:
                return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _state_error(self.path, exc) from exc

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The writes inside stand or fall together: a full disk keeps none of them (a post
        recorded as an answer but not closed as a draft would be taken away by the tidy-up)."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _state_error(self.path, exc) from exc
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise _state_error(self.path, exc) from exc
                raise

    # -- cursors ---------------------------------------------------------------------------------

    def cursor(self, channel_id: str) -> Cursor | None:
        rows = self._run(
            "SELECT update_at, post_id FROM cursors WHERE channel_id = ? ORDER BY id DESC LIMIT 1",
            (channel_id,),
        )
        return Cursor(int(str(rows[0][0])), str(rows[0][1])) if rows else None

    def advance(self, channel_id: str, update_at: int, post_id: str) -> None:
        """Move the channel's cursor forward (never back) to a post now durably taken in."""
        current = self.cursor(channel_id)
        if current is not None and (current.update_at, current.post_id) >= (update_at, post_id):
            return
        self._run(
            "INSERT INTO cursors (channel_id, update_at, post_id, saved_at) VALUES (?, ?, ?, ?)",
            (channel_id, update_at, post_id, time.time()),
        )

    # -- the WebSocket connection ----------------------------------------------------------------

    def connection(self) -> SavedConnection | None:
        rows = self._run(
            "SELECT connection_id, next_seq, saved_at FROM connections ORDER BY id DESC LIMIT 1"
        )
        if not rows:
            return None
        connection_id, next_seq, saved_at = rows[0]
        return SavedConnection(str(connection_id), int(str(next_seq)), float(str(saved_at)))

    def save_connection(self, connection_id: str, next_seq: int) -> None:
        self._run(
            "INSERT INTO connections (connection_id, next_seq, saved_at) VALUES (?, ?, ?)",
            (connection_id, next_seq, time.time()),
        )

    # -- posts and threads -----------------------------------------------------------------------

    def seen(self, post_id: str) -> str | None:
        rows = self._run("SELECT decision FROM seen WHERE post_id = ?", (post_id,))
        return str(rows[0][0]) if rows else None

    def mark_seen(self, post_id: str, decision: str) -> None:
        self._run(
            "INSERT OR IGNORE INTO seen (post_id, decision, saved_at) VALUES (?, ?, ?)",
            (post_id, decision, time.time()),
        )

    def thread_channel(self, root_id: str) -> str | None:
        rows = self._run("SELECT channel_id FROM threads WHERE root_id = ?", (root_id,))
        return str(rows[0][0]) if rows else None

    def remember_thread(self, root_id: str, channel_id: str) -> None:
        self._run(
            "INSERT OR IGNORE INTO threads (root_id, channel_id, saved_at) VALUES (?, ?, ?)",
            (root_id, channel_id, time.time()),
        )

    def label_thread(self, label: ThreadView) -> None:
        """The thread's label for the status page, unless it has one (the first post's)."""
        self._run(
            "INSERT OR IGNORE INTO thread_labels (root_id, channel, person, first_words, saved_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (label.root, label.channel, label.person, label.first_words, time.time()),
        )

    def thread_labels(self) -> dict[str, ThreadView]:
        """Every thread's label, by its root post's id."""
        rows = self._run("SELECT root_id, channel, person, first_words FROM thread_labels")
        return {str(r[0]): ThreadView(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows}

    # -- the outbox ------------------------------------------------------------------------------

    def planned_parts(self, key: str) -> int | None:
        """How many parts the reply ``key`` was split into, if its intent was recorded."""
        rows = self._run(
            "SELECT -part FROM outbox WHERE key = ? AND post_id IS NULL ORDER BY id DESC LIMIT 1",
            (key,),
        )
        return int(str(rows[0][0])) if rows else None

    def record_intent(self, key: str, parts: int) -> None:
        self._run(
            "INSERT INTO outbox (key, part, post_id, saved_at) VALUES (?, ?, NULL, ?)",
            (key, -parts, time.time()),
        )

    def posted_parts(self, key: str) -> dict[int, str]:
        rows = self._run(
            "SELECT part, post_id FROM outbox WHERE key = ? AND post_id IS NOT NULL", (key,)
        )
        return {int(str(part)): str(post_id) for part, post_id in rows}

    def post_keys(self, post_id: str) -> list[str]:
        """The keys of what loopd posted as ``post_id`` (an answer, a closing line), if it did:
        an answer's first part is also the draft it was written into, under the draft's key."""
        rows = self._run("SELECT key FROM outbox WHERE post_id = ?", (post_id,))
        return [str(key) for (key,) in rows]

    def record_posted(self, key: str, part: int, post_id: str) -> None:
        self._run(
            "INSERT INTO outbox (key, part, post_id, saved_at) VALUES (?, ?, ?, ?)",
            (key, part, post_id, time.time()),
        )

    def turn_posts_left(self, session: str) -> list[tuple[str, str]]:
        """(key, post id) of the status and answer posts of ``session``'s turns (keys
        ``<session>#<seq>:status[.n]`` and ``...:draft``) that were neither removed nor closed
        (made the answer or the stop notice): what a tidy-up may still have to take away."""
        rows = self._run(
            "SELECT o.key, o.post_id FROM outbox o"
            " WHERE o.key >= ? AND o.key < ? AND o.post_id IS NOT NULL"
            " AND (o.key LIKE '%:status%' OR o.key LIKE '%:draft')"
            " AND NOT EXISTS (SELECT 1 FROM seen s WHERE s.post_id = 'removed:' || o.post_id)"
            " AND NOT EXISTS (SELECT 1 FROM seen s WHERE s.post_id = 'closed:' || o.post_id)"
            " ORDER BY o.id",
            (f"{session}#", f"{session}$"),  # '$' follows '#': every key of the session
        )
        return [(str(key), str(post_id)) for key, post_id in rows]

    # -- stops ---------------------------------------------------------------------------------

    def ask_stop(self, session: str, answering_seq: int, who: str) -> None:
        self._run(
            "INSERT INTO stops (session, answering_seq, who, saved_at) VALUES (?, ?, ?, ?)",
            (session, answering_seq, who, time.time()),
        )

    def stop_asked(self, session: str) -> StopAsked | None:
        """The session's latest stop, if one was ever asked for."""
        rows = self._run(
            "SELECT answering_seq, who FROM stops WHERE session = ? ORDER BY id DESC LIMIT 1",
            (session,),
        )
        return StopAsked(int(str(rows[0][0])), str(rows[0][1])) if rows else None

    # -- messages held while their thread's turn runs -------------------------------------------

    def hold(self, post_id: str, session: str, text: str) -> None:
        self._run(
            "INSERT OR IGNORE INTO held (post_id, session, text, saved_at) VALUES (?, ?, ?, ?)",
            (post_id, session, text, time.time()),
        )

    def held(self, session: str) -> list[tuple[str, str]]:
        """(post id, text) of the session's held messages, in arrival order."""
        rows = self._run("SELECT post_id, text FROM held WHERE session = ? ORDER BY id", (session,))
        return [(str(post_id), str(text)) for post_id, text in rows]

    def release(self, post_id: str) -> None:
        self._run("DELETE FROM held WHERE post_id = ?", (post_id,))
