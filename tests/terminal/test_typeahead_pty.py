"""Keys typed in ``loopd chat`` while an answer streams, in a real pseudo-terminal against the
real llama-server: not drawn inside the answer, shown on the next prompt once it has ended, and
(ended with Enter) sent as the next message."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind
from loopd_dev import devserver
from tests.terminal.support import (
    ANSWER_TEXT,
    PROMPT,
    content,
    emulated,
    entries,
    loopd_env,
    of_kind,
    plain,
    quit_chat,
    screen,
    spawn_chat,
)

pytestmark = pytest.mark.real_server

STORY = "Write a very long story about a dragon and a knight, with many chapters."
TYPED = "Now list three rivers."
# The story's bound: long enough to be under way when the keys come (they are sent once its first
# 20 characters are on screen), short enough that a loaded machine ends it soon.
MAX_TOKENS = "300"


def test_keys_typed_during_an_answer_wait_for_the_next_prompt(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = loopd_env(
        real_server.url, tmp_path, max_tokens=MAX_TOKENS, temperature="0", think_cap="0"
    )
    chat = spawn_chat(env)
    chat.expect_exact(PROMPT)
    chat.send(STORY + "\r")
    chat.expect(ANSWER_TEXT % 20)
    answer_starts = len(screen(chat))
    chat.send(TYPED + "\r")
    # Sent while the turn was under way: its answer is not in the log yet.
    assert of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT) == []

    # The story ends, then the typed line is on the prompt, and is answered as the next turn.
    chat.expect_exact(PROMPT)
    written = screen(chat)
    during = written[answer_starts : written.index(PROMPT, answer_starts)]
    chat.expect_exact(TYPED)
    chat.expect_exact(PROMPT)
    assert quit_chat(chat) == 0

    assert TYPED not in plain(during), during
    rows = emulated(screen(chat), lines=1000)  # tall enough to keep every row the chat wrote
    prompt_rows = [row for row in rows if row.startswith(PROMPT)]
    assert f"{PROMPT}{TYPED}" in prompt_rows, rows
    assert [row for row in rows if TYPED in row] == [f"{PROMPT}{TYPED}"], rows
    users = [content(e) for e in of_kind(entries(tmp_path, "tty"), EntryKind.USER)]
    assert users == [STORY, TYPED]
    assert len(of_kind(entries(tmp_path, "tty"), EntryKind.ASSISTANT)) == 2
