"""What the operator's terminal shows of a turn: the model's text and the box's files as text,
never as terminal controls.

``loopd run`` and ``loopd chat`` run in a real pseudo-terminal against the fake llama-server,
which answers with escape sequences in its thinking, its answer and (through a file in the
workspace) a tool result. Their raw output is fed to a terminal emulator (pyte), whose screen
and title are what the operator would see.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pexpect
import pyte
import pytest

from loopcommon.logsetup import HumanFormatter
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.terminal.support import LOOPD, PROMPT, FakeServer, fake_env, fake_llama

if TYPE_CHECKING:
    Child = pexpect.spawn[str]  # the stubs give a spawn without an encoding this type too

ESC, BEL, ST = "\x1b", "\x07", "\x1b\\"
C1_CSI = "\x9b"
# Each hostile piece carries a word that must still be read on the screen.
HOSTILE = (
    f"{ESC}]52;c;cm0gLXJmIH4K{BEL}"  # OSC 52: write "rm -rf ~" to the clipboard
    f"{ESC}]0;pwned-title{BEL}"  # OSC 0: the window title
    f"{ESC}]8;;https://evil.example/{ST}click{ESC}]8;;{ST}"  # OSC 8: a hyperlink
    f"{ESC}[2J{ESC}[H"  # clear the screen, cursor home
    f"{C1_CSI}2J"  # the same clear, with the one-byte C1 CSI
    "\u202eolleh"  # a bidi override
)
FILE_TEXT = f"FILEWORD {HOSTILE} end of file\n"
THOUGHT = f"THINKWORD {HOSTILE} more thought"
ANSWER = f"ANSWERWORD {HOSTILE} the end"
BEFORE = "BEFORE-THE-TURN"
ROWS, COLUMNS = 40, 200


def _script(server: FakeServer) -> None:
    server.script(
        ScriptedReply(
            reasoning=THOUGHT,
            tool_calls=(ScriptedToolCall("read_file", '{"path": "notes.txt"}', "call_1"),),
        ),
        ScriptedReply(content=ANSWER),
    )


def _workspace(state: Path, session: str) -> None:
    folder = state / "workspaces" / session
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text(FILE_TEXT)


def _spawn(env: dict[str, str], shell_line: str) -> Child:
    """A shell line in a pseudo-terminal; every byte it writes is kept in ``logfile_read`` (not
    decoded: an escape sequence is bytes)."""
    child = pexpect.spawn("sh", ["-c", shell_line], env=env, timeout=60, dimensions=(ROWS, COLUMNS))
    child.logfile_read = io.BytesIO()
    return child


def _transcript(child: Child) -> bytes:
    log = child.logfile_read
    assert isinstance(log, io.BytesIO)
    return log.getvalue()


def _seen(raw: bytes) -> pyte.Screen:
    screen = pyte.Screen(COLUMNS, ROWS)
    pyte.ByteStream(screen).feed(raw)
    return screen


def _check(raw: bytes, observed: Callable[[str], None]) -> None:
    screen = _seen(raw)
    shown = "\n".join(line.rstrip() for line in screen.display)
    links = [row for row in screen.buffer.values() for char in row.values() if "8;;" in char.data]
    clipboard, link = b"\x1b]52" in raw, b"\x1b]8" in raw
    observed(
        f"title {screen.title!r}; OSC 52 in the bytes: {clipboard}; OSC 8 in the bytes: {link}; "
        f"{BEFORE} still shown: {BEFORE in shown}"
    )
    assert screen.title == "", screen.title
    for sequence in (b"\x1b]52", b"\x1b]8", b"\x1b]0", b"\x1b[2J"):
        assert sequence not in raw, sequence
    text = raw.decode()
    assert C1_CSI not in text
    assert "\u202e" not in text
    assert not links
    # Nothing was cleared: what the terminal showed before the turn is still there, and so is
    # every word of the hostile text, as text.
    assert BEFORE in shown, shown
    for word in ("THINKWORD", "FILEWORD", "ANSWERWORD", "pwned-title", "click", "the end"):
        assert word in shown, (word, shown)


@pytest.mark.attack(
    attack="Escape sequences from the model or a workspace file reach the operator's terminal",
    input="`loopd run` on a terminal; thinking, answer and a read_file result carry OSC 52 "
    "(clipboard), OSC 0 (title), OSC 8 (link), CSI 2J and C1 CSI (clear), U+202E",
    expected="the emulator shows the words as text: title unchanged, nothing cleared, "
    "no link, no clipboard write",
)
def test_loopd_run_shows_escapes_as_text(tmp_path: Path, observed: Callable[[str], None]) -> None:
    _workspace(tmp_path, "esc")
    with fake_llama() as server:
        _script(server)
        env = fake_env(server, tmp_path)
        line = f"echo {BEFORE}; exec {' '.join(LOOPD)} run 'Read notes.txt' --session esc"
        child = _spawn(env, line)
        try:
            child.expect(pexpect.EOF)  # the run ends
        finally:
            child.close()
    raw = _transcript(child)
    assert child.exitstatus == 0, raw.decode(errors="replace")
    _check(raw, observed)


@pytest.mark.attack(
    attack="Escape sequences from the model reach the terminal through a transcript",
    input="`loopd log export --format markdown` on a terminal, of the session of the run above",
    expected="the same: shown as text, nothing obeyed",
)
def test_a_markdown_export_shows_escapes_as_text(
    tmp_path: Path, observed: Callable[[str], None]
) -> None:
    _workspace(tmp_path, "esc")
    with fake_llama() as server:
        _script(server)
        env = fake_env(server, tmp_path)
        done = subprocess.run(
            [*LOOPD, "run", "Read notes.txt", "--session", "esc"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    line = f"echo {BEFORE}; exec {' '.join(LOOPD)} log export esc --format markdown"
    child = _spawn(env, line)
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    _check(_transcript(child), observed)


@pytest.mark.attack(
    attack="Escape sequences from the model reach the terminal through `loopd chat`",
    input="`loopd chat --show-thinking` on a terminal; the same thinking, answer and tool "
    "result as for `loopd run`",
    expected="the same: shown as text, nothing obeyed",
)
def test_loopd_chat_shows_escapes_as_text(tmp_path: Path, observed: Callable[[str], None]) -> None:
    _workspace(tmp_path, "esc")
    with fake_llama() as server:
        _script(server)
        env = fake_env(server, tmp_path)
        line = f"echo {BEFORE}; exec {' '.join(LOOPD)} chat --session esc --show-thinking"
        child = _spawn(env, line)
        try:
            child.expect_exact(PROMPT.encode())
            child.send(b"Read notes.txt\r")
            child.expect_exact(b"the end")
            child.expect_exact(PROMPT.encode())
            child.sendeof()
            child.expect(pexpect.EOF)
        finally:
            child.close()
    _check(_transcript(child), observed)


@pytest.mark.attack(
    attack="`--json` and piped output are data: loopd leaves the model's bytes as written",
    input="`loopd run --json` and `loopd run` with stdout a pipe, the same hostile answer",
    expected="the answer in the output byte for byte",
)
def test_json_and_piped_output_keep_the_bytes(
    tmp_path: Path, observed: Callable[[str], None]
) -> None:
    _workspace(tmp_path, "esc")
    with fake_llama() as server:
        env = fake_env(server, tmp_path)
        _script(server)
        as_json = subprocess.run(
            [*LOOPD, "run", "Read notes.txt", "--session", "esc", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        _script(server)
        piped = subprocess.run(
            [*LOOPD, "run", "Read notes.txt", "--session", "esc"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    record = json.loads(as_json.stdout)
    kept = (record["answer"] == ANSWER, piped.stdout == ANSWER + "\n")
    observed(f"answer kept byte for byte: --json {kept[0]}, piped {kept[1]}")
    assert record["answer"] == ANSWER
    assert record["tool_calls"][0]["result"].startswith("FILEWORD " + ESC)
    assert piped.stdout == ANSWER + "\n"


@pytest.mark.attack(
    attack="A log line quoting the model's or the box's text reaches the terminal as controls",
    input="a log record whose message holds OSC 52, OSC 0 and C1 CSI, in the human format "
    "(logs on a terminal, `--log-stderr`)",
    expected="the line shows them as text",
)
def test_log_lines_on_a_terminal_show_escapes_as_text(observed: Callable[[str], None]) -> None:
    record = logging.LogRecord(
        "loopd.x", logging.WARNING, __file__, 1, "tool said %s", (ANSWER,), None
    )
    line = HumanFormatter().format(record)
    observed(line.split(": ", 1)[1])
    screen = _seen(line.encode())
    assert screen.title == ""
    assert ESC not in line
    assert C1_CSI not in line
    assert "ANSWERWORD" in line
