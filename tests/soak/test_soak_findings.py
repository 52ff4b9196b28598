"""Defects the soak found in loopd, each reproduced on its own, small and fast.

A full disk while a message was taken in (``SQLITE_FULL`` when the session log stored it) ended
``loopd serve`` with a traceback: the error left the adapter's connection loop, which handled
only socket and Mattermost errors. The supervisor restarted it, and the catch-up found the
message again, but a disk that stays full would have made that a crash loop. The message must
wait for room instead: not taken in, so its channel's cursor stays before it, and the next
catch-up takes it in.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopd.sessionlog.errors import DiskFullError
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, ScriptedReply, serve_fake_llama
from tests.chat.chat_support import (
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

MODEL = "fake-model"


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="lk") as tmp:
        yield Path(tmp)


async def test_a_full_disk_while_a_message_is_taken_in_does_not_end_the_daemon(
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=8192)])
    fake.push(ScriptedReply(content="Answered once there was room."), model=MODEL)
    async with serve_fake_llama(fake) as llama, fake_mattermost(sockets) as mm:
        env = Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, MODEL),
            chat_settings_for(mm, tmp_path),
        )
        async with daemon(env) as running:
            log = running.runtime.log
            store = log.append_user
            refused: list[str] = []

            def full_once(session: str, text: str, *, external_key: str) -> Any:
                if not refused:
                    refused.append(external_key)
                    raise DiskFullError(env.settings.db_path, "disk full (SQLITE_FULL)")
                return store(session, text, external_key=external_key)

            monkeypatch.setattr(log, "append_user", full_once)
            post = env.fake.post_as("alice", env.dm(), "Are you there?")
            await until(lambda: len(env.answers(post.id)) == 1, "the answer, once there was room")
            assert refused == [post.id]
        [answer] = env.answers(post.id)
        assert answer.message == "Answered once there was room."
