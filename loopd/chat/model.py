"""Mattermost objects as loopd reads them: typed, parsed once, tolerant of extra fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class WireFormatError(ValueError):
    """A server object did not have the shape the reference describes."""


def _str(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key, "")
    return value if isinstance(value, str) else ""


def _int(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key, 0)
    return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class Post:
    id: str
    user_id: str
    channel_id: str
    root_id: str = ""
    message: str = ""
    type: str = ""
    create_at: int = 0
    update_at: int = 0
    edit_at: int = 0
    delete_at: int = 0
    original_id: str = ""
    remote_id: str = ""
    props: dict[str, Any] = field(default_factory=dict)
    file_ids: tuple[str, ...] = ()
    # (user id, emoji name) of each reaction, where a REST read gave them (``metadata``).
    reactions: tuple[tuple[str, str], ...] = ()

    @property
    def thread_root(self) -> str:
        return self.root_id or self.id

    @classmethod
    def from_json(cls, raw: Any) -> Post:
        """A post from a REST object, or from an event's ``data.post`` (a JSON string)."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise WireFormatError(f"post is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or not _str(raw, "id") or not _str(raw, "channel_id"):
            raise WireFormatError(f"not a post: {str(raw)[:200]}")
        props = raw.get("props")
        files = raw.get("file_ids")
        return cls(
            id=_str(raw, "id"),
            user_id=_str(raw, "user_id"),
            channel_id=_str(raw, "channel_id"),
            root_id=_str(raw, "root_id"),
            message=_str(raw, "message"),
            type=_str(raw, "type"),
            create_at=_int(raw, "create_at"),
            update_at=_int(raw, "update_at"),
            edit_at=_int(raw, "edit_at"),
            delete_at=_int(raw, "delete_at"),
            original_id=_str(raw, "original_id"),
            remote_id=_str(raw, "remote_id"),
            props=props if isinstance(props, dict) else {},
            file_ids=tuple(f for f in files if isinstance(f, str))
            if isinstance(files, list)
            else (),
            reactions=_reactions(raw.get("metadata")),
        )


def _reactions(metadata: Any) -> tuple[tuple[str, str], ...]:
    listed = metadata.get("reactions") if isinstance(metadata, dict) else None
    if not isinstance(listed, list):
        return ()
    return tuple(
        (_str(r, "user_id"), _str(r, "emoji_name"))
        for r in listed
        if isinstance(r, dict) and _str(r, "user_id") and _str(r, "emoji_name")
    )


def posts_of(post_list: Any) -> list[Post]:
    """The posts of a PostList (``{"order": [...], "posts": {...}}``), oldest update first."""
    return PostList.from_json(post_list).by_update()


@dataclass(frozen=True)
class PostList:
    """``order`` names the posts the query matched (newest first); ``posts`` may hold more: the
    roots of matched replies, and, unless ``skipFetchThreads`` was set, whole threads."""

    order: tuple[str, ...]
    posts: dict[str, Post]

    @classmethod
    def from_json(cls, raw: Any) -> PostList:
        if not isinstance(raw, dict) or not isinstance(raw.get("posts"), dict):
            raise WireFormatError("not a post list")
        order = raw.get("order")
        posts = {post.id: post for post in map(Post.from_json, raw["posts"].values())}
        names = tuple(o for o in order if isinstance(o, str)) if isinstance(order, list) else ()
        return cls(names, posts)

    def matched(self) -> list[Post]:
        """The posts named in ``order`` (those the query itself matched)."""
        return [self.posts[i] for i in self.order if i in self.posts]

    def by_update(self) -> list[Post]:
        return sorted(self.posts.values(), key=lambda p: (p.update_at, p.id))

    def by_creation(self) -> list[Post]:
        return sorted(self.posts.values(), key=lambda p: (p.create_at, p.id))


@dataclass(frozen=True)
class Channel:
    id: str
    type: str  # O public, P private, D direct, G group
    name: str
    team_id: str = ""

    @property
    def is_direct(self) -> bool:
        return self.type == "D"

    @property
    def is_group(self) -> bool:
        return self.type == "G"

    @classmethod
    def from_json(cls, raw: Any) -> Channel:
        if not isinstance(raw, dict) or not _str(raw, "id"):
            raise WireFormatError(f"not a channel: {str(raw)[:200]}")
        return cls(_str(raw, "id"), _str(raw, "type"), _str(raw, "name"), _str(raw, "team_id"))


@dataclass(frozen=True)
class User:
    id: str
    username: str
    is_bot: bool = False

    @classmethod
    def from_json(cls, raw: Any) -> User:
        if not isinstance(raw, dict) or not _str(raw, "id"):
            raise WireFormatError(f"not a user: {str(raw)[:200]}")
        return cls(_str(raw, "id"), _str(raw, "username"), raw.get("is_bot") is True)


@dataclass(frozen=True)
class Team:
    id: str
    name: str


@dataclass(frozen=True)
class FileInfo:
    id: str
    name: str
    mime_type: str
    size: int

    @classmethod
    def from_json(cls, raw: Any) -> FileInfo:
        if not isinstance(raw, dict) or not _str(raw, "id"):
            raise WireFormatError(f"not a file info: {str(raw)[:200]}")
        return cls(_str(raw, "id"), _str(raw, "name"), _str(raw, "mime_type"), _int(raw, "size"))
