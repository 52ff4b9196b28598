"""The daemon against the fake Mattermost and the fake llama-server: intake, replies, status,
stop, and the faults of the issue (drops, duplicates, restarts, 5xx, 429, odd posts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from loopd.chat.threads import Threads, session_name
from loopd.sessionlog import EntryKind, SessionLog
from loopd.sessionlog.records import RequestKind
from loopd.turnstop import was_stopped
from loopd_dev.fakes.llama import FakeLlama, Pace, RunningFake, ScriptedReply
from loopd_dev.fakes.mattermost import LoggedPost
from tests.chat.chat_support import (
    FAST_MM,
    Env,
    daemon,
    environment,
    until,
)
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio


def stopped_line(env: Env, root_id: str) -> bool:
    return any("⏹️ Stopped by @alice." in p.message for p in env.live_bot_posts(root_id))


def assert_stopped_with_its_draft(env: Env, root: str) -> None:
    """No answer; one closing post: what was written before the stop, then the stop line; the
    stop in the session log."""
    assert env.answers(root) == []
    [closing] = env.live_bot_posts(root)
    assert closing.message.startswith("long"), closing
    assert closing.message.endswith("\n\n⏹️ Stopped by @alice.")
    with SessionLog.open(env.settings.db_path) as log:
        state = log.state(session_name(root))
    assert state.broken_since[-1].fields.reason == "stopped by @alice"


def user_messages(env: Env, root_id: str) -> list[str]:
    with SessionLog.open(env.settings.db_path) as log:
        if session_name(root_id) not in {s.name for s in log.sessions()}:
            return []
        return [
            str(e.message) for e in log.entries(session_name(root_id)) if e.kind is EntryKind.USER
        ]


async def test_a_dm_is_answered_in_its_thread_and_leaves_no_status_post(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=40)
    fake_llama.push(ScriptedReply(content="word " * 40), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "hello there")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
        [answer] = env.answers(post.id)
        assert answer.message == "word " * 40
        # The answer was written into its post as it came, then finished with the whole text.
        edits = env.edits_of(answer.post_id)
        assert len(edits) >= 3, edits
        assert all(e.endswith(" …") for e in edits[:-1])
        assert edits[-1] == "word " * 40
        assert [p.post_id for p in env.live_bot_posts(post.id)] == [answer.post_id]
        assert env.status_history(post.id)[0].startswith("⏳")
        assert '"content":"@alice: hello there"' in user_messages(env, post.id)[0]
        # The typing indicator showed in the thread while the turn waited or thought.
        bot = env.fake.bot.id
        assert any(t.user_id == bot and t.parent_id == post.id for t in env.fake.typing)


async def test_mention_starts_a_thread_and_later_replies_need_no_mention(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        ignored = env.fake.post_as("bob", "dev", "talking among humans")
        in_code = env.fake.post_as("bob", "dev", "see `@loopd` in the docs")
        root = env.fake.post_as("alice", "dev", "@loopd: what is two plus two?")
        await until(lambda: len(env.answers(root.id)) == 1, "the first answer")
        env.fake.post_as("bob", "dev", "and three?", root_id=root.id)
        await until(lambda: len(env.answers(root.id)) == 2, "the second answer")
        assert env.bot_posts(ignored.id) == env.bot_posts(in_code.id) == []
        assert [m.split('"content":')[1] for m in user_messages(env, root.id)] == [
            '"@alice: @loopd: what is two plus two?"}',
            '"@bob: and three?"}',
        ]


async def test_not_allowed_channel_and_user_get_a_refusal_once(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama, allowed_users=("alice",)) as env:
        async with daemon(env):
            channel = env.fake.post_as("alice", "town-square", "@loopd hello")
            user = env.fake.post_as("bob", "dev", "@loopd hello")
            await until(lambda: len(env.bot_posts(channel.id)) == 1, "the channel refusal")
            await until(lambda: len(env.bot_posts(user.id)) == 1, "the user refusal")
            assert "not enabled" in env.bot_posts(channel.id)[0].message
        async with daemon(env) as again:  # catch-up sees both posts again
            await again.adapter.catch_up()
        assert len(env.bot_posts(channel.id)) == len(env.bot_posts(user.id)) == 1
        assert env.answers(channel.id) == env.answers(user.id) == []


async def test_an_edit_of_a_read_post_gets_one_notice(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env) as running:
        post = env.fake.post_as("alice", env.dm(), "first words")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        env.fake.edit_as("alice", post.id, "second words")

        def notice() -> list[LoggedPost]:
            return [p for p in env.bot_posts(post.id) if "Edits" in p.message]

        await until(lambda: len(notice()) == 1, "the edit notice")
        await running.adapter.catch_up()
        assert len(notice()) == 1
        assert len(env.answers(post.id)) == 1


async def test_attachments_text_read_images_named_and_a_huge_post_cut(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    config = replace(FAST_MM, max_post_size=200_000)
    async with (
        environment(
            tmp_path, sockets, llama, config, max_message_chars=5000, max_file_bytes=1000
        ) as env,
        daemon(env),
    ):
        alice = env.fake.user("alice")
        store = env.fake.world.store_file
        notes = store(alice, env.dm(), "notes.txt", "text/plain", b"the build is green")
        big = store(alice, env.dm(), "big.log", "text/plain", b"line\n" * 400)
        photo = store(alice, env.dm(), "cat.png", "image/png", b"\x89PNG\r\n")
        files = env.fake.create_post(
            alice, env.dm(), "", file_ids=[notes.id, big.id, photo.id]
        ).post
        only_image = store(alice, env.dm(), "dog.png", "image/png", b"\x89PNG\r\n")
        image_post = env.fake.create_post(alice, env.dm(), "", file_ids=[only_image.id]).post
        huge = env.fake.post_as("alice", env.dm(), "word " * 20_000)
        await until(lambda: len(env.answers(huge.id)) == 1, "the answer to the huge post")
        await until(lambda: len(env.answers(files.id)) == 1, "the answer to the files")
        await until(lambda: len(env.bot_posts(image_post.id)) == 1, "the image notice")
        (message,) = user_messages(env, files.id)
        assert "[attached file notes.txt (18 bytes)]\\nthe build is green\\n[end of notes.txt]" in (
            message
        )
        assert "[cut: big.log has 2.0 KB; only the first 1000 bytes]" in message
        assert "[attached: cat.png, an image, not read]" in message
        [notice] = [p.message for p in env.bot_posts(files.id) if p.message.startswith("📎")]
        assert notice == (
            "📎 big.log has 2.0 KB; I read only its first 1000 bytes. "
            "cat.png is an image; I read only text files."
        )
        assert env.bot_posts(image_post.id)[0].message == (
            "📎 dog.png is an image; I read only text files."
        )
        assert user_messages(env, image_post.id) == []
        assert any("100,000 characters" in p.message for p in env.bot_posts(huge.id))
        (message,) = user_messages(env, huge.id)
        assert len(message) < 5200
        assert "[cut: the message had 100000 characters]" in message


async def test_dropped_socket_with_posts_in_flight_loses_and_duplicates_none(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env) as running:
        first = env.fake.post_as("alice", env.dm(), "one")
        await until(lambda: len(env.answers(first.id)) == 1, "the first answer")
        connects = running.adapter.connects
        env.fake.drop_sockets("loopd")
        posts = [env.fake.post_as("alice", env.dm(), f"message {i}") for i in range(3)]
        env.fake.restart()  # and the server forgot the connection: only REST can recover
        posts.append(env.fake.post_as("alice", env.dm(), "after the restart"))
        for post in posts:
            root = post.id
            await until(lambda: len(env.answers(root)) == 1, f"the answer to {root}")  # noqa: B023
        assert running.adapter.connects > connects
        assert all(len(env.answers(p.id)) == 1 for p in [first, *posts])


async def test_repeated_and_skipped_seq(tmp_path: Path, sockets: Path, llama: RunningFake) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env) as running:
        env.fake.duplicate_seq("loopd")
        repeated = env.fake.post_as("alice", env.dm(), "said twice on the wire")
        await until(lambda: len(env.answers(repeated.id)) == 1, "the answer")
        connects = running.adapter.connects
        env.fake.skip_seq(2, "loopd")
        gap = env.fake.post_as("alice", env.dm(), "after a gap")
        await until(lambda: len(env.answers(gap.id)) == 1, "the answer after the gap")
        assert running.adapter.connects > connects  # the gap made it reconnect and catch up
        assert len(env.answers(repeated.id)) == 1
        assert len(user_messages(env, repeated.id)) == 1


async def test_restart_mid_turn_answers_the_pending_post_once(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=40)
    fake_llama.push(ScriptedReply(content="slow " * 200), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env:
        async with daemon(env):
            post = env.fake.post_as("alice", env.dm(), "take your time")
            await until(lambda: "answering" in "".join(env.status_history(post.id)), "answering")
        assert env.answers(post.id) == []
        fake_llama.pace = Pace()
        async with daemon(env):
            await until(lambda: len(env.answers(post.id)) == 1, "the answer after the restart")
            await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
        async with daemon(env):
            pass
        assert len(env.answers(post.id)) == 1
        status_posts = {p.post_id for p in env.bot_posts(post.id) if "status" in str(p.props)}
        assert len(status_posts) == 1  # the restarted turn found its status post again
        # ... and its answer post: the answer went into the post the first run had begun.
        assert [p.post_id for p in env.live_bot_posts(post.id)] == [
            p.post_id for p in env.bot_posts(post.id) if str(p.props).find(":draft") > 0
        ]


async def test_stop_cancels_the_turn_frees_the_slot_and_is_logged(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=30)
    fake_llama.push(ScriptedReply(content="long " * 500), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "write a lot")
        await until(lambda: "answering" in "".join(env.status_history(post.id)), "answering")
        env.fake.post_as("alice", env.dm(), "stop", root_id=post.id)
        slots = fake_llama.model(FAKE_MODEL).slots
        await until(
            lambda: not any(s.is_processing for s in slots.slots), "the slot to be free", 1.0
        )
        await until(lambda: stopped_line(env, post.id), "the stop line")
        await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
        assert_stopped_with_its_draft(env, post.id)
        env.fake.post_as("alice", env.dm(), "short one now", root_id=post.id)
        await until(lambda: len(env.answers(post.id)) == 1, "the next answer")


async def test_a_stop_taken_in_just_before_a_kill_still_stops_the_turn(
    tmp_path: Path,
    sockets: Path,
    fake_llama: FakeLlama,
    llama: RunningFake,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The window: the stop post is taken in (marked seen) and the turn cancelled, but loopd is
    # gone before the turn writes the stop into the session log. Here the turn never reaches its
    # conclusion, then the daemon is cancelled as a kill would end it.
    fake_llama.pace = Pace(tokens_per_second=30)
    fake_llama.push(ScriptedReply(content="long " * 500), model=FAKE_MODEL)
    concluding = anyio.Event()

    async def killed_before_the_stop_is_logged(*_: object) -> None:
        concluding.set()
        await anyio.sleep_forever()

    async with environment(tmp_path, sockets, llama) as env:
        with monkeypatch.context() as patched:
            patched.setattr(Threads, "_conclude", killed_before_the_stop_is_logged)
            async with daemon(env):
                post = env.fake.post_as("alice", env.dm(), "write a lot")
                await until(lambda: "answering" in "".join(env.status_history(post.id)), "it")
                env.fake.post_as("alice", env.dm(), "stop", root_id=post.id)
                with anyio.fail_after(30):
                    await concluding.wait()
        with SessionLog.open(env.settings.db_path) as log:
            state = log.state(session_name(post.id))
        # The window, reproduced: a pending turn, and no stop in the log.
        assert state.pending_turn
        assert not was_stopped(state)
        fake_llama.pace = Pace()
        fake_llama.push(ScriptedReply(content="answered after all"), model=FAKE_MODEL)
        async with daemon(env):
            await until(lambda: stopped_line(env, post.id), "the stop line after the restart")
            await until(lambda: env.status_posts_left(post.id) == [], "the status post to go")
        # No "Nothing is running." for the stop post: it was taken in with the stop.
        assert_stopped_with_its_draft(env, post.id)
        env.fake.post_as("alice", env.dm(), "short one now", root_id=post.id)
        async with daemon(env):
            await until(lambda: len(env.answers(post.id)) == 1, "the next answer")
        assert env.answers(post.id)[0].message == "answered after all"


async def test_stop_by_reaction_on_the_status_post(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=30)
    fake_llama.push(ScriptedReply(content="long " * 500), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "write a lot")
        await until(lambda: "answering" in "".join(env.status_history(post.id)), "answering")
        status_post = next(p for p in env.bot_posts(post.id) if "status" in str(p.props))
        env.fake.react_as("alice", status_post.post_id, "octagonal_sign")
        await until(lambda: stopped_line(env, post.id), "stopped")
        slots = fake_llama.model(FAKE_MODEL).slots
        await until(
            lambda: not any(s.is_processing for s in slots.slots), "the slot to be free", 1.0
        )
        assert env.answers(post.id) == []


@pytest.mark.parametrize("refusal", [403, 503])
async def test_a_refused_status_edit_costs_only_the_status_post(
    tmp_path: Path, sockets: Path, llama: RunningFake, refusal: int
) -> None:
    # 403: a permission scheme without edit_post. 503: an outage of edits only, longer than the
    # REST retry window. Either used to end the daemon from inside the turn's task group.
    async with environment(tmp_path, sockets, llama, retry_for_s=0.3) as env, daemon(env):
        env.fake.refuse_patches(refusal)
        first = env.fake.post_as("alice", env.dm(), "answer me anyway")
        await until(lambda: len(env.answers(first.id)) == 1, "the answer despite the edits")
        root = env.fake.post_as("bob", "dev", "@loopd: and another thread?")
        await until(lambda: len(env.answers(root.id)) == 1, "another thread's answer")
        assert env.answers(first.id)[0].message == "You said: @alice: answer me anyway"
        env.fake.refuse_patches(None)
        env.fake.post_as("alice", env.dm(), "edits work again", root_id=first.id)
        await until(lambda: len(env.answers(first.id)) == 2, "the next answer")
        await until(lambda: env.status_posts_left(first.id) == [], "the status posts to go")


async def test_a_status_post_deleted_mid_turn_costs_only_the_status_post(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    fake_llama.pace = Pace(tokens_per_second=60)
    fake_llama.push(ScriptedReply(content="word " * 60), model=FAKE_MODEL)
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "go on without your status")
        await until(lambda: "answering" in "".join(env.status_history(post.id)), "answering")
        status_post = next(p for p in env.bot_posts(post.id) if "status" in str(p.props))
        # A moderator deletes it; real Mattermost answers the next patch with 403.
        env.fake.delete_post(env.fake.bot, status_post.post_id)
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        assert env.answers(post.id)[0].message == "word " * 60


async def test_ambiguous_5xx_and_429_bursts_give_exactly_one_reply(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env, daemon(env):
        env.fake.fail_next_creates(3, status=502)
        first = env.fake.post_as("alice", env.dm(), "through five hundreds")
        await until(lambda: len(env.answers(first.id)) == 1, "the answer through 5xx")
        env.fake.burst_429(4, retry_after_s=1)
        second = env.fake.post_as("alice", env.dm(), "through rate limits")
        await until(lambda: len(env.answers(second.id)) == 1, "the answer through 429")
        assert len(env.answers(first.id)) == len(env.answers(second.id)) == 1


async def test_a_long_answer_is_split_into_parts(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    # Words that differ: "text " 40 times over is a loop the repetition watch would close.
    paragraphs = "\n\n".join(
        f"Paragraph {i}. " + " ".join(f"w{i}x{j}" for j in range(40)) for i in range(12)
    )
    fake_llama.push(ScriptedReply(content=paragraphs), model=FAKE_MODEL)
    config = replace(FAST_MM, max_post_size=1000)
    async with environment(tmp_path, sockets, llama, config) as env, daemon(env):
        post = env.fake.post_as("alice", env.dm(), "long please")
        await until(lambda: len(env.answers(post.id)) >= 3, "the parts")
        await anyio.sleep(0.3)
        parts = env.answers(post.id)
        assert all(len(p.message) <= 1000 for p in parts)
        assert "\n\n".join(p.message for p in parts) == paragraphs


async def test_no_token_over_the_socket_is_a_clear_error(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    from loopd.chat.rest import MattermostError
    from loopd.serve import run_daemon

    async with environment(tmp_path, sockets, llama) as env:
        chat = env.chat.model_copy(update={"token_file": None})
        with pytest.raises(MattermostError, match="401"):
            await run_daemon(env.settings.model_copy(update={"mm": chat}))


async def test_tcp_url_with_a_development_token(tmp_path: Path, llama: RunningFake) -> None:
    async with environment(tmp_path, None, llama) as env, daemon(env):
        assert env.chat.url.startswith("http://127.0.0.1:")
        post = env.fake.post_as("alice", "secret", "@loopd over tcp")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")


async def test_with_prewarm_on_a_restarted_daemon_reads_the_latest_thread_back(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with environment(tmp_path, sockets, llama) as env:
        env.settings = env.settings.model_copy(update={"prewarm": True})
        async with daemon(env):
            post = env.fake.post_as("alice", env.dm(), "hello there")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        with SessionLog.open(env.settings.db_path) as log:
            before = [r.record.kind for r in log.requests(session_name(post.id))]

        def prewarmed() -> bool:
            with SessionLog.open(env.settings.db_path) as log:
                requests = log.requests(session_name(post.id))
            return len(requests) > len(before) and requests[-1].record.kind is RequestKind.PREWARM

        async with daemon(env):
            await until(prewarmed, "a prewarm of the thread")
    assert before == [RequestKind.TURN]
