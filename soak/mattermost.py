"""The run's side of the fake Mattermost: acting as its users and arming its faults over the
control API, and a mirror of its post log that the simulated users read (is my message answered
yet, is a turn running in my thread) and the checks read at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TURN_PROP = "loopd_turn"  # loopd's reply key (loopd/chat/outbox.py), read from the outside
PART_PROP = "loopd_part"


@dataclass(frozen=True)
class LogEntry:
    """One entry of the fake's post log: what happened to a post, when (wall time)."""

    action: str  # created, deduplicated, edited, deleted
    post_id: str
    user_id: str
    channel_id: str
    root_id: str
    message: str
    props: dict[str, Any]
    at: float

    @property
    def key(self) -> str:
        return str(self.props.get(TURN_PROP, ""))

    @property
    def part(self) -> int | None:
        part = self.props.get(PART_PROP)
        return part if isinstance(part, int) else None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LogEntry:
        return cls(
            str(raw["action"]),
            str(raw["post_id"]),
            str(raw["user_id"]),
            str(raw["channel_id"]),
            str(raw["root_id"]),
            str(raw["message"]),
            dict(raw.get("props") or {}),
            float(raw["at"]),
        )


@dataclass
class BotPost:
    """A bot post as it stands: its latest text and key, created and last changed when."""

    post_id: str
    root_id: str
    message: str
    key: str
    part: int | None
    created_at: float
    deleted: bool = False


@dataclass
class Mirror:
    """The fake's post log, read incrementally, and the bot's posts per thread as they stand."""

    bot_id: str
    entries: list[LogEntry] = field(default_factory=list)
    bot_posts: dict[str, BotPost] = field(default_factory=dict)
    by_root: dict[str, list[str]] = field(default_factory=dict)
    last_reply_at: dict[str, float] = field(default_factory=dict)  # per thread

    def apply(self, entry: LogEntry) -> None:
        self.entries.append(entry)
        if entry.user_id != self.bot_id:
            return
        if entry.action in ("created", "edited") and _closing(entry.key):
            self.last_reply_at[entry.root_id] = entry.at
        post = self.bot_posts.get(entry.post_id)
        if entry.action == "created" and post is None:
            self.bot_posts[entry.post_id] = BotPost(
                entry.post_id, entry.root_id, entry.message, entry.key, entry.part, entry.at
            )
            self.by_root.setdefault(entry.root_id, []).append(entry.post_id)
        elif post is not None and entry.action == "edited":
            post.message, post.key, post.part = entry.message, entry.key, entry.part
        elif post is not None and entry.action == "deleted":
            post.deleted = True

    def live(self, root_id: str) -> list[BotPost]:
        return [
            self.bot_posts[i]
            for i in self.by_root.get(root_id, [])
            if not self.bot_posts[i].deleted
        ]

    def status_post(self, root_id: str) -> BotPost | None:
        """The live status post of the thread's running turn, if one is up."""
        posts = [p for p in self.live(root_id) if p.key.endswith(":status")]
        return posts[-1] if posts else None

    def replied_since(self, root_id: str, since: float) -> bool:
        """A bot post that ends a turn or answers a message (not a status post or a draft) was
        made in the thread at or after ``since``."""
        return self.last_reply_at.get(root_id, float("-inf")) >= since


def _closing(key: str) -> bool:
    return bool(key) and not key.endswith((":status", ":draft")) and ":status." not in key


def _names_a_missing_post(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("id") == "app.post.get.app_error"


class FakeControl:
    """The fake's control API over its Unix socket."""

    def __init__(self, uds: Path) -> None:
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(uds)),
            base_url="http://mattermost",
            timeout=httpx.Timeout(30.0),
        )
        self.read_upto = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, kind: str, name: str, **kwargs: Any) -> Any:
        response = await self._http.post(f"/_fake/{kind}/{name}", json=kwargs)
        response.raise_for_status()
        return response.json()["result"]

    async def act(self, name: str, **kwargs: Any) -> Any:
        return await self._call("act", name, **kwargs)

    async def react_if_there(self, username: str, post_id: str, emoji_name: str) -> bool:
        """React to a post unless it is gone: loopd deletes a status post when its turn ends,
        and the turn may end between the mirror seeing the post and the reaction reaching it."""
        try:
            await self.act("react_as", username=username, post_id=post_id, emoji_name=emoji_name)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404 and _names_a_missing_post(exc.response):
                return False
            raise
        return True

    async def fault(self, name: str, **kwargs: Any) -> Any:
        return await self._call("faults", name, **kwargs)

    async def faults_left(self) -> dict[str, Any]:
        response = await self._http.get("/_soak/faults")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def pull(self, mirror: Mirror) -> int:
        """New log entries into ``mirror``; how many."""
        response = await self._http.get("/_soak/log", params={"since": self.read_upto})
        response.raise_for_status()
        data = response.json()
        for raw in data["entries"]:
            mirror.apply(LogEntry.from_json(raw))
        self.read_upto = int(data["next"])
        return len(data["entries"])


async def bot_connected(control: FakeControl, bot_id: str) -> bool:
    """The bot has a live WebSocket on the fake (through brokerd's chat proxy)."""
    response = await control._http.get("/_fake/state")
    response.raise_for_status()
    return any(c["user_id"] == bot_id and c["active"] for c in response.json()["connections"])
