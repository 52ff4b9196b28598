"""Markdown answers as a person sees them: rendered in ``loopd chat`` on a terminal (the screen
read back through a terminal emulator), raw when piped and in ``loopd run --json``, and a hostile
answer (escape sequences, rich markup) shown as text."""

from __future__ import annotations

import json
from pathlib import Path

from loopd_dev.fakes.llama import ScriptedReply
from tests.terminal.support import (
    PROMPT,
    emulated,
    fake_env,
    fake_llama,
    quit_chat,
    screen,
    spawn_chat,
)
from tests.test_cli import run_loopd

ANSWER = "## Steps\n\n- read the file\n- fix the bug\n\nThen **run** the tests."
HOSTILE = (
    "Hi \x1b]0;owned\x07 \x1b[2J\x1b[31mred\x1b[0m \x1b]52;c;cGF5bG9hZA==\x07 "
    "[link=https://evil.example]click[/link] [bold]loud[/bold] \x9b1m"
)


def _ask(tmp_path: Path, reply: str) -> str:
    with fake_llama() as server:
        server.script(ScriptedReply(content=reply))
        chat = spawn_chat(fake_env(server, tmp_path))
        chat.expect_exact(PROMPT)
        chat.send("How do I fix it?\r")
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
    return screen(chat)


def test_a_heading_and_a_list_are_rendered_in_the_chat(tmp_path: Path) -> None:
    written = _ask(tmp_path, ANSWER)
    shown = emulated(written)
    start = next(n for n, line in enumerate(shown) if line.startswith(PROMPT + "How do I"))
    assert shown[start + 1 : start + 7] == [
        "Steps",
        "",
        " • read the file",
        " • fix the bug",
        "",
        "Then run the tests.",
    ]
    assert "##" not in "\n".join(shown)
    assert "\x1b[1mrun\x1b[0m" in written  # bold on the terminal


def test_piped_and_json_answers_stay_raw(tmp_path: Path) -> None:
    with fake_llama() as server:
        env = fake_env(server, tmp_path)
        server.script(ScriptedReply(content=ANSWER))
        piped = run_loopd(["chat", "--session", "piped"], env, stdin="How do I fix it?\n")
        server.script(ScriptedReply(content=ANSWER))
        as_json = run_loopd(["run", "How do I fix it?", "--json"], env)
        server.script(ScriptedReply(content=ANSWER))
        run = run_loopd(["run", "How do I fix it?"], env)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == ANSWER + "\n"
    assert json.loads(as_json.stdout)["answer"] == ANSWER
    assert run.stdout == ANSWER + "\n"


def test_a_hostile_answer_is_shown_as_text(tmp_path: Path) -> None:
    written = _ask(tmp_path, HOSTILE)
    shown = "\n".join(emulated(written))
    assert "␛]0;owned␇ ␛[2J␛[31mred␛[0m ␛]52;c;cGF5bG9hZA==␇" in shown
    assert "[link=https://evil.example]click[/link] [bold]loud[/bold] <U+009B>1m" in shown
    # Only loopd's own sequences reach the terminal: colours, line erases, cursor moves; never an
    # OSC (title, clipboard, hyperlink), a screen clear or a C1 control.
    assert "\x1b]" not in written
    assert "\x1b[2J" not in written
    assert "\x9b" not in written
    assert "\x07" not in written
