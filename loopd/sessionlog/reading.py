"""Opening a session log that should already be there, for reading: never creating or changing one.

A log that does not exist yet is an empty one (a fresh install lists no sessions), and a file that
is not an SQLite database is refused before SQLite opens it: SQLite takes an empty file for an
empty database and would write a new log into it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from loopd.sessionlog.errors import NotALogError, StorageError
from loopd.sessionlog.store import SessionLog

SQLITE_HEADER: Final = b"SQLite format 3\x00"


@contextmanager
def existing_log(db_path: Path) -> Iterator[SessionLog | None]:
    """The log at ``db_path`` opened for reading, or None when there is none yet; a file that is
    not an SQLite database is refused (``NotALogError``) without being opened by SQLite."""
    try:
        with db_path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except (FileNotFoundError, NotADirectoryError):
        header = None
    except OSError as exc:
        raise StorageError(db_path, f"cannot read: {(exc.strerror or str(exc)).lower()}") from None
    if header is None:
        yield None
        return
    if header != SQLITE_HEADER:
        what = "an empty file" if not header else "not an SQLite database (a foreign file)"
        raise NotALogError(db_path, f"{what}, not a loopd session log; left as it is")
    with SessionLog.open(db_path, create=False) as log:
        yield log
