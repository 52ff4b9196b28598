"""Full-text search over the session log, through an index kept in a file of its own beside it.

The log is the truth and the index is derived: ``search.db`` next to ``loopd.db`` holds, for every
user, assistant and tool entry (not the copies a compaction makes), its searchable text in an FTS5
table, and the id and hash of the last log entry it has read. Each search first brings the index
up to date: the entries appended since are added; an index that is missing, damaged, of another
layout (``INDEX_VERSION``), or whose last entry the log does not hold as it was (a restored or
replaced log) is built again from the log. A state folder loopd may not write in gets an index in
memory, for that search only. Deleting ``search.db`` costs one rebuild.

The index is a cache: any error from it (a damaged page found mid-search, a full disk while it is
brought up to date) removes it, builds it again from the log and searches once more, with one log
line saying so; an error from the log is the log's (``StorageError`` naming ``loopd.db``), and an
error from the index is never told as one.

The log is opened read-only (SQLite's ``mode=ro``): a search never writes to it, migrates it, or
creates it.

sqlite-utils keeps the index: its ``enable_fts`` builds the FTS5 table with the triggers that keep
it in step with its content table, ``insert_all`` adds rows in batches, and ``search`` writes the
join of the FTS table with its content (``loopd.sessionlog.searchtext`` makes the query).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from sqlite_utils import Database
from sqlite_utils.db import Table

from loopcommon.sqlitefile import UnusableFileError, open_sqlite
from loopd.errors import LoopdError
from loopd.sessionlog.errors import NotALogError, StorageError
from loopd.sessionlog.migrations import APPLICATION_ID
from loopd.sessionlog.reading import SQLITE_HEADER
from loopd.sessionlog.searchtext import Hit, context_line, fts_query, search_words, searchable_text

logger = logging.getLogger(__name__)

INDEX_FILE: Final = "search.db"
INDEX_VERSION: Final = 1  # the index's layout: another one is built again
DEFAULT_LIMIT: Final = 20
# English stems ("kiwi" finds "kiwis", "stream" finds "streaming"); "cafe" finds "café".
_TOKENIZER: Final = "porter unicode61 remove_diacritics 2"
_BATCH: Final = 500

# The entries a person wrote or read: a compaction's copies (``refers_to`` set) are left out, so a
# message is found once, where it was first written.
_NEW_ENTRIES: Final = """
SELECT e.id AS log_id, s.name AS session, e.seq AS seq, e.kind AS kind,
       e.created_at AS created_at, e.message AS message
FROM entries e JOIN sessions s ON s.id = e.session_id
WHERE e.id > :after AND e.id <= :upto
  AND e.kind IN ('user', 'assistant', 'tool') AND e.refers_to IS NULL
ORDER BY e.id
"""


class SearchIndexError(LoopdError):
    """The search index failed, and failed again once built anew (the log itself is fine)."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(f"search index {path}: {detail}")


def index_path(db_path: Path) -> Path:
    return db_path.with_name(INDEX_FILE)


def search_log(
    db_path: Path,
    words: Sequence[str],
    *,
    limit: int = DEFAULT_LIMIT,
    session: str | None = None,
) -> list[Hit]:
    """The entries of the log at ``db_path`` that mention every word, newest first; none when
    there is no log yet. ``EmptyQueryError`` when the words hold nothing to search for;
    ``SearchIndexError`` when the index fails again once built anew."""
    query = fts_query(words)
    if not _is_log_file(db_path):
        return []
    path = index_path(db_path)
    with _log_reader(db_path) as log:
        try:
            return _search(path, log, query, words, limit, session)
        except (sqlite3.Error, OSError) as exc:  # the log's own errors are StorageError by now
            _rebuilding(path, exc)
        _remove_index(path)
        try:
            return _search(path, log, query, words, limit, session)
        except (sqlite3.Error, OSError) as exc:
            raise SearchIndexError(path, f"failed again once built anew: {exc}") from None


def _search(
    path: Path,
    log: _Log,
    query: str,
    words: Sequence[str],
    limit: int,
    session: str | None,
) -> list[Hit]:
    with _index(path) as index:
        _bring_up_to_date(index, log)
        where, args = ("session = :session", {"session": session}) if session else (None, None)
        rows = _entries(index).search(
            query, order_by="log_id desc", limit=limit, where=where, where_args=args
        )
        kept = search_words(words)
        return [
            Hit(
                row["session"],
                row["seq"],
                row["kind"],
                row["created_at"],
                context_line(row["text"], kept),
            )
            for row in rows
        ]


def _rebuilding(path: Path, exc: BaseException) -> None:
    logger.warning(
        "the search index %s failed (%s); it is built again from the session log",
        path,
        exc,
        extra={"fields": {"index": str(path), "error": str(exc)}},
    )


def _remove_index(path: Path) -> None:
    """The index file and SQLite's files beside it (its write-ahead log would be replayed)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            path.with_name(path.name + suffix).unlink(missing_ok=True)


# -- the log, read-only ---------------------------------------------------------------------------


def _is_log_file(db_path: Path) -> bool:
    """False when there is no log yet; a file that is not SQLite is refused before it is opened."""
    try:
        with db_path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StorageError(db_path, f"cannot read: {(exc.strerror or str(exc)).lower()}") from None
    if header != SQLITE_HEADER:
        raise NotALogError(db_path, "not an SQLite database, not a loopd session log")
    return True


class _Log:
    """The log, open read-only: every read of it maps SQLite's errors to the log's own
    (``StorageError`` naming it), so an error is the log's only where the log raised it."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.db = Database(conn)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StorageError(self.path, f"cannot read: {exc}") from None

    def head(self) -> tuple[int, str]:
        with self._errors():
            row = self.db.execute(
                "SELECT id, hash FROM entries ORDER BY id DESC LIMIT 1"
            ).fetchone()
        return (0, "") if row is None else (int(row[0]), str(row[1]))

    def hash_of(self, log_id: int) -> str | None:
        with self._errors():
            row = self.db.execute("SELECT hash FROM entries WHERE id = ?", (log_id,)).fetchone()
        return None if row is None else str(row[0])

    def rows(self, after: int, upto: int) -> Iterator[dict[str, Any]]:
        """The entries to index, read as the index takes them in: an error in reading them is
        the log's, one in taking them in the index's."""
        with self._errors():
            yield from self.db.query(_NEW_ENTRIES, {"after": after, "upto": upto})


@contextlib.contextmanager
def _log_reader(db_path: Path) -> Iterator[_Log]:
    uri = f"file:{quote(str(db_path.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5)
    except sqlite3.Error as exc:
        raise StorageError(db_path, f"cannot open to read: {exc}") from None
    try:
        log = _Log(db_path, conn)
        with log._errors():
            (application_id,) = conn.execute("PRAGMA application_id").fetchone()
        if application_id != APPLICATION_ID:
            raise NotALogError(db_path, "an SQLite database that is not a loopd session log")
        yield log
    finally:
        conn.close()


# -- the index ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _index(path: Path) -> Iterator[Database]:
    """The index file, made anew when it is damaged; in memory where it cannot be written."""
    try:
        index = _open_index(path)
    except (sqlite3.DatabaseError, OSError, UnusableFileError) as exc:
        # Derived data: a damaged or foreign file is rebuilt, an unwritable place is worked around.
        _rebuilding(path, exc)
        _remove_index(path)
        try:
            index = _open_index(path)
        except (sqlite3.DatabaseError, OSError, UnusableFileError):
            index = Database(memory=True)
    try:
        yield index
    finally:
        index.close()


def _open_index(path: Path) -> Database:
    # WAL: a search reads while another brings it up. Derived data: rebuilt when lost.
    conn = open_sqlite(path, durable=False)
    try:
        conn.execute("BEGIN IMMEDIATE")  # fails here on a read-only or foreign file
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return Database(conn)


def _entries(index: Database) -> Table:
    return index.table("entries")


def _bring_up_to_date(index: Database, log: _Log) -> None:
    """Add what the log holds beyond the index's last entry; build it anew when that entry is
    not in the log as it was, or the layout differs."""
    head_id, head_hash = log.head()
    with _transaction(index):
        read_id, read_hash = _index_head(index)
        if read_id and log.hash_of(read_id) != read_hash:
            read_id = 0  # the log is not the one indexed: start again
        if read_id == 0 or not _current_layout(index):
            _create_layout(index)
            read_id = 0
        if read_id == head_id:
            return
        _entries(index).insert_all(
            (_index_row(row) for row in log.rows(read_id, head_id)), batch_size=_BATCH, alter=False
        )
        index.execute("DELETE FROM head")
        index.execute("INSERT INTO head (log_id, hash) VALUES (?, ?)", (head_id, head_hash))


def _index_row(row: dict[str, Any]) -> dict[str, Any]:
    text = searchable_text(row.pop("message") or "")
    return {**row, "text": text}


def _index_head(index: Database) -> tuple[int, str]:
    if not _current_layout(index):
        return 0, ""
    row = index.execute("SELECT log_id, hash FROM head").fetchone()
    return (0, "") if row is None else (int(row[0]), str(row[1]))


def _current_layout(index: Database) -> bool:
    (version,) = index.execute("PRAGMA user_version").fetchone()
    return bool(version == INDEX_VERSION and "head" in index.table_names())


def _create_layout(index: Database) -> None:
    for name in index.table_names():
        if not name.startswith("entries_fts_"):  # FTS5's shadow tables go with their table
            index.execute(f"DROP TABLE IF EXISTS [{name}]")
    index.execute("CREATE TABLE head (log_id INTEGER NOT NULL, hash TEXT NOT NULL)")
    _entries(index).create(
        {
            "log_id": int,
            "session": str,
            "seq": int,
            "kind": str,
            "created_at": str,
            "text": str,
        },
        pk="log_id",
    )
    _entries(index).enable_fts(["text"], create_triggers=True, tokenize=_TOKENIZER)
    index.execute(f"PRAGMA user_version = {INDEX_VERSION}")


@contextlib.contextmanager
def _transaction(index: Database) -> Iterator[None]:
    """One write transaction: a second search waits, then finds the index up to date."""
    index.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        index.execute("ROLLBACK")
        raise
    index.execute("COMMIT")
