"""In a Mattermost thread (the fake), a tool call brokerd holds for approval posts its whole
arguments and a question naming the tool and what it does; the reaction of the person who
started the turn allows or denies it, anyone else's is ignored, and with no answer in time it is
denied. The status post says whose approval the turn waits for, and the question post is edited
with the decision. The tool result the model reads says who decided; the session log and
brokerd's audit log keep the decision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from loopd.chat.threads import session_name
from loopd.serve import Daemon
from loopd_dev.fakes.llama import FakeLlama, RunningFake
from loopd_dev.fakes.mattermost import FakeConfig, LoggedPost
from tests.approvals.support import (
    asking_broker,
    audit_approvals,
    notes,
    script_a_call,
    tool_results,
)
from tests.chat.chat_support import (
    FAST_MM,
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio
HEAD = (
    "🔐 `echo_text` wants to run with the arguments above. It says: `Echo a text back (for tests).`"
)


@asynccontextmanager
async def thread_env(
    tmp_path: Path,
    sockets: Path,
    llama: RunningFake,
    timeout_s: float = 60.0,
    *,
    mattermost_on_tcp: bool = False,  # for a client that speaks TCP only (Node's)
    mm_config: FakeConfig = FAST_MM,
    max_tokens: int = 256,
    asks: tuple[str, ...] = (),  # core tools set to ask ([approval])
) -> AsyncIterator[Env]:
    mm_sockets = None if mattermost_on_tcp else sockets
    async with (
        asking_broker(tmp_path, sockets) as broker_url,
        fake_mattermost(mm_sockets, mm_config) as mm,
    ):
        settings = settings_for(
            tmp_path / "state",
            llama.base_url,
            FAKE_MODEL,
            max_tokens=max_tokens,
            broker_url=broker_url,
            approval={"timeout_s": timeout_s, **dict.fromkeys(asks, "ask")},
        )
        yield Env(mm, settings, chat_settings_for(mm, tmp_path))


def question(env: Env, root_id: str) -> LoggedPost | None:
    return next((p for p in env.live_bot_posts(root_id) if p.message.startswith("🔐")), None)


async def asked(env: Env, running: Daemon, root_id: str) -> LoggedPost:
    """The question's post, once loopd waits for a reaction on it."""
    await until(lambda: question(env, root_id) is not None, "the approval question")
    found = question(env, root_id)
    assert found is not None
    questions = running.adapter.threads.questions
    await until(lambda: questions.is_open(found.post_id), "the question open")
    return found


async def test_the_starter_allows_the_call(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_call(fake_llama, FAKE_MODEL, "hi there")
    async with thread_env(tmp_path, sockets, llama) as env, daemon(env) as running:
        root = env.fake.post_as("alice", env.dm(), "echo hi there, please")
        line = await asked(env, running, root.id)
        posts = [p.message for p in env.live_bot_posts(root.id)]
        arguments = '```json\n{\n  "text": "hi there"\n}\n```'
        assert posts[posts.index(line.message) - 1] == arguments  # whole, just above
        assert line.message == (
            f"{HEAD}\n@alice or an admin: react :white_check_mark: to allow or :x: to deny "
            "(within 60 seconds, then it is denied)."
        )
        await until(
            lambda: "⏳ waiting for @alice's approval" in env.status_history(root.id)[-1],
            "the status post to say whose approval the turn waits for",
        )
        env.fake.react_as("alice", line.post_id, "white_check_mark")
        await until(lambda: len(env.answers(root.id)) == 1, "the answer")
        assert env.answers(root.id)[0].message == "Done."
        assert env.edits_of(line.post_id)[-1] == f"{HEAD}\n✅ allowed by @alice"
    name = session_name(root.id)
    assert tool_results(env.settings.db_path, name)[-1] == "Allowed by @alice.\necho: hi there"
    logged = notes(env.settings.db_path, name)
    assert any(n.startswith("approval asked: ") for n in logged)
    assert any('"verdict": "allow", "by": "@alice"' in n for n in logged)
    assert audit_approvals(tmp_path) == [("echo_text", "allow", "@alice")]


async def test_a_deny_runs_nothing_and_says_who_denied_it(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with thread_env(tmp_path, sockets, llama) as env, daemon(env) as running:
        root = env.fake.post_as("alice", env.dm(), "echo hi")
        line = await asked(env, running, root.id)
        env.fake.react_as("alice", line.post_id, "thumbsup")  # not an answer: ignored
        env.fake.react_as("alice", line.post_id, "x")
        await until(lambda: len(env.answers(root.id)) == 1, "the answer")
        assert env.edits_of(line.post_id)[-1] == f"{HEAD}\n❌ denied by @alice"
    result = tool_results(env.settings.db_path, session_name(root.id))[-1]
    assert result.startswith("echo_text was not run: @alice denied this call.")
    assert audit_approvals(tmp_path) == [("echo_text", "deny", "@alice")]


async def test_no_answer_in_time_denies_the_call(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with thread_env(tmp_path, sockets, llama, timeout_s=1.0) as env, daemon(env) as running:
        root = env.fake.post_as("alice", env.dm(), "echo hi")
        line = await asked(env, running, root.id)
        assert "(within 1 second, then it is denied)" in line.message
        await until(lambda: len(env.answers(root.id)) == 1, "the answer")
        assert env.edits_of(line.post_id)[-1] == f"{HEAD}\n⌛ nobody decided in time"
    result = tool_results(env.settings.db_path, session_name(root.id))[-1]
    assert "nobody allowed it in time (no answer within 1 second)" in result
    assert audit_approvals(tmp_path) == [("echo_text", "timeout", "no answer within 1 second")]


async def test_the_question_survives_a_restart_of_loopd(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with thread_env(tmp_path, sockets, llama) as env:
        root = await allowed_after_a_restart(env, "echo hi")
    result = tool_results(env.settings.db_path, session_name(root))[-1]
    assert result == "Allowed by @alice.\necho: hi"


async def allowed_after_a_restart(env: Env, text: str) -> str:
    """alice's ``text`` makes a call that asks; loopd is killed with the question open, asks on
    once started again (in the same post, from the question as first noted), and she allows
    it. The thread's root id."""
    async with daemon(env) as running:
        root = env.fake.post_as("alice", env.dm(), text)
        line = await asked(env, running, root.id)
    # loopd is gone (killed) with the question open; brokerd is still up.
    async with daemon(env) as again:
        questions = again.adapter.threads.questions
        await until(lambda: questions.is_open(line.post_id), "the question asked again")
        env.fake.react_as("alice", line.post_id, "white_check_mark")
        await until(lambda: len(env.answers(root.id)) == 1, "the answer after the restart")
    posted = [p for p in env.live_bot_posts(root.id) if p.message.startswith("🔐")]
    assert [p.post_id for p in posted] == [line.post_id]  # asked once, in one post
    asked_notes = [n for n in notes(env.settings.db_path, session_name(root.id)) if "asked" in n]
    assert len(asked_notes) == 1  # the restart asked on from the first question
    return root.id


async def test_a_reaction_given_while_loopd_was_away_counts(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    script_a_call(fake_llama, FAKE_MODEL)
    async with thread_env(tmp_path, sockets, llama) as env:
        async with daemon(env) as running:
            root = env.fake.post_as("alice", env.dm(), "echo hi")
            line = await asked(env, running, root.id)
        env.fake.react_as("alice", line.post_id, "x")  # loopd is down
        async with daemon(env):
            await until(lambda: len(env.answers(root.id)) == 1, "the answer after the restart")
    result = tool_results(env.settings.db_path, session_name(root.id))[-1]
    assert result.startswith("echo_text was not run: @alice denied this call.")
