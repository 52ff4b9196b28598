"""A thread taken from Mattermost gets its label once, from the post that started it, and the
status page shows it (the daemon against the fake Mattermost and the fake llama-server)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loopd.chat.threads import session_name
from loopd.status.server import create_app
from loopd_dev.fakes.llama import RunningFake
from tests.chat.chat_support import Env, chat_settings_for, daemon, fake_mattermost, settings_for
from tests.chat.chat_support import until as wait_until
from tests.chat.conftest import FAKE_MODEL

pytestmark = pytest.mark.anyio


async def test_the_status_page_names_the_thread(
    tmp_path: Path, sockets: Path, llama: RunningFake
) -> None:
    async with fake_mattermost(sockets) as mm:
        env = Env(
            mm,
            settings_for(tmp_path / "state", llama.base_url, FAKE_MODEL),
            chat_settings_for(mm, tmp_path),
        )
        async with daemon(env) as running:
            root = env.fake.post_as("alice", "dev", "@loopd: what is two plus two?")
            await wait_until(lambda: len(env.answers(root.id)) == 1, "the first answer")
            env.fake.post_as("bob", "dev", "and three?", root_id=root.id)
            await wait_until(lambda: len(env.answers(root.id)) == 2, "the second answer")
            labels = running.adapter.thread_labels()
            app = create_app(running.runtime, threads=running.adapter.thread_labels)
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as page:
                html = (await page.get("/")).text
                data = (await page.get("/status.json")).json()
    label = labels[session_name(root.id)]
    assert (label.channel, label.person, label.first_words) == (
        "~dev",
        "alice",  # the thread's starter, not the later reply's author
        "@loopd: what is two plus two?",
    )
    assert "~dev</bdi> · @<bdi>alice</bdi> · “<bdi>@loopd: what is two plus two?</bdi>”" in html
    [session] = [s for s in data["sessions"] if s["name"] == session_name(root.id)]
    assert session["thread"]["person"] == "alice"
