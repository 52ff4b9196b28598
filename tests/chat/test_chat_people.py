"""Many people in threads: context when mentioned partway, group messages, whose turn a stop
may end, caps on waiting, messages that come while a turn runs, and the thread policy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from loopd.chat.threads import session_name
from loopd.sessionlog import EntryKind, SessionLog
from loopd_dev.fakes.llama import FakeLlama, Pace, RunningFake, ScriptedReply
from loopd_dev.fakes.mattermost import LoggedPost
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

SLOW = Pace(tokens_per_second=25)


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


def first_request_messages(fake_llama: FakeLlama) -> list[dict[str, Any]]:
    body = fake_llama.chat_records()[0].body
    assert isinstance(body, dict)
    messages = body["messages"]
    assert isinstance(messages, list)
    return messages


def log_kinds(env: Env, root_id: str) -> list[tuple[str, str]]:
    """(kind, content) of the thread's replayed user and assistant entries, in log order."""
    with SessionLog.open(env.settings.db_path) as log:
        entries = log.entries(session_name(root_id))
    return [
        (e.kind.value, str(json.loads(e.message or "{}").get("content")))
        for e in entries
        if e.kind in (EntryKind.USER, EntryKind.ASSISTANT)
    ]


def notices(env: Env, root_id: str, start: str) -> list[LoggedPost]:
    return [p for p in env.bot_posts(root_id) if p.message.startswith(start)]


async def test_mentioned_partway_the_first_request_holds_the_thread_so_far(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env:
        async with daemon(env):
            root = env.fake.post_as("bob", "dev", "Release plan for Friday?")
            env.fake.post_as("alice", "dev", "We still need the changelog.", root_id=root.id)
            env.fake.post_as("bob", "dev", "And the docs.", root_id=root.id)
            mention = env.fake.post_as("alice", "dev", "@loopd what is left?", root_id=root.id)
            await until(lambda: len(env.answers(root.id)) == 1, "the answer")
        users = [m["content"] for m in first_request_messages(fake_llama) if m["role"] == "user"]
        assert users == [
            "@bob: Release plan for Friday?",
            "@alice: We still need the changelog.",
            "@bob: And the docs.",
            "@alice: @loopd what is left?",
        ]
        # Read once: the same posts coming again (a restart's catch-up) are not stored twice.
        async with daemon(env) as again:
            await again.adapter.catch_up()
        assert [k for k, _ in log_kinds(env, root.id)] == ["user"] * 4 + ["assistant"]
        assert env.answers(root.id)[0].root_id == mention.root_id


async def test_a_group_message_is_answered_when_everyone_in_it_is_allowed(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        env.fake.add_user("carol", teams=["loopd-team"])
        friends = env.fake.add_group(["alice", "bob", "loopd"]).id
        mixed = env.fake.add_group(["alice", "carol", "loopd"]).id
        asked = env.fake.post_as("alice", friends, "@loopd what time is it?")
        refused = env.fake.post_as("alice", mixed, "@loopd what time is it?")
        await until(lambda: len(env.answers(asked.id)) == 1, "the group's answer")
        await until(lambda: len(env.bot_posts(refused.id)) == 1, "the one line why not")
        assert env.bot_posts(refused.id)[0].message == (
            # carol is not in the thread: her name is no mention (loopd.chat.mentions).
            "🚫 In a group message I answer only when everyone in it may use me, and "
            "\uff20carol is not enabled. Ask the admin to add them, or message me directly."
        )
        assert env.answers(refused.id) == []


async def test_only_the_asker_or_an_admin_stops_a_turn(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = SLOW
    fake_llama.push(ScriptedReply(content="long " * 150), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        root = env.fake.post_as("alice", "dev", "@loopd write at length")
        await until(lambda: "answering" in "".join(env.status_history(root.id)), "answering")
        env.fake.post_as("bob", "dev", "STOP!", root_id=root.id)
        aside = env.fake.post_as("alice", "dev", "@bob stop", root_id=root.id)
        await until(lambda: bool(notices(env, root.id, "⏹️ Only")), "the refusal")
        assert [p.message for p in notices(env, root.id, "⏹️ Only")] == [
            "⏹️ Only @alice (or an admin) can stop this turn."
        ]
        await until(lambda: len(env.answers(root.id)) == 1, "alice's answer, not stopped")
        assert env.answers(root.id)[0].message == "long " * 150
        # "@bob stop" was a message to bob: it waited for the next turn, and got an answer.
        await until(lambda: len(env.answers(root.id)) == 2, "the answer to the aside")
        assert ("user", "@alice: @bob stop") in log_kinds(env, root.id)
        assert aside.id not in {p.post_id for p in notices(env, root.id, "⏹️")}


async def test_an_admin_may_stop_anyones_turn(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = SLOW
    fake_llama.push(ScriptedReply(content="long " * 150), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama, admins=("bob",)) as env, daemon(env):
        root = env.fake.post_as("alice", "dev", "@loopd write at length")
        await until(lambda: "answering" in "".join(env.status_history(root.id)), "answering")
        env.fake.post_as("bob", "dev", "stop", root_id=root.id)
        await until(
            lambda: any("⏹️ Stopped by @bob." in p.message for p in env.live_bot_posts(root.id)),
            "the stop",
        )
        with SessionLog.open(env.settings.db_path) as log:
            state = log.state(session_name(root.id))
        assert state.broken_since[-1].fields.reason == "stopped by @bob"
        assert env.answers(root.id) == []


async def test_a_message_during_a_turn_is_answered_by_the_next_turn(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = SLOW
    fake_llama.push(ScriptedReply(content="first " * 40), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        root = env.fake.post_as("alice", env.dm(), "one")
        await until(lambda: "answering" in "".join(env.status_history(root.id)), "answering")
        env.fake.post_as("alice", env.dm(), "two", root_id=root.id)
        await until(lambda: len(env.answers(root.id)) == 2, "both answers")
        # Stored after the first answer, which never saw it: the log's order is the truth.
        assert log_kinds(env, root.id) == [
            ("user", "@alice: one"),
            ("assistant", "first " * 40),
            ("user", "@alice: two"),
            ("assistant", "You said: @alice: two"),
        ]


async def test_waiting_is_capped_per_person_and_per_thread(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = SLOW
    fake_llama.push(ScriptedReply(content="busy " * 100), model=FAKE_MODEL)
    async with (
        environment(
            tmp_path, sockets, llama, max_waiting_per_user=2, max_waiting_per_thread=2
        ) as env,
        daemon(env),
    ):
        busy = env.fake.post_as("bob", "dev", "@loopd keep the slot busy")
        await until(lambda: "answering" in "".join(env.status_history(busy.id)), "answering")
        # alice: two threads wait for the one slot; a third is one too many.
        taken = [env.fake.post_as("alice", "dev", f"@loopd question {i}") for i in range(2)]
        third = env.fake.post_as("alice", "dev", "@loopd question 2")
        await until(lambda: bool(env.bot_posts(third.id)), "the refusal")
        assert env.bot_posts(third.id)[0].message == (
            "⏳ You already have 2 threads waiting for an answer, so I did not take this one. "
            "Post it again once one is answered."
        )
        # bob's thread: two replies wait while its turn runs; a third is one too many.
        for i in range(2):
            env.fake.post_as("bob", "dev", f"more {i}", root_id=busy.id)
        env.fake.post_as("bob", "dev", "more 2", root_id=busy.id)
        await until(lambda: bool(notices(env, busy.id, "⏳ 2 messages")), "the thread refusal")
        assert [p.message for p in notices(env, busy.id, "⏳ 2 messages")] == [
            "⏳ 2 messages are already waiting in this thread, so I did not take this one. "
            "Post it again once I have answered."
        ]
        await until(lambda: all(env.answers(p.id) for p in taken), "the waiting threads' answers")
        await until(lambda: len(env.answers(busy.id)) == 2, "the thread's next answer")
        stored = [c for k, c in log_kinds(env, busy.id) if k == "user"]
        assert stored == ["@bob: @loopd keep the slot busy", "@bob: more 0", "@bob: more 1"]
        assert env.answers(third.id) == []


async def test_thread_policy_mentions_answers_only_replies_that_mention_loopd(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama, thread_policy="mentions") as env, daemon(env):
        root = env.fake.post_as("alice", "dev", "@loopd first question")
        await until(lambda: len(env.answers(root.id)) == 1, "the first answer")
        env.fake.post_as("bob", "dev", "humans talking", root_id=root.id)
        env.fake.post_as("alice", "dev", "@loopd and now?", root_id=root.id)
        await until(lambda: len(env.answers(root.id)) == 2, "the answer to the mention")
        # The reply between the mentions was not answered, but it was read before the mention.
        assert [c for k, c in log_kinds(env, root.id) if k == "user"] == [
            "@alice: @loopd first question",
            "@bob: humans talking",
            "@alice: @loopd and now?",
        ]
        dm = env.fake.post_as("alice", env.dm(), "a direct message")
        await until(lambda: len(env.answers(dm.id)) == 1, "the DM answer")
        env.fake.post_as("alice", env.dm(), "no mention needed here", root_id=dm.id)
        await until(lambda: len(env.answers(dm.id)) == 2, "the DM's later answer")
