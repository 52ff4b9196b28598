"""Catch-up after a long disconnect: more than the 1,000 rows ``since`` returns, across threads.

Paging past the cap (``after=<post id>``) answers with whole threads in ``posts``; anchoring the
next page on the newest of those skipped every post in between (101 of 1,302 when measured).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.chat.rest import MattermostClient, api_client
from loopd.chat.threads import session_name
from loopd.sessionlog import EntryKind, SessionLog
from loopd_dev.fakes.llama import RunningFake
from loopd_dev.fakes.mattermost import FakeMattermost, LoggedPost
from tests.chat.chat_support import (
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio

MISSED = 1300


def flood(fake: FakeMattermost, threads: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``MISSED`` posts in ``dev`` while loopd is away: a humans' thread with a reply every tenth
    post (the last one too), replies in loopd's ``threads`` (the last thread's only near the
    end), two new mentions near the end, and chatter. Returns every post id, and per loopd
    thread the texts of its replies."""
    chat = fake.post_as("bob", "dev", "lunch plans?")
    ids = [chat.id]
    replies: dict[str, list[str]] = {root: [] for root in threads}
    first, *others, last = threads
    for i in range(MISSED - 1):
        if i in (MISSED - 149, MISSED - 49):
            post = fake.post_as("bob", "dev", f"@loopd new question {i}")
        elif i % 10 == 0 or i == MISSED - 2:
            post = fake.post_as("alice", "dev", f"chat {i}", root_id=chat.id)
        elif i >= MISSED - 300 and i % 7 == 0:
            root = [first, *others][i % (1 + len(others))]
            post = fake.post_as("alice", "dev", f"reply {i}", root_id=root)
            replies[root].append(f"reply {i}")
        elif i >= MISSED - 95 and i % 11 == 0:
            post = fake.post_as("alice", "dev", f"reply {i}", root_id=last)
            replies[last].append(f"reply {i}")
        else:
            post = fake.post_as("bob", "dev", f"noise {i}")
        ids.append(post.id)
    return ids, replies


async def test_posts_since_pages_past_the_cap_without_skipping(tmp_path: Path) -> None:
    async with fake_mattermost(None) as mm:
        fake = mm.fake
        threads = [fake.post_as("alice", "dev", f"@loopd thread {n}").id for n in range(3)]
        since = max(p.update_at for p in fake.world.posts.values())
        ids, _ = flood(fake, threads)
        client = MattermostClient(api_client(mm.base_url, fake.config.bot_token), retry_for_s=5)
        try:
            got = await client.posts_since(fake.channel("dev").id, since)
        finally:
            await client.aclose()
        assert not set(ids) - {p.id for p in got}
        assert [p.update_at for p in got] == sorted(p.update_at for p in got)


def user_texts(env: Env, root_id: str) -> list[str]:
    with SessionLog.open(env.settings.db_path) as log:
        if session_name(root_id) not in {s.name for s in log.sessions()}:
            return []
        return [
            str(e.message) for e in log.entries(session_name(root_id)) if e.kind is EntryKind.USER
        ]


async def test_a_daemon_away_while_1300_posts_come_takes_in_every_one(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with fake_mattermost(sockets) as mm:
        env = Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL, max_tokens=64),
            chat_settings_for(mm, tmp_path, max_waiting_per_thread=500),
        )
        async with daemon(env):
            threads = [env.fake.post_as("alice", "dev", f"@loopd thread {n}").id for n in range(3)]
            await until(lambda: all(env.answers(t) for t in threads), "the first answers")
        _, replies = flood(env.fake, threads)
        assert sum(map(len, replies.values())) >= 30
        async with daemon(env):  # it has caught up once this is entered
            for root, texts in replies.items():
                stored = "".join(user_texts(env, root))
                assert [t for t in texts if f"@alice: {t}" not in stored] == []

            def mentions() -> list[LoggedPost]:
                return [
                    p
                    for p in env.fake.log.created(root_id="")
                    if p.message.startswith("@loopd new question")
                ]

            await until(
                lambda: all(env.answers(p.post_id) for p in mentions()), "the late mentions"
            )
