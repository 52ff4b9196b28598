"""Going back to a session inside the chat: ``/resume NAME`` with Tab completing the command and
the name, and ``/new NAME`` on a name in use putting ``/resume NAME`` on the next line."""

from __future__ import annotations

from pathlib import Path

from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from tests.terminal.support import (
    PROMPT,
    entries,
    fake_env,
    fake_llama,
    of_kind,
    quit_chat,
    screen,
    spawn_chat,
)


def _user_texts(state: Path, session: str) -> int:
    return len(of_kind(entries(state, session), EntryKind.USER))


def test_resume_switches_sessions_with_completion_and_new_offers_it(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(fake_env(server, tmp_path), session="first")
        chat.expect_exact(PROMPT)
        chat.send("Hello in first\r")
        chat.expect_exact(PROMPT)
        chat.send("/new second-thread\r")
        chat.expect_exact("new session 'second-thread'")
        chat.expect_exact(PROMPT)
        chat.send("Hello in second\r")
        chat.expect_exact(PROMPT)

        # /new on a name in use: the error says what to do, and the next line holds it.
        chat.send("/new first\r")
        chat.expect_exact("a session 'first' exists already: /resume first goes on with it")
        chat.expect_exact(PROMPT + "/resume first")
        chat.send("\r")
        chat.expect_exact("resumed session 'first'")
        chat.expect_exact(PROMPT)
        chat.send("Back in first\r")
        chat.expect_exact(PROMPT)

        # Tab: the command's name, then the session's.
        chat.send("/res\t")
        chat.expect_exact("/resume ")
        chat.send("sec\t")
        chat.expect_exact("ond-thread")
        chat.send("\r")
        chat.expect_exact("resumed session 'second-thread'")
        chat.expect_exact(PROMPT)
        chat.send("/sessions\r")
        chat.expect_exact("(this chat: second-thread)")
        chat.expect_exact(PROMPT)

        chat.send("/resume nowhere\r")
        chat.expect_exact("no session 'nowhere'; /sessions lists them, /new nowhere starts it")
        chat.expect_exact(PROMPT)
        chat.send("Still in second\r")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert "Traceback" not in screen(chat)
    assert _user_texts(tmp_path, "first") == 2
    assert _user_texts(tmp_path, "second-thread") == 2
    with SessionLog.open(tmp_path / "loopd.db", create=False) as log:
        assert [s.name for s in log.sessions()] == ["first", "second-thread"]  # no "nowhere"
