"""The session log's exception tree.

Every failure the log reports is a ``LogError`` that names the database file, so a message shown
to an operator always says which file is at fault. Foreign exceptions (``sqlite3.Error``) are
translated at the store boundary and never escape it.

    LogError
    ├── StorageError            the file cannot be used as a session log
    │   ├── LogNotFoundError    no file at the path (and creating one was not asked for)
    │   ├── NotALogError        a foreign file, or an SQLite database that is not a session log
    │   ├── CorruptLogError     a damaged or truncated database file
    │   ├── SchemaTooNewError   written by a newer loopd
    │   ├── DiskFullError       SQLITE_FULL: nothing of the failed write was kept
    │   └── LockedError         another process holds the write lock past the busy timeout
    └── InvalidAppendError      the append was refused; nothing was written
        ├── UnknownSessionError
        ├── SlotMismatchError
        ├── NoEpochError
        ├── InvalidMessageError
        ├── ToolCallError
        └── AppendOnlyError     an UPDATE or DELETE reached an append-only table
"""

from pathlib import Path

from loopd.errors import LoopdError


class LogError(LoopdError):
    """Base of every session-log failure; ``path`` is the database file concerned."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"session log {path}: {detail}")


class StorageError(LogError):
    """The database file could not be read or written."""


class LogNotFoundError(StorageError):
    pass


class NotALogError(StorageError):
    pass


class CorruptLogError(StorageError):
    pass


class SchemaTooNewError(StorageError):
    pass


class DiskFullError(StorageError):
    pass


class LockedError(StorageError):
    pass


class InvalidAppendError(LogError):
    """The log refused a write because of what was asked; the database is unchanged."""


class UnknownSessionError(InvalidAppendError):
    pass


class SlotMismatchError(InvalidAppendError):
    pass


class NoEpochError(InvalidAppendError):
    pass


class InvalidMessageError(InvalidAppendError):
    pass


class ToolCallError(InvalidAppendError):
    pass


class AppendOnlyError(InvalidAppendError):
    pass
