"""The first hour in a thread: a repeat reaction generates the latest answer again (or runs a failed
turn again), a message longer than the context is kept whole and said so, and a pending turn of a
thread Mattermost no longer has fails in one log line, not a traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from loopd.chat.threads import RETRY_WORDS, RetryResult, session_name
from loopd.sessionlog import EntryKind, SessionLog
from loopd.sessionlog.verify import verify
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, RunningFake, ScriptedReply, Trigger
from tests.chat.chat_support import (
    Env,
    daemon,
    environment,
    until,
)
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio

RETRY = "repeat"


@pytest.fixture
def fake_llama() -> FakeLlama:
    # A context of 4,096 tokens: a post of a few thousand words is more than one message may be.
    return FakeLlama([ModelSpec(FAKE_MODEL, n_slots=2, n_ctx=4096)])


def replayed_contents(env: Env, root: str) -> list[str]:
    with SessionLog.open(env.settings.db_path) as log:
        assert verify(log) == []
        return [json.loads(m).get("content") or "" for m in log.replay_messages(session_name(root))]


def streaming(fake: FakeLlama) -> bool:
    return any(r.path == "/v1/chat/completions" and r.status == 200 for r in fake.log)


def turn_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "loopd.chat.threads" and r.getMessage().startswith("the turn of")
    ]


def said(env: Env, root: str, words: str) -> bool:
    return any(words in p.message for p in env.live_bot_posts(root))


async def test_a_retry_reaction_generates_the_latest_answer_again(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.push(ScriptedReply(content="First answer."), model=FAKE_MODEL)
    fake_llama.push(ScriptedReply(content="Second answer."), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama, max_tokens=256) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "a question")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        await until(lambda: env.status_posts_left(post.id) == [], "the turn to end")
        [first] = env.answers(post.id)
        env.fake.react_as("alice", first.post_id, RETRY)
        await until(lambda: len(env.answers(post.id)) == 2, "the answer generated again")
        assert [a.message for a in env.answers(post.id)] == ["First answer.", "Second answer."]
        await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
    contents = replayed_contents(env, post.id)
    assert "First answer." not in contents  # in the log, not in the replay
    assert contents[-1] == "Second answer."
    with SessionLog.open(env.settings.db_path) as log:
        answers = [e for e in log.entries(session_name(post.id)) if e.kind is EntryKind.ASSISTANT]
        requests = log.requests(session_name(post.id))
    assert len(answers) == 2
    # The same prefix again, which the server holds: only the answer is paid for.
    again = requests[-1].record.perf
    assert again.cache_loss in (0, None), again
    assert (again.prompt_n or 0) <= 2, again


async def test_a_retry_reaction_on_an_older_answer_says_one_line(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama, max_tokens=256) as env, daemon(env):
        post = env.fake.post_as("alice", "dev", "@loopd first question")
        await until(lambda: len(env.answers(post.id)) == 1, "the first answer")
        env.fake.post_as("alice", "dev", "@loopd second question", root_id=post.id)
        await until(lambda: len(env.answers(post.id)) == 2, "the second answer")
        await until(lambda: env.status_posts_left(post.id) == [], "the turn to end")
        older, latest = env.answers(post.id)
        env.fake.react_as("alice", older.post_id, RETRY)
        await until(lambda: said(env, post.id, RETRY_WORDS[RetryResult.NOT_LATEST]), "why not")
        env.fake.react_as("bob", latest.post_id, RETRY)  # not bob's question
        await until(lambda: said(env, post.id, RETRY_WORDS[RetryResult.NOT_ALLOWED]), "who may")
        assert len(env.answers(post.id)) == 2


async def test_a_retry_reaction_runs_a_failed_turn_again(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.faults.set(error_mid_stream=Trigger(after=3))
    fake_llama.push(
        ScriptedReply(content="This answer breaks off in the middle."), model=FAKE_MODEL
    )
    async with environment(tmp_path, sockets, llama, max_tokens=256) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "a question")
        await until(lambda: said(env, post.id, "⚠️ I could not answer"), "the failure")
        await until(lambda: env.status_posts_left(post.id) == [], "the turn to end")
        failed = next(p for p in env.live_bot_posts(post.id) if "could not answer" in p.message)
        fake_llama.faults.set(error_mid_stream=None)
        env.fake.react_as("alice", failed.post_id, RETRY)
        await until(lambda: len(env.answers(post.id)) == 1, "the answer after all")
        assert env.answers(post.id)[0].message == "You said: @alice: a question"


async def test_a_message_longer_than_the_context_is_kept_whole_and_said(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    long_text = " ".join(f"word{n}" for n in range(1600))  # within Mattermost's 16,383
    async with environment(tmp_path, sockets, llama, max_tokens=256) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), long_text)
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        await until(lambda: said(env, post.id, "✂️ Your message was"), "the notice")
    [notice] = [p.message for p in env.live_bot_posts(post.id) if "✂️" in p.message]
    kept = f"messages/{post.id}.txt"
    assert notice.endswith(f"the whole message is kept in its workspace as {kept}, to read.")
    [found] = env.settings.workspaces.glob(f"*/{kept}")  # the thread's workspace
    assert found.read_text() == f"@alice: {long_text}"


async def test_a_pending_turn_of_a_thread_mattermost_lost_fails_in_one_line(
    tmp_path: Path,
    sockets: Path,
    fake_llama: FakeLlama,
    llama: RunningFake,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_llama.pace = Pace(tokens_per_second=20)
    fake_llama.push(ScriptedReply(content="slow " * 200), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama, max_tokens=256) as env:
        async with daemon(env):
            post = env.fake.post_as("alice", env.dm(), "a question")
            await until(lambda: streaming(fake_llama), "the turn's stream")
        # loopd stopped mid-turn (the turn is pending), and the thread is gone when it starts
        # again (as after make demo started again with a new fake world).
        env.fake.delete_as("alice", post.id)
        fake_llama.pace = Pace()
        with caplog.at_level(logging.INFO, logger="loopd.chat.threads"):
            async with daemon(env):
                await until(lambda: turn_failures(caplog) != [], "the turn's failure")
    [failure] = turn_failures(caplog)
    assert failure.exc_info is None, "a traceback"
    assert "\n" not in failure.getMessage()
    assert session_name(post.id) in failure.getMessage()
