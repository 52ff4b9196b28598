"""Where the box may act in Mattermost: the teams, channels and users brokerd's config allows.

The bot may belong to many teams and channels; the box may post (and edit the bot's posts) only
where brokerd's config says: a channel listed by id, any channel of a listed team, or a direct or
group message whose other members are all allowed users (their channel ids cannot be listed in
advance). Everything else gets 403. ``*`` in a list allows every team, channel or user. Reading
is not filtered: the policy bounds where the box can speak, and the bot's read access is
Mattermost's to grant.

The decisions are pure (``channel_refusal``); ``ChannelGuard`` looks up what they need (the
channel, a group message's members, a post's channel and author, the bot's own id) with the bot
token, and remembers the answers, which do not change: a channel never moves to another team,
and a direct or group message never changes its members.
"""

import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import httpx

from brokerd.errors import BrokerdError
from brokerd.proxy.forward import Refused
from brokerd.proxy.upstream import Upstream

ANY: Final = "*"
MATTERMOST_ID: Final = re.compile(r"[a-z0-9]{26}")
CACHE_SIZE: Final = 4096
MEMBERS_PAGE: Final = 200  # a group message has at most 8 members


def valid_entry(entry: str) -> bool:
    """A policy entry is ``*`` or a Mattermost id (26 lower-case letters and digits)."""
    return entry == ANY or MATTERMOST_ID.fullmatch(entry) is not None


@dataclass(frozen=True)
class ChatPolicy:
    """Ids (or ``*``) of the teams, channels and users the box may act with."""

    teams: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()

    @classmethod
    def everyone(cls) -> "ChatPolicy":
        return cls(frozenset({ANY}), frozenset({ANY}), frozenset({ANY}))

    @classmethod
    def of(
        cls, teams: Iterable[str] = (), channels: Iterable[str] = (), users: Iterable[str] = ()
    ) -> "ChatPolicy":
        return cls(frozenset(teams), frozenset(channels), frozenset(users))

    def users_allowed(self, users: Iterable[str]) -> bool:
        return ANY in self.users or set(users) <= self.users


@dataclass(frozen=True)
class ChannelFacts:
    """What the policy needs of a channel (from ``GET /channels/{id}``)."""

    id: str
    type: str  # O public, P private, D direct, G group
    team_id: str
    name: str

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "ChannelFacts":
        return cls(*(str(raw.get(key) or "") for key in ("id", "type", "team_id", "name")))


def direct_members(channel: ChannelFacts) -> frozenset[str]:
    """A direct message's two user ids, from its name ``<id>__<id>``."""
    return frozenset(part for part in channel.name.split("__") if part)


def channel_refusal(
    policy: ChatPolicy, channel: ChannelFacts, members: frozenset[str], bot_id: str
) -> str | None:
    """Why the box may not act in ``channel``, or None when it may. ``members`` are the user ids
    of a direct or group message (ignored for other channels)."""
    if ANY in policy.channels or channel.id in policy.channels:
        return None
    if channel.type in ("O", "P"):
        if ANY in policy.teams or channel.team_id in policy.teams:
            return None
        return (
            f"channel {channel.id} (team {channel.team_id}) is in neither brokerd's "
            "chat_allowed_channels nor a team of chat_allowed_teams"
        )
    if channel.type in ("D", "G"):
        others = members - {bot_id}
        kind = "direct" if channel.type == "D" else "group"
        if others and policy.users_allowed(others):
            return None
        return (
            f"the {kind} message {channel.id} has members that brokerd's chat_allowed_users "
            "does not list"
        )
    return f"channel {channel.id} has an unknown type {channel.type!r}"


Key = TypeVar("Key")
Value = TypeVar("Value")


class Remembered(Generic[Key, Value]):
    """A small least-recently-used map, so the lookups cost memory only within bounds."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[Key, Value] = OrderedDict()

    def get(self, key: Key) -> Value | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Key, value: Value) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class LookupFailed(BrokerdError):
    """Mattermost did not answer a lookup; the request is answered 502 (it can be retried)."""


@dataclass(frozen=True)
class PostFacts:
    channel_id: str
    user_id: str


class ChannelGuard:
    """Checks each write of the box against the policy, looking up what it needs upstream."""

    def __init__(
        self, policy: ChatPolicy, upstream: Upstream, client: httpx.AsyncClient, bot_token: str
    ) -> None:
        self.policy = policy
        self.upstream = upstream
        self.client = client
        self._headers = {"Authorization": f"Bearer {bot_token}"}
        self._bot_id: str | None = None
        self._verdicts: Remembered[str, str] = Remembered()  # channel id -> refusal or ""
        self._posts: Remembered[str, PostFacts] = Remembered()

    async def check_post(self, body: bytes) -> Refused | None:
        """``POST /posts``: the channel named in the body."""
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError):
            return Refused(400, "the post is not a JSON object")
        channel_id = raw.get("channel_id") if isinstance(raw, dict) else None
        if not isinstance(channel_id, str) or not MATTERMOST_ID.fullmatch(channel_id):
            return Refused(400, "the post names no channel_id")
        return await self._check_channel(channel_id)

    async def check_edit(self, post_id: str) -> Refused | None:
        """``PUT /posts/{id}/patch``: the post's channel, and only the bot's own post."""
        try:
            post = await self._post(post_id)
            bot_id = await self._bot()
        except LookupFailed as exc:
            return Refused(502, str(exc))
        if post is None:
            return Refused(403, f"post {post_id} is not visible to the bot")
        if post.user_id != bot_id:
            return Refused(403, f"post {post_id} is not the bot's own; the box edits only those")
        return await self._check_channel(post.channel_id)

    async def _check_channel(self, channel_id: str) -> Refused | None:
        verdict = self._verdicts.get(channel_id)
        if verdict is None:
            try:
                verdict, lasting = await self._verdict(channel_id)
            except LookupFailed as exc:
                return Refused(502, str(exc))
            if lasting:
                self._verdicts.put(channel_id, verdict)
        return Refused(403, f"brokerd refuses to act there: {verdict}") if verdict else None

    async def _verdict(self, channel_id: str) -> tuple[str, bool]:
        """The refusal ("" to allow), and whether it holds for good (the bot may be added to a
        channel it cannot see yet)."""
        if ANY in self.policy.channels or channel_id in self.policy.channels:
            return "", True
        raw = await self._get(f"/api/v4/channels/{channel_id}")
        if raw is None:
            return f"channel {channel_id} is not visible to the bot", False
        if not isinstance(raw, dict):
            raise LookupFailed(f"cannot read channel {channel_id}: not a JSON object")
        channel = ChannelFacts.from_json(raw)
        members: frozenset[str] = frozenset()
        if channel.type == "D":
            members = direct_members(channel)
        elif channel.type == "G":
            members = await self._members(channel_id)
        bot_id = await self._bot() if channel.type in ("D", "G") else ""
        return channel_refusal(self.policy, channel, members, bot_id) or "", True

    async def _members(self, channel_id: str) -> frozenset[str]:
        path = f"/api/v4/channels/{channel_id}/members?page=0&per_page={MEMBERS_PAGE}"
        raw = await self._get(path)
        if not isinstance(raw, list):
            raise LookupFailed(f"cannot read the members of {channel_id}")
        return frozenset(str(m.get("user_id", "")) for m in raw if isinstance(m, dict))

    async def _post(self, post_id: str) -> PostFacts | None:
        post = self._posts.get(post_id)
        if post is None:
            raw = await self._get(f"/api/v4/posts/{post_id}")
            if not isinstance(raw, dict):
                return None
            post = PostFacts(str(raw.get("channel_id", "")), str(raw.get("user_id", "")))
            self._posts.put(post_id, post)
        return post

    async def _bot(self) -> str:
        if self._bot_id is None:
            raw = await self._get("/api/v4/users/me")
            bot_id = raw.get("id") if isinstance(raw, dict) else None
            if not isinstance(bot_id, str) or not bot_id:
                raise LookupFailed("cannot learn the bot's own user id")
            self._bot_id = bot_id
        return self._bot_id

    async def _get(self, target: str) -> Any:
        """The JSON answer, None for 403/404 (not visible to the bot); ``LookupFailed`` else."""
        path, _, query = target.partition("?")
        url = self.upstream.url(path, query.encode())
        try:
            response = await self.client.get(url, headers=self._headers)
        except httpx.HTTPError as exc:
            raise LookupFailed(f"cannot check the channel: {type(exc).__name__}") from exc
        if response.status_code in (403, 404):
            return None
        if response.status_code != 200:
            status = response.status_code
            raise LookupFailed(f"cannot check the channel: Mattermost answered {status}")
        try:
            return response.json()
        except ValueError:
            raise LookupFailed("cannot check the channel: the answer is not JSON") from None
