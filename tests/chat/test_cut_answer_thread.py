"""In a thread, an answer the server cut at ``max_tokens`` ends with the line that says so (the
terminal's words: tests/terminal/test_cut_answer.py); a finished answer has no such line."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.engine.notes import cut_note
from loopd_dev.fakes.llama import FakeLlama, RunningFake, ScriptedReply
from tests.chat.chat_support import daemon, environment, until
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio


async def test_a_cut_answer_ends_with_the_line_that_says_so(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.push(ScriptedReply(content="word " * 400), model=FAKE_MODEL)
    fake_llama.push(ScriptedReply(content="Done."), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama, max_tokens=24) as env, daemon(env):
        cut = env.fake.post_as("alice", env.dm(), "write a lot")
        await until(lambda: len(env.answers(cut.id)) == 1, "the cut answer")
        [answer] = env.answers(cut.id)
        assert answer.message.startswith("word word")
        assert answer.message.endswith(f"\n\n_{cut_note(24)}_")
        done = env.fake.post_as("alice", env.dm(), "say done")
        await until(lambda: len(env.answers(done.id)) == 1, "the finished answer")
        assert env.answers(done.id)[0].message == "Done."
