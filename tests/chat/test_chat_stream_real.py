"""Acceptance: the answer appears in its post as the REAL llama-server writes it, with loopd
reaching the fake Mattermost only through brokerd's chat proxy (which adds the bot token)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from loopd.chat.outbox import TURN_PROP
from loopd.chat.split import split_message
from loopd.chat.threads import session_name
from loopd.engine.notes import cut_note
from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd_dev import devserver
from tests.chat.chat_support import (
    Env,
    chat_settings_for,
    daemon,
    fake_mattermost,
    settings_for,
    until,
)
from tests.chat.serve_process import REPO_ROOT

pytestmark = [pytest.mark.real_server, pytest.mark.anyio, pytest.mark.timeout(600)]

MODEL_S = 240.0


@asynccontextmanager
async def chat_proxy(socket_dir: Path, mattermost: Path, token: str) -> AsyncIterator[Path]:
    """``brokerd serve --only chat`` in front of ``mattermost``; its chat socket."""
    token_file = socket_dir / "bot-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKERD_", "LOOPD_"))}
    env.update(
        BROKERD_SOCKET_DIR=str(socket_dir / "run"),
        BROKERD_MATTERMOST_URL=f"unix:{mattermost}",
        BROKERD_MATTERMOST_TOKEN_FILE=str(token_file),
        BROKERD_INFERENCE_URL="http://127.0.0.1:9",  # not served: --only chat
        # Where the box may post: the fake's direct messages with any of its users.
        BROKERD_CHAT_ALLOWED_USERS='["*"]',
    )
    log_path = socket_dir / "brokerd.log"
    with log_path.open("wb") as log_file:
        process = await anyio.open_process(
            [sys.executable, "-m", "brokerd", "serve", "--only", "chat"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            cwd=REPO_ROOT,
            env=env,
        )
    try:
        await until(lambda: '"msg": "ready: ' in log_path.read_text(), "brokerd to be ready", 60)
        yield socket_dir / "run" / "chat.sock"
    finally:
        process.terminate()
        with anyio.CancelScope(shield=True), anyio.fail_after(10):
            await process.wait()
        print(f"----- brokerd -----\n{log_path.read_text()}")


def logged_answer(env: Env, root_id: str) -> str:
    with SessionLog.open(env.settings.db_path, create=False) as log:
        entries = log.entries(session_name(root_id))
    [answer] = [e for e in entries if e.kind is EntryKind.ASSISTANT]
    content = json.loads(answer.message or "{}").get("content")
    assert isinstance(content, str)
    return content


def posted_answer(env: Env, root_id: str) -> str:
    """The answer as the thread shows it: the logged text, and the line saying it was cut when
    the server ended it at max_tokens (loopd.engine.notes)."""
    with SessionLog.open(env.settings.db_path, create=False) as log:
        last = log.requests(session_name(root_id))[-1].record.perf
    answer = logged_answer(env, root_id)
    if last.extra.get("finish_reason") == "length":
        answer += f"\n\n_{cut_note(last.predicted_n)}_"
    return answer


async def test_the_answer_post_is_written_as_the_model_writes(
    tmp_path: Path, sockets: Path, real_server: devserver.RunningServer
) -> None:
    async with fake_mattermost(sockets) as mm:
        assert mm.uds is not None
        async with chat_proxy(sockets, mm.uds, mm.fake.config.bot_token) as chat_sock:
            env = Env(
                mm,
                settings_for(
                    tmp_path / "state", real_server.url, devserver.PLAIN_MODEL, max_tokens=200
                ),
                # No token: the proxy adds it, as in the box.
                chat_settings_for(mm, tmp_path, url=f"unix:{chat_sock}", token_file=None),
            )
            async with daemon(env):
                post = env.fake.post_as("alice", env.dm(), "Write a long poem about rivers.")
                await until(lambda: len(env.answers(post.id)) >= 1, "the answer", MODEL_S)
                await until(
                    lambda: env.status_posts_left(post.id) == [], "the status post to go", 30
                )
            answer = posted_answer(env, post.id)
            first = split_message(answer, mm.fake.config.max_post_size)[0]
            [post0, *_] = env.answers(post.id)
            edits = env.edits_of(post0.post_id)
            print("edits of the answer post:", *map(repr, edits), sep="\n")
            # Created at the first answer text, then patched as it grew, then the whole text.
            drafts, final = edits[:-1], edits[-1]
            assert final == first
            assert len(drafts) >= 3, "created, and patched at least twice before the final text"
            assert all(d.endswith(" …") for d in drafts)
            grown = [d.removesuffix(" …") for d in drafts]
            assert all(answer.startswith(g) for g in grown)
            assert [len(g) for g in grown] == sorted(len(g) for g in grown)
            # Only the answer is left in the thread: no status post, no other bot post.
            assert env.status_posts_left(post.id) == []
            keys = {str(p.props.get(TURN_PROP)) for p in env.live_bot_posts(post.id)}
            assert keys == {str(post0.props[TURN_PROP])}
