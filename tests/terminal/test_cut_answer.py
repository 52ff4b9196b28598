"""An answer the server cut at ``max_tokens`` says so where the answer is, in the same words in
the terminal and in a thread (tests/chat/test_cut_answer_thread.py): a cut answer never reads as a
finished one."""

from __future__ import annotations

import json
from pathlib import Path

from loopd.engine.notes import cut_note
from loopd.terminal.oneshot import EXIT_ANSWERED
from loopd_dev.fakes.llama import ScriptedReply
from tests.terminal.support import (
    ANSWER_TEXT,
    PROMPT,
    fake_env,
    fake_llama,
    quit_chat,
    spawn_chat,
)
from tests.test_cli import run_loopd

LONG = "word " * 400  # far more than the 24 tokens a reply may have here
LIMIT = "24"


def test_a_cut_answer_says_so_beside_stdout_and_in_json(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content=LONG), ScriptedReply(content="Done."))
        env = {**fake_env(server, tmp_path), "LOOPD_MAX_TOKENS": LIMIT}
        cut = run_loopd(["run", "Write a lot.", "--session", "s"], env)
        whole = run_loopd(["run", "Say done.", "--session", "s", "--json"], env)
    assert cut.returncode == EXIT_ANSWERED, cut.stderr
    assert cut.stdout.startswith("word word")  # stdout stays the answer alone: data
    assert "cut" not in cut.stdout
    said = [line for line in cut.stderr.splitlines() if not line.startswith("{")]  # not logs
    assert said == [f"[loopd] {cut_note(int(LIMIT))}"]
    record = json.loads(whole.stdout)
    assert record["answer"] == "Done."
    assert record["cut_at_tokens"] is None  # a finished answer is not called cut


def test_a_cut_answer_says_so_after_it_in_the_chat(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content=LONG))
        chat = spawn_chat({**fake_env(server, tmp_path), "LOOPD_MAX_TOKENS": LIMIT})
        chat.expect_exact(PROMPT)
        chat.send("Write a lot.\r")
        chat.expect(ANSWER_TEXT % 20)
        chat.expect_exact(cut_note(int(LIMIT)))
        chat.expect_exact(PROMPT)
        assert quit_chat(chat) == 0
