"""``LOOPD_MODEL=qwen-coder-tools make run`` (scripts/run.sh) in a real terminal (tmux): the
whole stack comes up on the tool model, a message asking for the files gets a real ``list_dir``
call, and its line and its result's line are on the screen.

Waits are bounded polls on what the stack writes (the chat's welcome line on the screen, the
tool result in the session log), never sleeps; the model's work is bounded by ``max_tokens``
150 a request and the repeat guard. The tmux session, and with it everything run.sh started,
ends whatever happens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd.tools.workspace import session_workspace
from loopd_dev import devserver

REPO = Path(__file__).resolve().parents[2]
# A limit for each wait: only what a stuck stack never reaches runs into it.
WAIT_S = 240.0

pytestmark = pytest.mark.real_server


def tmux(*args: str) -> str:
    done = subprocess.run(["tmux", *args], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


@contextmanager
def terminal(name: str, command: str) -> Iterator[Callable[[], str]]:
    """``command`` in a detached tmux session 160 columns wide; yields a reader of its screen."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is required for the terminal test (Debian package tmux)")
    tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "50", command)
    # If the command ends early, its last screen stays to be read (and shown by a failure).
    tmux("set-option", "-t", name, "remain-on-exit", "on")
    try:
        yield lambda: tmux("capture-pane", "-p", "-J", "-t", name)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True, timeout=30)


def until(check: Callable[[], bool], what: str, screen: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never saw {what}; the screen:\n{screen()}")
        time.sleep(0.2)


def tool_results(db: Path, session: str) -> int:
    """How many tool results the session's log holds (0 before the chat made the log)."""
    if not db.exists():
        return 0
    with SessionLog.open(db, create=False) as log:
        if session not in {s.name for s in log.sessions()}:
            return 0
        return sum(e.kind is EntryKind.TOOL for e in log.entries(session))


def test_make_run_on_the_tool_model_shows_a_real_list_dir_call_and_its_result() -> None:
    # Short paths: the stack's Unix sockets live under the run folder.
    with tempfile.TemporaryDirectory(prefix="lr") as tmp:
        state, run = Path(tmp) / "s", Path(tmp) / "r"
        workspaces = state / "workspaces"
        (session_workspace(workspaces, "terminal") / "notes.txt").write_text("first notes\n")
        env = {
            "LOOPD_MODEL": devserver.TOOL_MODEL,
            "LOOPD_STATE_DIR": str(state),
            "MAKE_RUN_DIR": str(run),
            "LOOPDEV_CACHE_DIR": str(devserver.default_cache_dir()),
        }
        assignments = " ".join(f"{k}={v}" for k, v in env.items())
        name = f"loopd-run-{os.getpid()}"
        with terminal(name, f"cd {REPO} && {assignments} scripts/run.sh") as screen:
            until(lambda: "loopd chat: session 'terminal'" in screen(), "the chat", screen)
            tmux("send-keys", "-t", name, 'List the files in the folder "." of the workspace.')
            tmux("send-keys", "-t", name, "Enter")
            db = state / "loopd.db"
            until(lambda: tool_results(db, "terminal") > 0, "a tool result", screen)
            until(lambda: "└" in screen().split("• list_dir", 1)[-1], "its result", screen)
            shown = screen()
    assert "• list_dir(" in shown, shown
    after_call = shown.split("• list_dir(", 1)[1]
    assert "notes.txt" in after_call, shown
