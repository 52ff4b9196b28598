"""``make run`` as a newcomer uses it, in tmux: a Ctrl-C in the middle of an answer stops that turn
only, the next message is answered on the same servers, and Ctrl-D leaves no process and no
socket file behind; Ctrl-Z and ``fg`` from the shell that ran it continue the chat, and nothing
typed or pasted is lost or taken for a key (a paste with 0x1a, a 1 MB paste, a line typed during an
answer, a line begun and then Ctrl-C).

The terminal is tmux's (``capture-pane`` is what a person sees); the stack is the real one that
``make run`` starts (the router with SmolLM2, brokerd's inference proxy and tool broker, loopd
chat). Every wait is for text on the screen or for a process to be gone, bounded generously; the
model's work is bounded by the tokens ``make run`` allows a turn.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog

REPO = Path(__file__).parents[2]
PROMPT = "you> "
STORY = "Write a very long story about a dragon and a knight, with many chapters."
WAIT_S = 600.0  # the router loads two models on a busy machine; each wait ends at its event


class Tmux:
    """One tmux server of the test's own (``-L``), one window running ``command``."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.name = f"loopd-test-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.tmux("new-session", "-d", "-x", "160", "-y", "50", "-s", "run", command)

    def paste(self, path: Path) -> None:
        """The file's bytes as a terminal pastes them (bracketed, as the chat asks)."""
        self.tmux("load-buffer", str(path))
        self.tmux("paste-buffer", "-p", "-d", "-t", "run")

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.name, *args], env=self.env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-500", "-t", "run")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "run", *keys)

    def wait_for(self, what: str, found: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            if found(screen):
                return screen
            time.sleep(0.25)
        pytest.fail(f"never on the screen: {what}\n--- screen ---\n{self.screen()}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], env=self.env, check=False)


def processes_under(folder: Path) -> list[str]:
    """Command lines of the processes that name ``folder`` (the stack of this run)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in argv:
            found.append(f"{proc.name}: {argv}")
    return found


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Short: the Unix sockets live under it, and a socket path has at most 107 bytes.
    folder = Path(f"/tmp/loopd-run-{uuid.uuid4().hex[:8]}")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(int(4 * WAIT_S))
def test_make_run_ctrl_c_stops_the_answer_only_and_ctrl_d_leaves_nothing(state_dir: Path) -> None:
    assert shutil.which("tmux"), "tmux is required for this test (apt-get install tmux)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
    env["LOOPD_STATE_DIR"] = str(state_dir)
    env["LOOPD_TEMPERATURE"] = "0"  # greedy: the story runs to make run's token limit, not shorter
    if "LOOPDEV_CACHE_DIR" in os.environ:
        env["LOOPDEV_CACHE_DIR"] = os.environ["LOOPDEV_CACHE_DIR"]
    done = Path(f"/tmp/loopd-run-status-{uuid.uuid4().hex[:8]}")
    tmux = Tmux(f"make -C {REPO} run; echo $? > {done}; sleep 600", env)
    try:
        tmux.wait_for("the chat's prompt", lambda s: s.rstrip().endswith(PROMPT.rstrip()))
        tmux.keys(STORY, "Enter")
        tmux.wait_for("the answer streaming", lambda s: len(s.split(STORY)[-1].strip()) > 30)
        tmux.keys("C-c")
        stopped = tmux.wait_for(
            "the prompt again after the stop",
            lambda s: s.split(STORY)[-1].rstrip().endswith(PROMPT.rstrip()),
        )
        assert "[stopped" in stopped.split(STORY)[-1], stopped
        assert "unreachable" not in stopped
        tmux.keys("Say hello.", "Enter")
        second = tmux.wait_for(
            "the second message answered",
            lambda s: s.split("Say hello.")[-1].rstrip().endswith(PROMPT.rstrip()),
        )
        answer = second.split("Say hello.")[-1].rsplit(PROMPT.rstrip(), 1)[0]
        assert answer.strip(), second
        assert "unreachable" not in answer, answer
        assert "loopd:" not in answer, answer
        tmux.keys("C-d")
        tmux.wait_for("make run ended", lambda _: done.exists())
        assert done.read_text().strip() == "0", tmux.screen()
        deadline = time.monotonic() + 60
        while processes_under(state_dir) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert processes_under(state_dir) == []
        sockets = [p for p in state_dir.rglob("*") if p.is_socket()]
        assert sockets == []
    finally:
        tmux.kill()
        for line in processes_under(state_dir):
            os.kill(int(line.split(":")[0]), 9)
        done.unlink(missing_ok=True)


def answered_after(words: str) -> Callable[[str], bool]:
    """The screen shows the prompt again after ``words``."""
    return lambda s: words in s and s.split(words)[-1].rstrip().endswith(PROMPT.rstrip())


def user_messages(state_dir: Path) -> list[str]:
    with SessionLog.open(state_dir / "loopd.db", create=False) as log:
        found = log.entries("terminal")
    return [json.loads(e.message or "")["content"] for e in found if e.kind is EntryKind.USER]


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(int(6 * WAIT_S))
def test_make_run_suspends_and_loses_nothing_typed_or_pasted(
    state_dir: Path, tmp_path: Path
) -> None:
    assert shutil.which("tmux"), "tmux is required for this test (apt-get install tmux)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
    env["LOOPD_STATE_DIR"] = str(state_dir)
    env["LOOPD_TEMPERATURE"] = "0"
    if "LOOPDEV_CACHE_DIR" in os.environ:
        env["LOOPDEV_CACHE_DIR"] = os.environ["LOOPDEV_CACHE_DIR"]
    done = Path(f"/tmp/loopd-run-status-{uuid.uuid4().hex[:8]}")
    # An interactive shell runs make, as a person's does: it has the job control fg needs.
    tmux = Tmux("bash --norc --noprofile -i", env)
    try:
        # Not `make ...; echo $?`: the shell would go on to the echo when make is stopped.
        tmux.keys(f"make -C {REPO} run", "Enter")
        tmux.wait_for("the chat's prompt", lambda s: s.rstrip().endswith(PROMPT.rstrip()))

        # Ctrl-Z with a line begun: the shell has the job; fg brings the chat and the line back.
        tmux.keys("Say hello.")
        tmux.keys("C-z")
        tmux.wait_for("make run stopped", lambda s: "Stopped" in s and "make -C" in s)
        tmux.keys("fg", "Enter")
        tmux.wait_for("the line back", lambda s: s.rstrip().endswith(PROMPT + "Say hello."))
        tmux.keys("Enter")
        tmux.wait_for("the answer after fg", answered_after("Say hello."))

        # A paste holding 0x1a (and 0x03) is text: one message, the servers still there.
        control = tmp_path / "control.txt"
        control.write_bytes(b"Repeat: before\x1aafter\x03end.")
        tmux.paste(control)
        tmux.keys("Enter")
        tmux.wait_for("the pasted message answered", answered_after("end."))

        # A 1 MB paste: one short line; the message kept whole in the workspace, said so.
        big = tmp_path / "big.txt"
        big.write_text("\n".join(f"Line {n}: the quick brown fox." for n in range(35_000)))
        assert big.stat().st_size > 1_000_000
        tmux.paste(big)
        tmux.wait_for("the paste drawn as one line", lambda s: "[pasted 35,000 lines]" in s)
        tmux.keys("Enter")
        kept = tmux.wait_for("the kept-whole notice", answered_after("to read."))
        notice = " ".join(kept.split("Your message was")[-1].split())
        [name] = [w for w in notice.split() if w.startswith("messages/")]
        kept_file = state_dir / "workspaces" / "terminal" / name.rstrip(",")
        assert kept_file.read_bytes() == big.read_bytes()

        # A line typed during an answer: shown as sent, then answered.
        tmux.keys(STORY, "Enter")
        tmux.wait_for("the story streaming", lambda s: len(s.split(STORY)[-1].strip()) > 30)
        tmux.keys("Name a colour.", "Enter")
        tmux.wait_for("the typed line sent", answered_after(PROMPT + "Name a colour."))

        # A line begun during an answer, then Ctrl-C: back on the prompt.
        tmux.keys("Tell me another long story about a castle.", "Enter")
        castle = "Tell me another long story about a castle."
        tmux.wait_for("the second story", lambda s: len(s.split(castle)[-1].strip()) > 30)
        tmux.keys("keep this line")
        tmux.keys("C-c")
        tmux.wait_for(
            "the begun line back", lambda s: s.rstrip().endswith(PROMPT + "keep this line")
        )
        tmux.keys("C-u", "C-d")
        tmux.wait_for("make run ended", lambda _: processes_under(state_dir) == [])
        tmux.keys(f"echo $? > {done}", "Enter")  # the status of fg: make's
        tmux.wait_for("make's exit status", lambda _: done.exists())
        assert done.read_text().strip() == "0", tmux.screen()
    finally:
        tmux.kill()
        for line in processes_under(state_dir):
            os.kill(int(line.split(":")[0]), 9)
        done.unlink(missing_ok=True)
    said = user_messages(state_dir)
    assert said[:2] == ["Say hello.", "Repeat: before\x1aafter\x03end."]
    assert said[2].startswith("Line 0: the quick brown fox.")
    assert said[3:] == [STORY, "Name a colour.", castle]
