"""A person in a thread, through the official Mattermost client: each call one run of
``js/person.cjs`` (Client4) against the fake, as that person's own client would do it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.chat.chat_support import Env


class Person:
    """``username``'s own client."""

    def __init__(self, node: str, modules: Path, scripts: Path, env: Env, username: str) -> None:
        self.node, self.modules, self.script = node, modules, scripts / "person.cjs"
        self.env = env
        user = env.fake.user(username)
        self.base = {"url": env.mm.base_url, "token": user.token}
        self.user_id = user.id

    async def _run(self, **arguments: Any) -> dict[str, Any]:
        environ = {**os.environ, "NODE_PATH": str(self.modules), "NODE_NO_WARNINGS": "1"}
        with anyio.fail_after(120):
            done = await anyio.run_process(
                [self.node, str(self.script), json.dumps({**self.base, **arguments})],
                env=environ,
                check=False,
            )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        out: dict[str, Any] = json.loads(done.stdout)
        return out

    async def post(self, message: str, root_id: str = "", channel_id: str = "") -> str:
        """A message (in the bot's direct channel unless ``channel_id`` is given), or a reply."""
        channel = channel_id or self.env.dm()
        out = await self._run(op="post", channel_id=channel, message=message, root_id=root_id)
        return str(out["post"]["id"])

    async def react(self, post_id: str, emoji_name: str) -> None:
        await self._run(op="react", user_id=self.user_id, post_id=post_id, emoji_name=emoji_name)

    async def thread(self, root_id: str) -> list[dict[str, Any]]:
        """The thread's posts as the client shows them, oldest first."""
        posts: list[dict[str, Any]] = (await self._run(op="thread", post_id=root_id))["posts"]
        return posts

    async def bot_messages(self, root_id: str) -> list[str]:
        bot = self.env.fake.bot.id
        return [p["message"] for p in await self.thread(root_id) if p["user_id"] == bot]


PersonOf = Callable[[Env, str], Person]


@pytest.fixture
def person_of(node: str, client_modules: Path, scripts: Path) -> PersonOf:
    """A person's client in an environment (each test makes its own)."""
    return lambda env, username: Person(node, client_modules, scripts, env, username)
