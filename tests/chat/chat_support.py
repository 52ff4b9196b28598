"""Helpers for the chat adapter's scenario tests: the fake Mattermost, a llama-server (fake or
real), and the daemon, all in one process."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from loopd.chatsettings import ChatSettings
from loopd.config import Settings
from loopd.serve import Daemon, run_daemon
from loopd_dev.fakes.llama import RunningFake as RunningLlama
from loopd_dev.fakes.mattermost import (
    FakeConfig,
    FakeMattermost,
    LoggedPost,
    RunningFake,
    serve_fake_mattermost,
)
from tests.chat.conftest import FAKE_MODEL

WAIT_S = 20.0
FAST_MM = FakeConfig(auth_timeout_s=0.5, ping_interval_s=0.5, pong_wait_s=2.0)
_ANSWER_KEY = re.compile(r"#\d+$")


@dataclass
class Env:
    mm: RunningFake
    settings: Settings
    chat: ChatSettings

    @property
    def daemon_settings(self) -> Settings:
        """The settings ``loopd serve`` runs with: ``settings`` with ``chat`` as its ``mm``."""
        return self.settings.model_copy(update={"mm": self.chat})

    @property
    def fake(self) -> FakeMattermost:
        return self.mm.fake

    def bot_posts(self, root_id: str | None = None) -> list[LoggedPost]:
        return self.fake.log.created(user_id=self.fake.bot.id, root_id=root_id)

    def live_bot_posts(self, root_id: str) -> list[LoggedPost]:
        """The bot's posts in a thread as they stand now (edited text and props, deleted ones
        left out), oldest first."""
        bot = self.fake.bot.id
        return [
            LoggedPost("live", p.id, p.user_id, p.channel_id, p.root_id, p.message, dict(p.props))
            for p in sorted(self.fake.world.posts.values(), key=lambda p: p.create_at)
            if p.user_id == bot and p.root_id == root_id and not p.delete_at and not p.original_id
        ]

    def answers(self, root_id: str) -> list[LoggedPost]:
        """The bot's answer posts in a thread as they stand now (not status posts, not
        notices; the post an answer was written into counts once it holds the answer)."""
        return [
            p
            for p in self.live_bot_posts(root_id)
            if _ANSWER_KEY.search(str(p.props.get("loopd_turn", "")))
        ]

    def status_posts_left(self, root_id: str) -> list[LoggedPost]:
        """Status posts still in the thread (a finished turn leaves none)."""
        return [
            p
            for p in self.live_bot_posts(root_id)
            if str(p.props.get("loopd_turn", "")).endswith(":status")
        ]

    def edits_of(self, post_id: str) -> list[str]:
        """Every text a post showed, created or edited, in order."""
        return [
            e.message
            for e in self.fake.log.entries
            if e.post_id == post_id and e.action in ("created", "edited")
        ]

    def status_history(self, root_id: str) -> list[str]:
        """Every text the thread's status posts showed, created or edited, in order."""
        status_ids = {
            p.post_id
            for p in self.bot_posts(root_id)
            if str(p.props.get("loopd_turn", "")).endswith(":status")
        }
        return [
            e.message
            for e in self.fake.log.entries
            if e.post_id in status_ids and e.action in ("created", "edited")
        ]

    def dm(self) -> str:
        channels = self.fake.world.channels_of(self.fake.bot)
        return next(c.id for c in channels if c.type == "D")


def settings_for(state_dir: Path, infer_url: str, model: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "infer_url": infer_url,
        "model": model,
        "state_dir": state_dir,
        "broker_url": f"unix:{state_dir}/no-broker.sock",
        "slots": (0,),
        "first_byte_s": 60.0,
        "silence_s": 20.0,
        "connect_s": 2.0,
        "max_tokens": 64,
        "think_cap": 0,  # no cap: 64 tokens leave a capped reasoning no room to answer
        "temperature": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


def chat_settings_for(mm: RunningFake, token_dir: Path, **overrides: Any) -> ChatSettings:
    token_file = token_dir / "mm-token"
    token_file.write_text(mm.fake.config.bot_token)
    url = f"unix:{mm.uds}" if mm.uds is not None else mm.base_url
    values: dict[str, Any] = {
        "url": url,
        "token_file": token_file,
        "allowed_users": ("alice", "bob"),
        "allowed_channels": ("dev", "secret"),
        "status_interval_s": 0.2,
        "ping_interval_s": 1.0,
        "hello_timeout_s": 2.0,
        "backoff_s": 0.05,
        "backoff_cap_s": 0.5,
        "retry_for_s": 30.0,
        "max_waiting_per_user": 10,  # the tests that need the caps set their own
        "typing_interval_s": 0.5,
    }
    values.update(overrides)
    return ChatSettings(**values)


@asynccontextmanager
async def fake_mattermost(
    socket_dir: Path | None, config: FakeConfig = FAST_MM
) -> AsyncIterator[RunningFake]:
    """The fake on a Unix socket in ``socket_dir`` (the in-box form), or on TCP when None."""
    uds = socket_dir / "mm.sock" if socket_dir is not None else None
    async with (
        anyio.create_task_group() as tg,
        serve_fake_mattermost(tg, config=config, uds=uds) as running,
    ):
        yield running
        tg.cancel_scope.cancel()


@asynccontextmanager
async def daemon(env: Env) -> AsyncIterator[Daemon]:
    """The daemon, running until the block ends (then cancelled, as a kill would stop it)."""
    async with anyio.create_task_group() as tg:
        running: Daemon = await tg.start(run_daemon, env.daemon_settings)
        with anyio.fail_after(WAIT_S):
            await running.adapter.caught_up.wait()
        yield running
        tg.cancel_scope.cancel()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait for ``condition`` (polled: the fakes offer no event for what the daemon did)."""
    try:
        with anyio.fail_after(timeout_s):
            while not condition():  # noqa: ASYNC110
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@asynccontextmanager
async def environment(
    tmp_path: Path,
    sockets: Path | None,
    llama: RunningLlama,
    mm_config: FakeConfig = FAST_MM,
    max_tokens: int = 2048,
    **chat: Any,
) -> AsyncIterator[Env]:
    """The fake Mattermost, and the settings of a daemon on it and on ``llama`` (the fake
    llama-server's model), its state under ``tmp_path``."""
    async with fake_mattermost(sockets, mm_config) as mm:
        yield Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL, max_tokens=max_tokens),
            chat_settings_for(mm, tmp_path, **chat),
        )
