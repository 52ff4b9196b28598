"""``loopd chat`` in a real pseudo-terminal against the real llama-server: the answer is on screen
while it is still being generated, Ctrl-C mid-turn frees the slot at once and the chat goes on
(and the stopped turn is not answered when the chat starts again), keys typed during an answer wait
for the next prompt, arrow keys edit the line, and a pasted two-line message is one turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind, RequestKind
from loopd.turnstop import STOPPED
from loopd_dev import devserver
from tests.terminal.support import (
    ANSWER_TEXT,
    PROMPT,
    array_digest,
    content,
    emulated,
    entries,
    loopd_env,
    matched,
    of_kind,
    plain,
    quit_chat,
    requests,
    screen,
    slot_busy,
    slot_decoded,
    spawn_chat,
    split_array,
    until,
)
from tests.test_cli import run_loopd

pytestmark = pytest.mark.real_server

MODEL = devserver.PLAIN_MODEL
STORY = "Write a very long story about a dragon and a knight, with many chapters."
# Every turn's bound, "Say hello." (answered greedily, it rambles to the bound) included: enough
# that a story is still being written when Ctrl-C lands (a quiet machine writes about 200 tokens
# a second), few enough that a loaded one (16 a second seen) finishes a turn well inside the
# chat's 60 s wait, so the next test does not wait behind it.
MAX_TOKENS = "500"
TYPED_AHEAD = "Now list three rivers."


def test_answer_streams_and_ctrl_c_stops_the_turn_only(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = loopd_env(
        real_server.url, tmp_path, max_tokens=MAX_TOKENS, temperature="0", think_cap="0"
    )
    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)
    chat.send(STORY + "\r")

    # The answer's first words are on screen...
    chat.expect(ANSWER_TEXT % 30)
    on_screen = matched(chat)
    # ...while the turn is still under way: no answer in the log, the slot still generating.
    assert of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT) == []
    assert slot_busy(real_server.url, MODEL), "the turn ended before the words were checked"

    chat.sendintr()
    chat.expect_exact("[stopped")
    # The server stopped generating for the stop, not at the token limit: the last count seen
    # while the slot was busy is far below it (the time that takes depends on the machine).
    seen: list[int] = []

    def freed() -> bool:
        decoded = slot_decoded(real_server.url, MODEL)
        seen.extend([] if decoded is None else [decoded])
        return decoded is None

    until(freed, "the slot to be free", 120.0)
    chat.expect_exact(PROMPT)

    log = entries(tmp_path, "tty")
    cancelled, stop = of_kind(log, EntryKind.BROKEN)
    assert content(cancelled).startswith(on_screen.strip()), (on_screen, content(cancelled))
    assert stop.fields.reason is not None
    assert stop.fields.reason.startswith(f"{STOPPED}@")  # what a thread's stop writes
    assert max(seen, default=0) < int(MAX_TOKENS) - 100, seen[-5:]

    # The chat goes on.
    chat.send("Say hello.\r")
    chat.expect_exact(PROMPT)
    assert quit_chat(chat) == 0
    assert len(of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT)) == 1
    turns_before_restart = len(requests(tmp_path, "tty"))

    # Stopped again, now with nothing after it: a new start does not answer it.
    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)
    chat.send(STORY + "\r")
    chat.expect(ANSWER_TEXT % 10)
    chat.sendintr()
    chat.expect_exact("[stopped")
    chat.expect_exact(PROMPT)
    assert quit_chat(chat) == 0
    stopped_requests = requests(tmp_path, "tty")
    assert len(stopped_requests) == turns_before_restart + 1

    # The log export is exactly the messages the stopped request sent (nothing came after it).
    export = run_loopd(["log", "export", "tty", "--format", "openai"], env)
    assert export.returncode == 0, export.stderr
    sent = stopped_requests[-1].record
    assert array_digest(split_array(export.stdout)) == sent.messages_sha256
    assert len(split_array(export.stdout)) == sent.message_count

    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)  # the start is over: a pending turn would have run before this
    assert len(requests(tmp_path, "tty")) == len(stopped_requests)
    assert quit_chat(chat) == 0


def test_keys_typed_during_an_answer_wait_for_the_next_prompt(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    """Not drawn inside the answer (the terminal's echo is off while it streams), shown on the
    next prompt once it has ended, and (ended with Enter) sent as the next message."""
    env = loopd_env(
        real_server.url, tmp_path, max_tokens=MAX_TOKENS, temperature="0", think_cap="0"
    )
    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)
    chat.send(STORY + "\r")
    chat.expect(ANSWER_TEXT % 20)
    answer_starts = len(screen(chat))
    chat.send(TYPED_AHEAD + "\r")
    # Sent while the turn was under way: its answer is not in the log yet.
    assert of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT) == []

    # The story ends, then the typed line is on the prompt, and is answered as the next turn.
    chat.expect_exact(PROMPT)
    written = screen(chat)
    during = written[answer_starts : written.index(PROMPT, answer_starts)]
    chat.expect_exact(TYPED_AHEAD)
    chat.expect_exact(PROMPT)
    assert quit_chat(chat) == 0

    assert TYPED_AHEAD not in plain(during), during
    rows = emulated(screen(chat), lines=1000)  # tall enough to keep every row the chat wrote
    prompt_rows = [row for row in rows if row.startswith(PROMPT)]
    assert f"{PROMPT}{TYPED_AHEAD}" in prompt_rows, rows
    assert [row for row in rows if TYPED_AHEAD in row] == [f"{PROMPT}{TYPED_AHEAD}"], rows
    users = [content(e) for e in of_kind(entries(tmp_path, "tty"), EntryKind.USER)]
    assert users == [STORY, TYPED_AHEAD]
    assert len(of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT)) == 2


def test_arrow_keys_edit_the_line_and_a_paste_is_one_message(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = loopd_env(real_server.url, tmp_path, max_tokens="16", temperature="0", think_cap="0")
    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)
    # "Say helo." then two steps left (before "o."), then the missing "l".
    chat.send("Say helo.\x1b[D\x1b[Dl\r")
    chat.expect_exact(PROMPT)
    # A paste as a terminal sends it: between the bracketed-paste marks, a newline inside.
    chat.send("\x1b[200~Name a colour.\nThen name a fruit.\x1b[201~")
    chat.send("\r")
    chat.expect_exact(PROMPT)
    # Up arrow: the last one-line message from history, sent again.
    chat.send("\x1b[A\x1b[A\r")
    chat.expect_exact(PROMPT)
    assert quit_chat(chat) == 0

    users = [content(e) for e in of_kind(entries(tmp_path, "tty"), EntryKind.USER)]
    assert users == ["Say hello.", "Name a colour.\nThen name a fruit.", "Say hello."]
    kinds = [r.record.kind for r in requests(tmp_path, "tty")]
    assert kinds == [RequestKind.TURN] * 3, "one turn per message, the paste included"
    assert (tmp_path / "chat_history").read_text().splitlines() == ["Say hello.", "Say hello."]
