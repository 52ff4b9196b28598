"""``LOOPD_MODEL=qwen-coder-agent make run`` (scripts/run.sh) in a real terminal (tmux): the
whole stack comes up on the agent model, a message asking what a file says gets a real
``read_file`` call, its line and its result's line are on the screen, and then the answer, in
words, with the value the file holds.

Waits are bounded polls on what the stack writes (the chat's welcome line on the screen, the
tool result and the answer in the session log), never sleeps; the model's work is bounded by
``max_tokens`` 150 a request and the loop guards. The tmux session, and with it everything
run.sh started, ends whatever happens.
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


def entry_kinds(db: Path, session: str) -> list[EntryKind]:
    """The kinds of the session's entries (none before the chat made the log)."""
    if not db.exists():
        return []
    with SessionLog.open(db, create=False) as log:
        if session not in {s.name for s in log.sessions()}:
            return []
        return [e.kind for e in log.entries(session)]


def answered_after_a_tool(db: Path, session: str) -> bool:
    """A tool result, then the turn's end: an answer (or a note, which a guard writes)."""
    kinds = entry_kinds(db, session)
    if EntryKind.TOOL not in kinds:
        return False
    after = kinds[len(kinds) - kinds[::-1].index(EntryKind.TOOL) :]
    return EntryKind.ASSISTANT in after or EntryKind.NOTE in after


def test_make_run_on_the_agent_model_answers_with_the_value_the_file_holds() -> None:
    # Short paths: the stack's Unix sockets live under the run folder.
    with tempfile.TemporaryDirectory(prefix="lr") as tmp:
        state, run = Path(tmp) / "s", Path(tmp) / "r"
        workspaces = state / "workspaces"
        (session_workspace(workspaces, "terminal") / "garden.txt").write_text(
            "The garden has one flower: a yellow tulip by the gate.\n"
        )
        env = {
            "LOOPD_MODEL": devserver.AGENT_MODEL,
            "LOOPD_STATE_DIR": str(state),
            "MAKE_RUN_DIR": str(run),
            "LOOPDEV_CACHE_DIR": str(devserver.default_cache_dir()),
        }
        assignments = " ".join(f"{k}={v}" for k, v in env.items())
        name = f"loopd-run-{os.getpid()}"
        with terminal(name, f"cd {REPO} && {assignments} scripts/run.sh") as screen:
            until(lambda: "loopd chat: session 'terminal'" in screen(), "the chat", screen)
            tmux("send-keys", "-t", name, "Read garden.txt and name the flower it mentions.")
            tmux("send-keys", "-t", name, "Enter")
            db = state / "loopd.db"
            until(lambda: answered_after_a_tool(db, "terminal"), "the answer", screen)
            until(lambda: "tulip" in screen().split("• read_file", 1)[-1], "it shown", screen)
            shown = screen()
            kinds = entry_kinds(db, "terminal")
    print(shown)
    assert "• read_file(" in shown, shown
    call, _, after = shown.partition("• read_file(")[2].partition("\n")
    assert "garden.txt" in call
    assert "└" in after, shown  # the result's line
    assert EntryKind.NOTE not in kinds, kinds  # no guard ended the turn
    answer = after.split("└", 1)[1].split("\n", 1)[1]  # what follows the result's line
    assert "tulip" in answer.lower(), shown
