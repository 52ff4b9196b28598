"""WebSocket events and replies, built from the model and rendered per receiver.

An event is addressed by its ``broadcast`` (a channel, a user, or one connection, minus
``omit_users``). What differs per receiver (``mentions``) is applied when the frame is rendered
for one connection, as the real server's broadcast hooks do. Nested objects (``data.post``,
``data.reaction``, ``data.mentions``) are JSON *strings*, exactly as on the wire.
"""

import re
from dataclasses import dataclass, field
from typing import Any

from loopcommon.jsonbytes import dumps
from loopd_dev.fakes.mattermost.model import Channel, Post, Reaction, Team, User, World

_MENTION = re.compile(r"@([A-Za-z0-9.\-_]+)")
_CHANNEL_WIDE = frozenset({"channel", "all", "here"})


@dataclass(frozen=True)
class Broadcast:
    channel_id: str = ""
    user_id: str = ""
    team_id: str = ""
    connection_id: str = ""
    omit_users: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "omit_users": {u: True for u in sorted(self.omit_users)} or None,
            "user_id": self.user_id,
            "channel_id": self.channel_id,
            "team_id": self.team_id,
            "connection_id": self.connection_id,
            "omit_connection_id": "",
        }


@dataclass(frozen=True)
class WsEvent:
    event: str
    data: dict[str, Any]
    broadcast: Broadcast
    mentioned: frozenset[str] = field(default=frozenset())

    def render(self, seq: int, receiver_id: str) -> str:
        """The frame for one receiver, with its ``seq``."""
        data = dict(self.data)
        if receiver_id in self.mentioned:
            data["mentions"] = dumps([receiver_id])
        return dumps(
            {"event": self.event, "data": data, "broadcast": self.broadcast.to_json(), "seq": seq}
        )


@dataclass(frozen=True)
class WsReply:
    """A reply to a client action: ``seq_reply``, never ``seq``."""

    seq_reply: int
    status: str = "OK"
    data: dict[str, Any] | None = None
    error: dict[str, str] | None = None

    def render(self) -> str:
        body: dict[str, Any] = {"status": self.status, "seq_reply": self.seq_reply}
        if self.data is not None:
            body["data"] = self.data
        if self.error is not None:
            body["error"] = self.error
        return dumps(body)


def mentioned_users(world: World, channel: Channel, author: User, message: str) -> frozenset[str]:
    """Who the server would list in ``mentions``: in a DM the other member; elsewhere members
    named as ``@username`` (trailing ``.-_:`` trimmed) or everyone on ``@channel``/``@all``/
    ``@here``; never the author."""
    if channel.type == "D":
        return frozenset(channel.members - {author.id})
    names = {m.group(1).rstrip(".-_:").lower() for m in _MENTION.finditer(message)}
    if names & _CHANNEL_WIDE:
        return frozenset(channel.members - {author.id})
    ids = {u.id for u in world.users.values() if u.username.lower() in names}
    return frozenset((ids & channel.members) - {author.id})


def _post_event(kind: str, world: World, post: Post, extra: dict[str, Any]) -> WsEvent:
    return WsEvent(
        kind,
        {"post": dumps(world.post_json(post)), **extra},
        Broadcast(channel_id=post.channel_id),
    )


def posted(world: World, post: Post, author: User) -> WsEvent:
    channel = world.channel(post.channel_id)
    team: Team | None = world.teams.get(channel.team_id)
    base = _post_event("posted", world, post, {})
    data = {
        **base.data,
        "channel_type": channel.type,
        "channel_name": channel.name,
        "channel_display_name": channel.display_name,
        "sender_name": f"@{author.username}",
        "team_id": team.id if team else "",
        "set_online": True,
    }
    if post.file_ids:
        data["otherFile"] = "true"
    return WsEvent(
        "posted",
        data,
        base.broadcast,
        mentioned=mentioned_users(world, channel, author, post.message),
    )


def post_edited(world: World, post: Post) -> WsEvent:
    return _post_event("post_edited", world, post, {})


def post_deleted(world: World, post: Post) -> WsEvent:
    # The server sends a sanitized copy to users and a full one (with delete_by) to admins;
    # the fake has no admins, so every connection gets the users' copy.
    return _post_event("post_deleted", world, post, {})


def reaction_event(kind: str, reaction: Reaction) -> WsEvent:
    return WsEvent(
        kind,
        {"reaction": dumps(reaction.to_json())},
        Broadcast(channel_id=reaction.channel_id),
    )


def typing(channel_id: str, user_id: str, parent_id: str) -> WsEvent:
    return WsEvent(
        "typing",
        {"parent_id": parent_id, "user_id": user_id},
        Broadcast(channel_id=channel_id, omit_users=frozenset({user_id})),
    )


def hello(server_version: str, connection_id: str, user_id: str) -> WsEvent:
    return WsEvent(
        "hello",
        {
            "server_version": server_version,
            "connection_id": connection_id,
            "server_hostname": "fake-mattermost",
        },
        Broadcast(user_id=user_id),
    )


def status_change(user_id: str, status: str) -> WsEvent:
    return WsEvent(
        "status_change", {"status": status, "user_id": user_id}, Broadcast(user_id=user_id)
    )


def channel_viewed(user_id: str, channel_id: str) -> WsEvent:
    return WsEvent("channel_viewed", {"channel_id": channel_id}, Broadcast(user_id=user_id))
