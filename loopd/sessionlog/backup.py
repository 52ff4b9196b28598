"""Backup and restore of loopd's state: the session log (``loopd.db``) and the chat state
(``chat.db``).

Each file is copied with SQLite's online backup API, page by page under SQLite's own locking, so a
backup taken while ``loopd serve`` writes is a consistent snapshot of each file (a plain ``cp`` of
a WAL-mode database may copy a main file and a write-ahead log from different moments). The copy
of the session log is verified (hash chain and replay identity) before the command says it is
done.

A restore replaces the state folder's files with a backup's, after checking the backup verifies.
It needs the state folder to itself: ``loopd serve`` holds ``loopd.lock`` there for its whole life
(see ``hold_state``), and a restore that cannot take it refuses. The files it replaces are moved,
with their write-ahead logs, into ``replaced-<time>/`` in the state folder, never deleted.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from loopcommon.errors import DaemonError
from loopd.errors import LoopdError
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify

LOG_FILE: Final = "loopd.db"
STATE_FILES: Final = (LOG_FILE, "chat.db")
LOCK_FILE: Final = "loopd.lock"
_SIDECARS: Final = ("-wal", "-shm")


class BackupError(LoopdError):
    """A backup or restore could not be done; nothing was changed."""


class StateInUse(LoopdError):
    """Another process holds the state folder's lock (``loopd serve``, or a restore)."""


@dataclass(frozen=True)
class Copied:
    name: str
    size: int


@dataclass(frozen=True)
class Report:
    files: tuple[Copied, ...]
    sessions: int
    entries: int

    def summary(self, verb: str, where: Path) -> str:
        names = ", ".join(f"{c.name} ({c.size:,} bytes)" for c in self.files)
        return (
            f"{verb} {names} {'to' if verb == 'backed up' else 'from'} {where}: "
            f"{self.sessions} session(s), {self.entries} entries, the session log verifies"
        )


@contextmanager
def hold_state(state_dir: Path) -> Iterator[None]:
    """Hold the state folder's lock (``loopd.lock``) while the block runs; ``StateInUse`` when
    another process holds it. The kernel releases it when the process ends, however it ends."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise StateInUse(
                f"{state_dir} is in use by loopd (pid {holder}); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def backup_state(state_dir: Path, dest: Path) -> Report:
    """Copy the state files into the new folder ``dest`` and verify the copied session log."""
    source_log = state_dir / LOG_FILE
    if not source_log.is_file():
        raise BackupError(f"{source_log}: no session log to back up")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists and is not an empty folder; choose a new one")
    dest.mkdir(parents=True, exist_ok=True)
    copied = tuple(
        _copy(state_dir / name, dest / name) for name in STATE_FILES if (state_dir / name).exists()
    )
    return _verified(dest / LOG_FILE, copied)


def restore_state(source: Path, state_dir: Path) -> Report:
    """Replace the state folder's files with the backup in ``source``. The backup is copied in
    and verified first (the backup itself is only read); the files it replaces are moved aside."""
    if not (source / LOG_FILE).is_file():
        raise BackupError(f"{source}: no {LOG_FILE}, not a loopd backup")
    names = [name for name in STATE_FILES if (source / name).is_file()]
    with hold_state(state_dir):
        staged = {name: state_dir / f".{name}.restoring" for name in names}
        try:
            copied = tuple(_copy(source / name, staged[name]) for name in names)
            report = _verified(staged[LOG_FILE], copied)
        except BackupError:
            for path in staged.values():
                _remove_with_sidecars(path)
            raise
        aside = state_dir / f"replaced-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
        # A chat state newer than the log it would pair with would skip posts the log lacks: the
        # old one goes aside even when the backup has none, and the adapter catches up.
        for name in STATE_FILES:
            _move_aside(state_dir / name, aside)
        for name, path in staged.items():
            path.replace(state_dir / name)
    return report


def _copy(source: Path, target: Path) -> Copied:
    try:
        with (
            closing(sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True)) as src,
            closing(sqlite3.connect(target)) as dst,
        ):
            src.backup(dst)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot copy {source} to {target}: {exc}") from exc
    return Copied(source.name, target.stat().st_size)


def _verified(log_path: Path, copied: tuple[Copied, ...]) -> Report:
    try:
        with SessionLog.open(log_path, create=False) as log:
            problems = verify(log)
            sessions = log.sessions()
            entries = sum(len(log.entries(s.name)) for s in sessions)
    except DaemonError as exc:
        raise BackupError(f"{log_path}: {exc}") from exc
    if problems:
        raise BackupError(f"{log_path} does not verify: {problems[0]}")
    return Report(copied, len(sessions), entries)


def _with_sidecars(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + suffix) for suffix in _SIDECARS)]


def _move_aside(path: Path, aside: Path) -> None:
    for candidate in _with_sidecars(path):
        if candidate.exists():
            aside.mkdir(exist_ok=True)
            candidate.replace(aside / candidate.name)


def _remove_with_sidecars(path: Path) -> None:
    for candidate in _with_sidecars(path):
        candidate.unlink(missing_ok=True)
