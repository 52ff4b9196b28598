"""``loopd chat`` in a pseudo-terminal against the fake llama-server, which can script what the
model does: tool call lines, folded and whole thinking, logs kept off the screen, the ``/``
commands, and leaving with Ctrl-C or Ctrl-D at the prompt."""

from __future__ import annotations

import re
from pathlib import Path

import pexpect

from loopd.sessionlog.records import EntryKind
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.terminal.support import (
    PROMPT,
    FakeServer,
    entries,
    fake_env,
    fake_llama,
    matched,
    of_kind,
    plain,
    quit_chat,
    screen,
    spawn_chat,
)

THOUGHT = "The user wants the folder.\nI should list it first, then answer."
ANSWER = "The folder holds notes.txt and nothing else."


def _script_a_tool_round(server: FakeServer) -> None:
    server.script(
        ScriptedReply(
            reasoning=THOUGHT,
            tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}', "call_1"),),
        ),
        ScriptedReply(content=ANSWER),
    )


def _env(server: FakeServer, state: Path) -> dict[str, str]:
    return fake_env(server, state)


def test_a_tool_call_shows_its_name_arguments_and_result(tmp_path: Path) -> None:
    (tmp_path / "workspaces" / "tty").mkdir(parents=True)
    (tmp_path / "workspaces" / "tty" / "notes.txt").write_text("hello\n")
    with fake_llama() as server:
        _script_a_tool_round(server)
        chat = spawn_chat(_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("What is in the folder?\r")
        chat.expect(r"• list_dir\x1b\[0m\x1b\[2m\(path=\"\.\"\)")
        chat.expect(r"└ (.*?)\x1b\[0m")
        result_line = matched(chat)
        chat.expect_exact(ANSWER)
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    tool_results = of_kind(entries(tmp_path, "tty"), EntryKind.TOOL)
    assert len(tool_results) == 1
    assert "notes.txt" in result_line, result_line
    assert "notes.txt" in (tool_results[0].message or "")


def test_thinking_is_folded_to_one_line_and_shown_whole_when_asked(tmp_path: Path) -> None:
    with fake_llama() as server:
        _script_a_tool_round(server)
        chat = spawn_chat(_env(server, tmp_path / "folded"))
        chat.expect_exact(PROMPT)
        chat.send("What is in the folder?\r")
        chat.expect_exact(ANSWER)
        chat.expect_exact(PROMPT)
        folded = screen(chat)
        assert quit_chat(chat) == 0

        _script_a_tool_round(server)
        chat = spawn_chat(_env(server, tmp_path / "whole"), "--show-thinking")
        chat.expect_exact(PROMPT)
        chat.send("What is in the folder?\r")
        chat.expect_exact(ANSWER)
        chat.expect_exact(PROMPT)
        whole = screen(chat)
        assert quit_chat(chat) == 0
    first, second = THOUGHT.splitlines()
    # Folded: one dimmed summary line holds both lines of the thinking, joined.
    summary = re.search(r"\x1b\[2mthought for \d+ tokens: ([^\x1b]*)\x1b\[0m\r\n", folded)
    assert summary is not None, folded
    assert summary.group(1) == f"{first} {second}"
    assert f"{first}\r\n" not in folded
    # Whole: the thinking as written, its lines on lines of their own, and no summary.
    assert f"{first}\r\n{second}\r\n" in plain(whole)
    assert "thought for" not in whole


def test_logs_go_to_a_file_named_once_and_never_onto_the_screen(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("Hello?\r")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    shown = screen(chat)
    log_file = tmp_path / "chat.log"
    assert shown.count(str(log_file)) == 1, shown
    assert "model request" in log_file.read_text()
    assert "model request" not in shown
    assert '"level"' not in shown


def test_log_stderr_keeps_the_logs_on_the_terminal(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(_env(server, tmp_path), "--log-stderr")
        chat.expect_exact(PROMPT)
        chat.send("Hello?\r")
        chat.expect("model request")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    assert not (tmp_path / "chat.log").exists()


def test_slash_commands(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("Hello?\r")
        chat.expect_exact(PROMPT)
        chat.send("/help\r")
        chat.expect_exact("/sessions")
        chat.expect_exact(PROMPT)
        chat.send("/perf\r")
        chat.expect_exact("session tty: 1 turn, 1 request to the model")
        chat.expect_exact(PROMPT)
        chat.send("/new second\r")
        chat.expect_exact("new session 'second'")
        chat.expect_exact(PROMPT)
        chat.send("/new second\r")
        chat.expect_exact("a session 'second' exists already")
        chat.expect_exact(PROMPT + "/resume second")  # offered: Ctrl-U clears it
        chat.send("\x15Hello again?\r")
        chat.expect_exact(PROMPT)
        chat.send("/sessions\r")
        chat.expect(r"second\s+0\s+1\s+3\s+answered")
        chat.expect_exact("(this chat: second)")
        chat.expect_exact(PROMPT)
        chat.send("/frobnicate\r")
        chat.expect_exact("loopd: no command /frobnicate; /help lists them")
        chat.expect_exact(PROMPT)
        chat.send("/quit\r")
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
    assert len(of_kind(entries(tmp_path, "tty"), EntryKind.USER)) == 1
    assert len(of_kind(entries(tmp_path, "second"), EntryKind.USER)) == 1


def test_ctrl_c_at_the_prompt_leaves(tmp_path: Path) -> None:
    with fake_llama() as server:
        chat = spawn_chat(_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("half a thought")
        # Once readline has taken the keys: a signal that comes while it is handling a key, not
        # waiting for one, is seen only at the next key (CPython's readline module checks for
        # signals when its wait is interrupted).
        chat.expect_exact("half a thought")
        chat.sendintr()
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
    assert "Traceback" not in screen(chat)
    assert of_kind(entries(tmp_path, "tty"), EntryKind.USER) == []
