"""Backup and restore of the state folder: online copies that verify, a restore that refuses a
running daemon and keeps what it replaces, and a backup written by loopd 0.1.0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.chat.cursor import ChatState
from loopd.sessionlog.backup import (
    BackupError,
    StateInUse,
    backup_state,
    hold_state,
    restore_state,
)
from loopd.sessionlog.store import SessionLog
from tests.sessionlog.sessionlog_support import open_started

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "db"


def write_session(state: Path, name: str, lines: int) -> None:
    with open_started(state / "loopd.db", name) as log:
        for i in range(lines):
            log.append_user(name, f"line {i}", external_key=f"{name}-{i}")


def user_lines(db: Path, name: str) -> int:
    with SessionLog.open(db, create=False) as log:
        return sum(1 for e in log.entries(name) if e.kind.value == "user")


def test_a_backup_taken_while_the_log_is_open_copies_every_file_and_verifies(
    tmp_path: Path,
) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 3)
    ChatState.open(state / "chat.db").close()
    with SessionLog.open(state / "loopd.db") as writer:  # a daemon holding the log open
        writer.append_user("t1", "late", external_key="late")
        report = backup_state(state, dest)
    assert sorted(c.name for c in report.files) == ["chat.db", "loopd.db"]
    assert (report.sessions, user_lines(dest / "loopd.db", "t1")) == (1, 4)
    assert "the session log verifies" in report.summary("backed up", dest)


def test_a_backup_never_writes_into_a_folder_that_holds_files(tmp_path: Path) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 1)
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(BackupError, match="not an empty folder"):
        backup_state(state, dest)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def test_a_restore_replaces_the_state_and_keeps_what_it_replaced(tmp_path: Path) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 2)
    backup_state(state, dest)
    write_session(state, "t2", 5)  # written after the backup
    restore_state(dest, state)
    with SessionLog.open(state / "loopd.db", create=False) as log:
        assert [s.name for s in log.sessions()] == ["t1"]
    (aside,) = state.glob("replaced-*")
    assert user_lines(aside / "loopd.db", "t2") == 5


def test_a_restore_refuses_while_loopd_holds_the_state(tmp_path: Path) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 2)
    backup_state(state, dest)
    before = (state / "loopd.db").read_bytes()
    with hold_state(state), pytest.raises(StateInUse, match=f"pid {os.getpid()}"):
        restore_state(dest, state)
    assert (state / "loopd.db").read_bytes() == before
    assert not list(state.glob("replaced-*"))


def test_a_backup_that_does_not_verify_is_not_restored(tmp_path: Path) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 2)
    dest.mkdir()
    (dest / "loopd.db").write_bytes(b"not a database at all, only bytes")
    before = (state / "loopd.db").read_bytes()
    with pytest.raises(BackupError):
        restore_state(dest, state)
    assert (state / "loopd.db").read_bytes() == before
    assert sorted(p.name for p in state.iterdir() if not p.name.startswith("loopd.db")) == [
        "loopd.lock"
    ]


def test_a_backup_written_by_loopd_0_1_0_restores_and_opens(tmp_path: Path) -> None:
    # What an upgrade meets: a state folder (or its backup) written by the previous release.
    old, state = tmp_path / "old", tmp_path / "state"
    old.mkdir()
    shutil.copy(FIXTURES / "loopd-0.1.0.db", old / "loopd.db")
    shutil.copy(FIXTURES / "chat-0.1.0.db", old / "chat.db")
    written = (old / "loopd.db").read_bytes()
    report = restore_state(old, state)
    assert report.sessions >= 1
    assert (old / "loopd.db").read_bytes() == written  # the backup itself is only read
    ChatState.open(state / "chat.db").close()


def test_the_commands_print_one_line_each(tmp_path: Path) -> None:
    state, dest = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    write_session(state, "t1", 2)
    env = {**os.environ, "LOOPD_STATE_DIR": str(state)}
    loopd = [sys.executable, "-m", "loopd"]
    done = subprocess.run([*loopd, "log", "backup", str(dest)], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("backed up loopd.db (")
    with hold_state(state):
        refused = subprocess.run(
            [*loopd, "log", "restore", str(dest)], env=env, capture_output=True, text=True
        )
    assert refused.returncode == 2
    assert (
        refused.stderr == f"loopd: {state} is in use by loopd (pid {os.getpid()}); stop it first\n"
    )
    again = subprocess.run([*loopd, "log", "backup", str(dest)], env=env, capture_output=True)
    assert again.returncode == 2
    assert again.stderr.decode().count("\n") == 1
