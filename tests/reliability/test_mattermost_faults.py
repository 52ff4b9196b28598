"""The daemon (chat adapter + engine) against the fake Mattermost's faults, and loopd stopped
while it posts or with turns pending in several threads; the four checks after each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.chat.threads import session_name
from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd_dev.fakes.llama import FakeLlama, Pace, ScriptedReply, serve_fake_llama
from loopd_dev.fakes.mattermost.events import Broadcast, WsEvent
from tests.chat.chat_support import Env, chat_settings_for, daemon, fake_mattermost, settings_for
from tests.reliability.conftest import Observe
from tests.reliability.harness import MODEL, check_invariants, fake_llama, until
from tests.reliability.write_table import scenario

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def chat_box(tmp_path: Path, fake: FakeLlama | None = None) -> AsyncIterator[Env]:
    import tempfile

    fake = fake or fake_llama()
    with tempfile.TemporaryDirectory(prefix="lm") as sockets:
        async with (
            serve_fake_llama(fake) as llama,
            fake_mattermost(Path(sockets)) as mm,
        ):
            yield Env(
                mm,
                settings_for(tmp_path / "state", llama.base_url, MODEL, max_tokens=512),
                chat_settings_for(mm, tmp_path),
            )


def shown(env: Env, roots: list[str]) -> str:
    return "\n".join(p.message for root in roots for p in env.answers(root))


def check(env: Env, roots: list[str], messages: list[str]) -> str:
    for root in roots:
        assert len(env.answers(root)) == 1, f"thread {root}: {len(env.answers(root))} answers"
    checked = check_invariants(
        env.settings.state_dir, None, [f"@alice: {m}" for m in messages], shown(env, roots)
    )
    return checked.summary()


@scenario(
    "Mattermost",
    "socket dropped with posts in flight",
    fault="the WebSocket is dropped, three posts arrive while it is down",
    expected="reconnect + REST catch-up: each post answered exactly once",
)
async def test_socket_dropped_with_posts_in_flight(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env):
        env.fake.drop_sockets("loopd")
        posts = [env.fake.post_as("alice", env.dm(), f"in flight {i}") for i in range(3)]
        roots = [p.id for p in posts]
        await until(lambda: all(len(env.answers(r)) == 1 for r in roots), "three answers")
        await anyio.sleep(0.3)  # a duplicate would show up now
        observe(check(env, roots, [f"in flight {i}" for i in range(3)]))


@scenario(
    "Mattermost",
    "duplicated and skipped seq",
    fault="one event delivered twice, then two seq numbers skipped",
    expected="the repeat is ignored, the gap forces a reconnect and catch-up; one answer each",
)
async def test_duplicated_and_skipped_seq(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env) as running:
        env.fake.duplicate_seq("loopd")
        twice = env.fake.post_as("alice", env.dm(), "said twice")
        await until(lambda: len(env.answers(twice.id)) == 1, "the first answer")
        connects = running.adapter.connects
        env.fake.skip_seq(2, "loopd")
        gap = env.fake.post_as("alice", env.dm(), "after a gap")
        await until(lambda: len(env.answers(gap.id)) == 1, "the answer after the gap")
        assert running.adapter.connects > connects
        observe(check(env, [twice.id, gap.id], ["said twice", "after a gap"]))


@scenario(
    "Mattermost",
    "server restart with a new connection id",
    fault="Mattermost restarts: the old connection id is forgotten, a post lands meanwhile",
    expected="a fresh connection and a REST catch-up; the post answered once",
)
async def test_restart_with_a_new_connection_id(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env) as running:
        before = env.fake.post_as("alice", env.dm(), "before the restart")
        await until(lambda: len(env.answers(before.id)) == 1, "the first answer")
        connects = running.adapter.connects
        env.fake.restart()
        after = env.fake.post_as("alice", env.dm(), "during the restart")
        await until(lambda: len(env.answers(after.id)) == 1, "the answer after the restart")
        assert running.adapter.connects > connects
        observe(check(env, [before.id, after.id], ["before the restart", "during the restart"]))


@scenario(
    "Mattermost",
    "5xx after the post was stored",
    fault="three answer posts are stored, then answered 502",
    expected="the ambiguous create is checked before retrying: exactly one answer",
)
async def test_5xx_after_the_post_was_stored(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env):
        env.fake.fail_next_creates(3, status=502)
        post = env.fake.post_as("alice", env.dm(), "through five hundreds")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        await anyio.sleep(0.3)
        observe(check(env, [post.id], ["through five hundreds"]))


@scenario(
    "Mattermost",
    "429 burst",
    fault="four requests in a row answered 429 with Retry-After",
    expected="waited out as told; exactly one answer",
)
async def test_429_burst(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env):
        env.fake.burst_429(4, retry_after_s=1)
        post = env.fake.post_as("alice", env.dm(), "through rate limits")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        observe(check(env, [post.id], ["through rate limits"]))


@scenario(
    "loopd",
    "stopped while a reply is being posted",
    fault="Mattermost stalls (no replies) while the answer is posted; loopd is stopped then",
    expected="the next start finds or posts the stored answer: exactly one answer",
)
async def test_stopped_while_a_reply_is_posted(tmp_path: Path, observe: Observe) -> None:
    fake = fake_llama()
    fake.pace = Pace(tokens_per_second=30)
    fake.push(ScriptedReply(content="slow " * 30), model=MODEL)
    async with chat_box(tmp_path, fake) as env:
        async with daemon(env):
            post = env.fake.post_as("alice", env.dm(), "answer me once")
            await until(lambda: any(r.status == 200 for r in fake.log), "the stream")
            env.fake.stall()  # from now on nothing the bot posts gets through
            await until(lambda: _answer_stored(env, post.id), "the answer in the log")
            await anyio.sleep(0.3)  # its post is under way: stored or not, never acknowledged
        env.fake.unstall()
        async with daemon(env):
            await until(lambda: len(env.answers(post.id)) == 1, "the answer after the restart")
            await anyio.sleep(0.3)
        observe(check(env, [post.id], ["answer me once"]))


def _answer_stored(env: Env, root: str) -> bool:
    with SessionLog.open(env.settings.db_path) as log:
        return any(e.kind is EntryKind.ASSISTANT for e in log.entries(session_name(root)))


@scenario(
    "loopd",
    "restarted with pending turns in several sessions",
    fault="loopd stopped while three threads' turns stream; started again",
    expected="every pending turn resumes and each thread gets exactly one answer",
)
async def test_restarted_with_pending_turns_in_several_sessions(
    tmp_path: Path, observe: Observe
) -> None:
    fake = fake_llama()
    fake.pace = Pace(tokens_per_second=20)
    fake.push(*[ScriptedReply(content="slow " * 100) for _ in range(3)], model=MODEL)
    async with chat_box(tmp_path, fake) as env:
        async with daemon(env):
            posts = [env.fake.post_as("alice", env.dm(), f"thread {i}") for i in range(3)]
            await until(lambda: any(r.status == 200 for r in fake.log), "a stream")
        assert all(env.answers(p.id) == [] for p in posts)
        fake.pace = Pace()
        async with daemon(env):
            roots = [p.id for p in posts]
            await until(lambda: all(len(env.answers(r)) == 1 for r in roots), "three answers")
            await anyio.sleep(0.3)
        observe(check(env, roots, [f"thread {i}" for i in range(3)]))


@scenario(
    "Bad input",
    "malformed Mattermost events",
    fault="'posted' events with a non-JSON post, a post without id, a wrong type, junk data",
    expected="each is dropped (logged), nothing stored for them; the next real post answered",
)
async def test_malformed_mattermost_events(tmp_path: Path, observe: Observe) -> None:
    async with chat_box(tmp_path) as env, daemon(env):
        channel = env.dm()
        junk: list[dict[str, Any]] = [
            {"post": "{not json"},
            {"post": '{"message": "no id", "channel_id": "' + channel + '"}'},
            {"post": 42},
            {"post": '{"id": 7, "channel_id": [], "message": {}}'},
            {},
        ]
        for data in junk:
            env.fake.publish(WsEvent("posted", data, Broadcast(channel_id=channel)))
        env.fake.publish(WsEvent("no_such_event", {"x": 1}, Broadcast(channel_id=channel)))
        post = env.fake.post_as("alice", channel, "a real one")
        await until(lambda: len(env.answers(post.id)) == 1, "the answer")
        observe(check(env, [post.id], ["a real one"]))
