"""Replies after a restart mid-post: parts already in the thread are found, not posted again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loopd.chat.cursor import ChatState
from loopd.chat.outbox import PART_PROP, TURN_PROP, Outbox, StatusPost
from loopd.chat.rest import MattermostClient, api_client
from loopd.chat.status import Finished
from tests.chat.chat_support import FAST_MM, fake_mattermost

pytestmark = pytest.mark.anyio


async def test_a_half_posted_reply_is_completed_without_duplicates(tmp_path: Path) -> None:
    # No dedup window: after a restart the server no longer remembers pending_post_id.
    async with fake_mattermost(None, replace(FAST_MM, dedup_ttl_s=0.0, max_post_size=200)) as mm:
        fake = mm.fake
        root = fake.post_as("alice", "dev", "@loopd long answer please")
        client = MattermostClient(api_client(mm.base_url, fake.config.bot_token), retry_for_s=5)
        state = ChatState.open(tmp_path / "chat.db")
        outbox = Outbox(client, state, fake.bot.id, 200)
        text = "\n\n".join(f"part {i} " + "y" * 150 for i in range(3))
        key = "mm:x#7"
        # The first run recorded its intent, posted part 0, and died before recording it.
        state.record_intent(key, 3)
        fake.post_as(
            "loopd", "dev", text.split("\n\n")[0], root_id=root.id,
            props={TURN_PROP: key, PART_PROP: 0},
        )  # fmt: skip
        ids = await outbox.post_once(key, fake.channel("dev").id, root.id, text)
        again = await outbox.post_once(key, fake.channel("dev").id, root.id, text)
        await client.aclose()
        assert ids == again
        assert len(ids) == 3
        created = fake.log.created(user_id=fake.bot.id, root_id=root.id)
        assert [p.props[PART_PROP] for p in created] == [0, 1, 2]
        assert outbox.delivered(key)


async def test_a_reopened_status_post_shows_the_turn_starting_again(tmp_path: Path) -> None:
    async with fake_mattermost(None) as mm:
        fake = mm.fake
        root = fake.post_as("alice", "dev", "@loopd a question")
        client = MattermostClient(api_client(mm.base_url, fake.config.bot_token), retry_for_s=5)
        state = ChatState.open(tmp_path / "chat.db")
        outbox = Outbox(client, state, fake.bot.id, 16383)
        channel = fake.channel("dev").id

        def status() -> StatusPost:
            return StatusPost(outbox, "mm:x#3:status", channel, root.id, interval_s=0)

        first = status()
        post_id = await first.open()
        await first.finish(Finished("interrupted"))  # what the previous run last showed
        second = status()  # the same turn, after a restart
        assert await second.open() == post_id
        await client.aclose()
        texts = [e.message for e in fake.log.entries if e.post_id == post_id]
        assert texts[-1].startswith("⏳")
        assert [e.action for e in fake.log.entries if e.post_id == post_id].count("created") == 1


async def test_hidden_characters_reach_the_thread_shown_and_each_part_within_the_limit(
    tmp_path: Path,
) -> None:
    async with fake_mattermost(None, replace(FAST_MM, max_post_size=200)) as mm:
        fake = mm.fake
        root = fake.post_as("alice", "dev", "@loopd a question")
        client = MattermostClient(api_client(mm.base_url, fake.config.bot_token), retry_for_s=5)
        state = ChatState.open(tmp_path / "chat.db")
        outbox = Outbox(client, state, fake.bot.id, 200)
        # Each override is one character written and eight shown: 150 of them make 1,200.
        text = "open report\u202efdp.sh " + "\u202e" * 150
        ids = await outbox.post_once("mm:x#1", fake.channel("dev").id, root.id, text)
        draft = StatusPost(outbox, "mm:x#1:status", fake.channel("dev").id, root.id, interval_s=0)
        await draft.open()
        await client.patch_message(draft.post_id or "", "edit\u200b\x1b[2J", root_id=root.id)
        await client.aclose()
        posted = [p.message for p in fake.log.created(user_id=fake.bot.id, root_id=root.id)]
        assert posted[0].startswith("open report<U+202E>fdp.sh <U+202E><U+202E>")
        assert len(ids) == 7  # 21 + 150 * 8 characters, in posts of at most 200
        assert all(len(message) <= 200 for message in posted)
        edited = [e.message for e in fake.log.entries if e.post_id == draft.post_id]
        assert edited[-1] == "edit<U+200B>␛[2J"
        shown = "".join(posted + edited)
        assert not {"\u202e", "\u200b", "\x1b"} & set(shown)
