"""Searching the sessions as a person does: ``loopd log search`` piped and on a terminal, and
``/search`` in the chat, against a log the fake llama-server's turns wrote."""

from __future__ import annotations

from pathlib import Path

import pexpect

from loopd.sessionlog.records import fresh_external_key
from loopd_dev.fakes.llama import ScriptedReply
from tests.sessionlog.sessionlog_support import assistant_text, open_started, request_for
from tests.terminal.support import (
    LOOPD,
    PROMPT,
    fake_env,
    fake_llama,
    quit_chat,
    screen,
    spawn_chat,
)
from tests.test_cli import run_loopd

HOSTILE = "the kiwi \x1b]0;pwned\x07 title and \x1b[31mred\x1b[0m and [link=http://x]click[/link]"


def _log_with(state: Path, *exchanges: tuple[str, str, str]) -> None:
    """A log holding (session, question, answer) exchanges, in order."""
    db_path = state / "loopd.db"
    for slot, (session, question, answer) in enumerate(exchanges):
        with open_started(db_path, session, slot) as log:
            log.append_user(session, question, external_key=fresh_external_key())
            text = assistant_text(answer)
            log.append_assistant(session, text, request=request_for(log, session))


def test_log_search_piped_lists_hits_newest_first_as_data(tmp_path: Path) -> None:
    _log_with(
        tmp_path,
        ("alpha", "What do kiwis eat?", "Kiwis eat insects and worms."),
        ("beta", "Anything about birds?", HOSTILE),
    )
    env = {"LOOPD_STATE_DIR": str(tmp_path)}
    found = run_loopd(["log", "search", "kiwi"], env)
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert [line.split("  ", 1)[1].split(":", 1)[0] for line in lines] == [
        "beta #3 assistant",
        "alpha #3 assistant",
        "alpha #2 user",  # "kiwi" finds "kiwis": English stems
    ]
    assert lines[2].endswith("alpha #2 user: What do kiwis eat?")
    assert "\x1b]0;pwned\x07" in lines[0]  # piped output is data: as written
    assert (tmp_path / "search.db").exists()

    narrowed = run_loopd(["log", "search", "kiwis", "insects", "--session", "alpha"], env)
    assert narrowed.stdout.splitlines() == [lines[1]]
    assert lines[1].endswith("alpha #3 assistant: Kiwis eat insects and worms.")
    missing = run_loopd(["log", "search", "penguin"], env)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "loopd: log search: no entry mentions 'penguin'\n"
    empty = run_loopd(["log", "search", "--", "*"], env)
    assert empty.returncode == 2
    assert "nothing to search for" in empty.stderr


def test_log_search_on_a_terminal_shows_escapes_as_text(tmp_path: Path) -> None:
    _log_with(tmp_path, ("beta", "Anything about birds?", HOSTILE))
    env = {"LOOPD_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    child = pexpect.spawn(
        LOOPD[0], [*LOOPD[1:], "log", "search", "kiwi"], env=env, encoding="utf-8", timeout=60
    )
    shown = child.read()
    child.close()
    assert child.exitstatus == 0, shown
    assert "\x1b" not in shown
    assert "\x07" not in shown
    assert "beta #3 assistant: the kiwi ␛]0;pwned␇ title and ␛[31mred␛[0m" in shown
    assert "[link=http://x]click[/link]" in shown


def test_slash_search_in_the_chat_finds_turns_of_other_sessions(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content="Mount Ruapehu is a volcano."))
        chat = spawn_chat(fake_env(server, tmp_path), session="first")
        chat.expect_exact(PROMPT)
        chat.send("Tell me about Ruapehu\r")
        chat.expect_exact(PROMPT)
        chat.send("/new second\r")
        chat.expect_exact(PROMPT)
        chat.send("/search ruapehu volcano\r")
        chat.expect(r"first #\d+ assistant: Mount Ruapehu is a volcano\.")
        chat.expect_exact(PROMPT)
        chat.send("/search nothing-like-it\r")
        chat.expect_exact("no entry mentions 'nothing-like-it'")
        chat.expect_exact(PROMPT)
        chat.send("/search\r")
        chat.expect_exact("/search takes the words to look for")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert "Traceback" not in screen(chat)
