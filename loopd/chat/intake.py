"""Which posts loopd acts on, and how: a pure decision per post.

The same rule runs on WebSocket events and on REST catch-up, so a post decides the same way
whichever path brings it. Mention detection works on the text (REST has no ``mentions`` field):
a word equal to ``@username`` once ``.-_:`` are trimmed from its ends, outside code spans and
fenced code blocks.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from loopd.chat.model import Channel, Post, User

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?$(.*?)(^ {0,3}\1[`~]*[ \t]*$|\Z)", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_TRIM = ".-_:,;!?()[]{}\"'"


class Action(StrEnum):
    IGNORE = "ignore"  # not for loopd (reason says why)
    START = "start"  # a new thread for loopd
    REPLY = "reply"  # a later message in a thread loopd is in
    STOP = "stop"  # the stop word in a thread loopd is in
    EDIT_NOTICE = "edit_notice"  # an edit of a post loopd already read
    REFUSE = "refuse"  # addressed to loopd by someone (or somewhere) not allowed


@dataclass(frozen=True)
class PostDecision:
    """``outsiders``: for a refusal, the usernames that are not allowed (the author, or the
    members of a group message), so the refusal names them without parsing ``reason``."""

    action: Action
    reason: str
    root_id: str = ""
    outsiders: tuple[str, ...] = ()


@dataclass(frozen=True)
class Allowlist:
    """Whom and where loopd answers. Empty means nobody; ``*`` means everyone or everywhere."""

    users: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, users: Collection[str], teams: Collection[str], channels: Collection[str]
    ) -> Allowlist:
        return cls(frozenset(users), frozenset(teams), frozenset(channels))

    def allows_user(self, user: User) -> bool:
        return bool({"*", user.id, user.username} & self.users)

    def allows_channel(
        self, channel: Channel, team_name: str = "", group_outsiders: Collection[str] = ()
    ) -> bool:
        """``group_outsiders``: for a group message, its members who are not allowed users."""
        if channel.is_direct:
            return True  # a DM is as allowed as the person in it
        if {"*", channel.id, channel.name} & self.channels:
            return True
        if channel.is_group:
            # A group message has no team: it is as allowed as the people in it, all of them.
            return not group_outsiders
        return bool({"*", channel.team_id, team_name} & self.teams - {""})


def strip_code(text: str) -> str:
    """The text without fenced blocks and code spans (they are replaced by a space)."""
    return CODE_SPAN.sub(" ", _FENCE.sub(" ", text))


def mentions(text: str, username: str) -> bool:
    """True if ``@username`` appears as a word outside code."""
    target = f"@{username}".lower()
    return any(word.strip(_TRIM).lower() == target for word in strip_code(text).split())


def is_stop(text: str, stop_word: str, bot_username: str) -> bool:
    """The post is only the stop word, alone or after a mention of the bot (any case). A stop
    word addressed to someone else ("@bob stop") is not meant for loopd."""
    words = [w.strip(_TRIM).lower() for w in text.split()]
    named = {w for w in words if w.startswith("@")}
    rest = [w for w in words if w and not w.startswith("@")]
    return rest == [stop_word.lower()] and named <= {f"@{bot_username.lower()}"}


def decide(
    post: Post,
    *,
    channel: Channel,
    author: User,
    bot: User,
    allow: Allowlist,
    team_name: str = "",
    thread_known: bool,
    post_known: bool,
    stop_word: str = "stop",
    replies_need_mention: bool = False,
    group_outsiders: Collection[str] = (),
) -> PostDecision:
    """What to do with ``post``. ``thread_known``: loopd has a session for the post's thread;
    ``post_known``: this post id is already stored; ``replies_need_mention``: the thread policy
    ``mentions`` (channel threads answer only replies that mention the bot); ``group_outsiders``:
    for a group message, the members who are not allowed."""
    skip = _not_a_user_post(post, author, bot)
    if skip is not None:
        return PostDecision(Action.IGNORE, skip)
    root = post.thread_root
    if post_known:
        if post.edit_at > 0:
            return PostDecision(Action.EDIT_NOTICE, "edit of a post already read", root)
        return PostDecision(Action.IGNORE, "already stored")
    in_thread = bool(post.root_id) and thread_known
    mentioned = mentions(post.message, bot.username)
    addressed = channel.is_direct or mentioned
    stop = in_thread and is_stop(post.message, stop_word, bot.username)
    if in_thread and replies_need_mention and not (addressed or stop):
        return PostDecision(Action.IGNORE, "a reply without a mention (thread policy: mentions)")
    if not (in_thread or addressed):
        return PostDecision(Action.IGNORE, "not addressed to the bot")
    if not allow.allows_user(author):
        if addressed:
            return PostDecision(
                Action.REFUSE, f"@{author.username} is not allowed", root, (author.username,)
            )
        return PostDecision(Action.IGNORE, f"@{author.username} is not allowed")
    if not allow.allows_channel(channel, team_name, group_outsiders):
        if channel.is_group:
            outsiders = tuple(sorted(group_outsiders))
            names = ", ".join(f"@{name}" for name in outsiders)
            reason = f"group message with members not allowed: {names}"
            return PostDecision(Action.REFUSE, reason, root, outsiders)
        return PostDecision(Action.REFUSE, f"channel {channel.name} is not allowed", root)
    if stop:
        return PostDecision(Action.STOP, f"stop requested by @{author.username}", root)
    if in_thread or (thread_known and not post.root_id):
        return PostDecision(Action.REPLY, "a message in a thread of the bot", root)
    return PostDecision(
        Action.START, "a direct message" if channel.is_direct else "a mention", root
    )


def _not_a_user_post(post: Post, author: User, bot: User) -> str | None:
    if post.user_id == bot.id:
        return "the bot's own post"
    if post.type.startswith("system_"):
        return f"a system post ({post.type})"
    if post.delete_at > 0:
        return "deleted"
    if post.original_id:
        return "an edit-history row"
    if post.remote_id:
        return "a post from a shared channel"
    if post.props.get("from_webhook") or post.props.get("from_bot") or author.is_bot:
        return "a webhook or bot post"
    return None
