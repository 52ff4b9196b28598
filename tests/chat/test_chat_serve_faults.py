"""``loopd serve`` as a separate process against the fake Mattermost and the fake llama-server:
a status post that cannot be edited (403, 5xx past the retry window, deleted by a moderator)
costs at most that post. The daemon keeps answering, this thread and others, also after a
SIGKILL and a restart in the middle of the turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from loopd_dev.fakes.llama import FakeLlama, Pace, RunningFake, ScriptedReply
from tests.chat.chat_support import Env, chat_settings_for, fake_mattermost, settings_for
from tests.chat.conftest import FAKE_MODEL
from tests.chat.serve_process import loopd_serve, verify_session_log

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

WAIT_S = 60.0
FIRST = "first run " * 60
SECOND = "second run " * 20


@asynccontextmanager
async def environment(
    tmp_path: Path, sockets: Path, llama: RunningFake, **chat: Any
) -> AsyncIterator[Env]:
    async with fake_mattermost(sockets) as mm:
        yield Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL, max_tokens=2048),
            chat_settings_for(mm, tmp_path, **chat),
        )


def generating(fake_llama: FakeLlama) -> bool:
    return any(s.is_processing for s in fake_llama.model(FAKE_MODEL).slots.slots)


def status_post_ids(env: Env, root_id: str) -> list[str]:
    return [p.post_id for p in env.bot_posts(root_id) if str(p.props).find(":status") > 0]


@pytest.mark.parametrize("refusal", [403, 503])
async def test_refused_status_edits_through_a_kill_and_restart(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake, refusal: int
) -> None:
    # 403: a permission scheme without edit_post. 503: an outage of edits only, longer than the
    # retry window. Either used to end the daemon, and again after every restart.
    fake_llama.pace = Pace(tokens_per_second=40)
    fake_llama.push(ScriptedReply(content=FIRST), ScriptedReply(content=SECOND), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama, retry_for_s=0.3) as env:
        env.fake.refuse_patches(refusal)
        async with loopd_serve(env, tmp_path, "first") as first:
            post = env.fake.post_as("alice", env.dm(), "answer me anyway")
            await first.until(lambda: generating(fake_llama), "the turn to generate", WAIT_S)
            await first.kill()
        assert env.answers(post.id) == []
        async with loopd_serve(env, tmp_path, "second") as second:
            await second.until(lambda: len(env.answers(post.id)) == 1, "the answer", WAIT_S)
            assert env.answers(post.id)[0].message == SECOND
            other = env.fake.post_as("bob", "dev", "@loopd and another thread?")
            await second.until(lambda: len(env.answers(other.id)) == 1, "another", WAIT_S)
            await second.until(
                lambda: env.status_posts_left(post.id) == env.status_posts_left(other.id) == [],
                "the status posts to go (deleting still works)",
                WAIT_S,
            )
            assert not second.exited
            assert any("could not be edited" in m for m in second.log_messages())
        assert verify_session_log(env.settings) == []


async def test_a_status_post_deleted_mid_turn_through_a_kill_and_restart(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=40)
    fake_llama.push(ScriptedReply(content=FIRST), ScriptedReply(content=SECOND), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env:
        async with loopd_serve(env, tmp_path, "first") as first:
            post = env.fake.post_as("alice", env.dm(), "go on without your status")
            await first.until(lambda: generating(fake_llama), "the turn to generate", WAIT_S)
            [status] = status_post_ids(env, post.id)
            # A moderator deletes it; real Mattermost answers every later edit with 403.
            env.fake.delete_post(env.fake.bot, status)
            await first.until(
                lambda: any("could not be edited" in m for m in first.log_messages()),
                "the failed edit",
                WAIT_S,
            )
            assert generating(fake_llama)  # the turn went on
            await first.kill()
        async with loopd_serve(env, tmp_path, "second") as second:
            await second.until(lambda: len(env.answers(post.id)) == 1, "the answer", WAIT_S)
            assert env.answers(post.id)[0].message == SECOND
            later = env.fake.post_as("alice", env.dm(), "and after that?", root_id=post.id)
            await second.until(lambda: len(env.answers(post.id)) == 2, "the next", WAIT_S)
            assert env.answers(post.id)[1].message == f"You said: @alice: {later.message}"
            await second.until(
                lambda: env.status_posts_left(post.id) == [], "no status post left", WAIT_S
            )
            assert not second.exited
        assert verify_session_log(env.settings) == []
