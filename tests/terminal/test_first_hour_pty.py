"""The first hour in ``loopd chat``, in a real pseudo-terminal on the fake server: nothing typed or
pasted is lost or taken for a key.

- a paste holding control bytes (0x1a, 0x03, 0x1c) is one message, those bytes its text;
- a paste of 15,000 lines is drawn as one line, and a message longer than the context is kept
  whole in the session's workspace, the person told so;
- a line typed during an answer is shown as sent and answered; one begun and not sent, then
  Ctrl-C, comes back on the prompt;
- a second chat on a session in use is refused in one line (exit 2);
- ``/retry`` generates the last answer again, the first staying in the log, not in the replay.

Ctrl-Z needs a shell with job control to stop and continue the chat: the tmux test of
``make run`` tries it (``test_make_run_tmux.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pexpect

from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify
from loopd_dev.fakes.llama import Pace, ScriptedReply
from tests.terminal.support import (
    PROMPT,
    FakeServer,
    content,
    entries,
    fake_env,
    fake_llama,
    of_kind,
    plain,
    quit_chat,
    screen,
    spawn_chat,
)
from tests.test_cli import run_loopd

if TYPE_CHECKING:
    from tests.terminal.support import Chat

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


def user_texts(state_dir: Path, session: str = "tty") -> list[str]:
    return [content(e) for e in of_kind(entries(state_dir, session), EntryKind.USER)]


def test_control_bytes_in_a_paste_are_text(tmp_path: Path) -> None:
    pasted = "before\x1aafter\x03then\x1cend\nsecond line"
    with fake_llama() as server:
        chat = spawn_chat(fake_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send(PASTE_START + pasted + PASTE_END)
        chat.send("\r")
        chat.expect_exact("You said:")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert user_texts(tmp_path) == [pasted]


def test_a_long_paste_is_one_line_and_kept_whole(tmp_path: Path) -> None:
    pasted = "\n".join(f"line {n} of the paste, with some words in it" for n in range(15_000))
    with fake_llama() as server:
        chat = spawn_chat(fake_env(server, tmp_path), timeout=120)
        chat.expect_exact(PROMPT)
        chat.send(PASTE_START + pasted + PASTE_END)
        chat.expect_exact("[pasted 15,000 lines]")
        chat.send("\r")
        chat.expect(r"Your message was ([\d,]+) tokens")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    shown = plain(screen(chat))
    assert "line 14999" not in shown.split("You said:")[0], "the paste was drawn line by line"
    said = " ".join(shown.split("Your message was", 1)[1].split())
    kept = re.search(r"kept in its workspace as (messages/\S+\.txt), to read\.", said)
    assert kept is not None, said
    workspace = tmp_path / "workspaces" / "tty"
    assert (workspace / kept.group(1)).read_text() == pasted  # the whole message, byte for byte
    [stored] = user_texts(tmp_path)
    assert stored.startswith("line 0 of the paste")
    assert f"are in the file {kept.group(1)} of the workspace" in stored  # the model is told


def answering(server: FakeServer, state_dir: Path, words: int, then: str) -> Chat:
    """A chat whose answer of ``words`` words is streaming; the next answer will be ``then``."""
    server.script(ScriptedReply(content="word " * words), ScriptedReply(content=then))
    chat = spawn_chat(fake_env(server, state_dir))
    chat.expect_exact(PROMPT)
    chat.send("Talk for a while.\r")
    chat.expect_exact("word word")
    return chat


def test_a_line_typed_during_an_answer_is_shown_as_sent(tmp_path: Path) -> None:
    with fake_llama(Pace(tokens_per_second=40)) as server:
        chat = answering(server, tmp_path, 80, then="Second.")
        chat.send("typed meanwhile\r")
        chat.expect_exact(PROMPT + "typed meanwhile")
        chat.expect_exact("Second.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert user_texts(tmp_path) == ["Talk for a while.", "typed meanwhile"]


def test_ctrl_c_brings_a_line_typed_during_the_answer_back(tmp_path: Path) -> None:
    with fake_llama(Pace(tokens_per_second=20)) as server:
        chat = answering(server, tmp_path, 400, then="Kept.")
        chat.send("do not lose this")
        chat.sendintr()
        chat.expect_exact("[stopped")
        chat.expect_exact(PROMPT + "do not lose this")
        chat.send("\r")
        chat.expect_exact("Kept.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert user_texts(tmp_path) == ["Talk for a while.", "do not lose this"]


def test_a_second_chat_on_a_session_in_use_is_refused(tmp_path: Path) -> None:
    with fake_llama() as server:
        env = fake_env(server, tmp_path)
        chat = spawn_chat(env, session="busy")
        chat.expect_exact(PROMPT)
        for command in (["chat", "--session", "busy"], ["run", "Hello?", "--session", "busy"]):
            second = run_loopd(command, env)
            assert second.returncode == 2
            [line] = second.stderr.splitlines()
            assert line.startswith("loopd: session 'busy' is in use by another loopd chat or run")
        chat.send("/new other\r")  # the first chat lets it go when it moves on
        chat.expect_exact("new session 'other'")
        chat.expect_exact(PROMPT)
        moved = run_loopd(["run", "Hello?", "--session", "busy"], env)
        assert moved.returncode == 0, moved.stderr
        assert quit_chat(chat) == 0


def test_retry_generates_the_last_answer_again(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content="First answer."), ScriptedReply(content="Again."))
        chat = spawn_chat(fake_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("/retry\r")
        chat.expect_exact("loopd: /retry: there is no answer to generate again yet")
        chat.send("A question.\r")
        chat.expect_exact("First answer.")
        chat.expect_exact(PROMPT)
        chat.send("/retry\r")
        chat.expect_exact("Again.")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    found = entries(tmp_path, "tty")
    answers = [content(e) for e in of_kind(found, EntryKind.ASSISTANT)]
    assert answers == ["First answer.", "Again."]  # both in the log
    with SessionLog.open(tmp_path / "loopd.db", create=False) as log:
        replayed = [json.loads(m).get("content") for m in log.replay_messages("tty")]
        assert verify(log) == []
    assert "First answer." not in replayed
    assert replayed[-2:] == ["A question.", "Again."]


def test_ctrl_c_at_the_prompt_still_leaves(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(fake_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("half a line")
        chat.sendintr()
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
