"""Acceptance: ``loopd serve`` killed with SIGKILL and started again, as a separate process,
against the fake Mattermost (in this process) and the REAL llama-server.

A SIGKILL runs no cleanup: no "interrupted" status edit, no record of the cut turn. Only what the
daemon had committed (session log, chat state, posts) is there for the next start to go on from.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loopd.chat.outbox import PART_PROP, TURN_PROP
from loopd.chat.split import split_message
from loopd.chat.threads import session_name
from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd_dev import devserver
from loopd_dev.fakes.mattermost import FakeConfig, LoggedPost
from tests.chat.chat_support import FAST_MM, Env, chat_settings_for, fake_mattermost, settings_for
from tests.chat.serve_process import loopd_serve, verify_session_log

pytestmark = [pytest.mark.real_server, pytest.mark.anyio, pytest.mark.timeout(900)]

MODEL_S = 600.0  # a bound on one 200-token answer of the real model on a slow, loaded machine
PROMPT = "Write a long poem about rivers."
POST_LIMIT = 120  # a ~200-token answer splits into several posts (three or more)


@asynccontextmanager
async def environment(
    tmp_path: Path,
    sockets: Path,
    server: devserver.RunningServer,
    config: FakeConfig = FAST_MM,
    **settings: Any,
) -> AsyncIterator[Env]:
    async with fake_mattermost(sockets, config) as mm:
        try:
            yield Env(
                mm,
                settings_for(tmp_path / "state", server.url, devserver.PLAIN_MODEL, **settings),
                chat_settings_for(mm, tmp_path),
            )
        finally:
            # Shown by pytest only when the test fails: what happened to which post, in order.
            print("----- the fake's post log -----")
            for e in mm.fake.log.entries:
                print(e.action, e.post_id, e.props.get(TURN_PROP, ""), repr(e.message[:60]))


def answering(env: Env, root_id: str) -> bool:
    return any(text.startswith("✍️") for text in env.status_history(root_id))


def draft_made(env: Env, root_id: str) -> bool:
    """The answer post, written as the answer streams, was created."""
    return any(str(p.props.get(TURN_PROP, "")).endswith(":draft") for p in env.bot_posts(root_id))


def status_posts(env: Env, root_id: str) -> list[LoggedPost]:
    return [
        p for p in env.bot_posts(root_id) if str(p.props.get(TURN_PROP, "")).endswith(":status")
    ]


def last_text(env: Env, post_id: str) -> str:
    return [e.message for e in env.fake.log.entries if e.post_id == post_id][-1]


def logged_answer(env: Env, root_id: str, key: str) -> str:
    """The answer delivered under ``key`` (``<session>#<seq>``), as the session log holds it."""
    seq = int(key.rpartition("#")[2])
    with SessionLog.open(env.settings.db_path, create=False) as log:
        [entry] = [e for e in log.entries(session_name(root_id)) if e.seq == seq]
    assert entry.kind is EntryKind.ASSISTANT
    assert entry.message is not None
    content = json.loads(entry.message).get("content")
    assert isinstance(content, str)
    assert content, "the model gave an empty answer"
    return content


async def test_sigkill_mid_turn_then_restart_answers_once(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    async with environment(tmp_path, sockets, real_server, max_tokens=200) as env:
        async with loopd_serve(env, tmp_path, "first") as first:
            post = env.fake.post_as("alice", env.dm(), PROMPT)
            await first.until(lambda: answering(env, post.id), "answering", MODEL_S)
            await first.kill()
        assert env.answers(post.id) == []
        opened = status_posts(env, post.id)
        assert len(opened) == 1, opened
        status = opened[0]
        assert last_text(env, status.post_id).startswith("✍️")  # nobody could edit it since

        async with loopd_serve(env, tmp_path, "second") as second:
            await second.until(lambda: len(env.answers(post.id)) >= 1, "the answer", MODEL_S)
            await second.until(
                lambda: env.status_posts_left(post.id) == [], "the status post to go", 20
            )
            # The resumed turn carried on in the status post the killed daemon had opened.
            assert [s.post_id for s in status_posts(env, post.id)] == [status.post_id]
            # A positive sign that the restarted daemon is past everything the first turn could
            # still cause: it answered a later message in the same thread, which its one worker
            # per session runs only after that turn (and its catch-up) is over.
            follow_up = env.fake.post_as("alice", env.dm(), "Thanks. Say goodbye.", root_id=post.id)
            await second.until(lambda: len(env.answers(post.id)) >= 2, "the follow-up", MODEL_S)
            await second.until(
                lambda: env.status_posts_left(post.id) == [], "its status post to go", 20
            )
            resumed = f"resuming the pending turn of {session_name(post.id)}"
            assert resumed in second.log_messages()

        created = [e.post_id for e in env.fake.log.entries if e.action == "created"]
        before = created[: created.index(follow_up.id)]
        answers = env.answers(post.id)
        assert [a.post_id in before for a in answers] == [True, False]  # one per turn
        assert len({a.props[TURN_PROP] for a in answers}) == 2
        assert len(status_posts(env, post.id)) == 2  # one per turn
        assert env.status_posts_left(post.id) == []  # each removed when its turn ended
        assert verify_session_log(env.settings) == []


async def test_sigkill_while_a_reply_is_half_posted(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    # No dedup window: the restarted daemon must find part 0 in the thread, as it would after
    # more than 30 s; the server's pending_post_id cache must not be what saves it.
    config = replace(FAST_MM, max_post_size=POST_LIMIT, dedup_ttl_s=0.0)
    async with environment(tmp_path, sockets, real_server, config, max_tokens=200) as env:
        async with loopd_serve(env, tmp_path, "first") as first:
            post = env.fake.post_as("alice", env.dm(), PROMPT)
            await first.until(lambda: draft_made(env, post.id), "the answer post", MODEL_S)
            # The status post and the answer post exist; when the answer is complete, part 0
            # goes into the answer post, and the next create is part 1.
            env.fake.hang_next_creates(1)
            await first.until(lambda: env.answers(post.id) != [], "part 0", MODEL_S)
            await first.until(
                lambda: env.fake.faults.hanging_creates == 0, "part 1's create", MODEL_S
            )
            await first.kill()
        env.fake.hang_next_creates(0)
        answers = env.answers(post.id)
        assert len(answers) == 2, "part 1 was not posted (hung), or more parts followed"
        part0, part1 = answers
        assert (part0.props[PART_PROP], part1.props[PART_PROP]) == (0, 1)
        key = str(part0.props[TURN_PROP])
        expected = split_message(logged_answer(env, post.id, key), POST_LIMIT)
        assert len(expected) >= 3, expected
        assert [part0.message, part1.message] == expected[:2]

        async with loopd_serve(env, tmp_path, "second") as second:
            # Ready means resume_all has run, and it delivers before the socket connects.
            await second.until(
                lambda: len(env.answers(post.id)) >= len(expected), "the other parts", 20
            )

        parts = env.answers(post.id)
        assert {str(p.props[TURN_PROP]) for p in parts} == {key}
        assert sorted(int(p.props[PART_PROP]) for p in parts) == list(range(len(expected)))
        assert [p.message for p in sorted(parts, key=lambda p: int(p.props[PART_PROP]))] == (
            expected
        )
        # Part 1 was not posted again because the thread showed it (the fake's dedup is off).
        assert f"found 1 part(s) of reply {key} already posted" in second.log_messages()
        assert len(status_posts(env, post.id)) == 1
        assert env.status_posts_left(post.id) == []
        assert verify_session_log(env.settings) == []
