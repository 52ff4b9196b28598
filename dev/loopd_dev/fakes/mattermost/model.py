"""The fake's in-memory world: users, teams, channels, posts, reactions and files.

Pure data and rules, no I/O. Every rule that the REST layer and the control API share lives
here, with the real server's error ids, so both paths fail the same way. Times come from an
injected clock. Post times are kept strictly increasing, so ordering by ``create_at`` is total
(the real server can tie; a fake that ties would make tests flaky, not more faithful).
"""

import hashlib
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from loopcommon.jsonbytes import dumps
from loopd_dev.fakes.mattermost.clock import Clock
from loopd_dev.fakes.mattermost.errors import AppError, forbidden, invalid_param, not_found

# Mattermost's id alphabet (model.NewId: base32 with this encoding, padding stripped).
_ID_ALPHABET = "ybndrfg8ejkmcpqxot1uwisza345h769"
_EMOJI_NAME = re.compile(r"^[a-zA-Z0-9\-+_]{1,64}$")
# Props an integration may not set; the real server strips them (Post.SanitizeProps and friends).
_FORBIDDEN_PROPS = frozenset(
    {
        "from_webhook",
        "override_username",
        "override_icon_url",
        "override_icon_emoji",
        "webhook_display_name",
        "mm_blocks_actions",
    }
)
MAX_PROPS_RUNES = 800_000
MAX_FILE_IDS_RUNES = 300
SINCE_CAP = 1000

ChannelType = Literal["O", "P", "D", "G"]


def new_id() -> str:
    """A fresh 26-character id in the server's alphabet."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(26))


def is_valid_id(value: str) -> bool:
    """The server's ``model.IsValidId``: 26 ASCII letters or digits."""
    return len(value) == 26 and value.isascii() and value.isalnum()


@dataclass
class User:
    id: str
    username: str
    token: str
    is_bot: bool = False
    first_name: str = ""
    last_name: str = ""
    password: str = ""  # humans only: bots cannot log in with a password

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "create_at": 0,
            "update_at": 0,
            "delete_at": 0,
            "username": self.username,
            "first_name": self.first_name,
            "last_name": self.last_name,
            "nickname": "",
            "email": f"{self.username}@example.invalid",
            "auth_service": "",
            "roles": "system_user" if not self.is_bot else "system_user system_post_all",
            "locale": "en",
            "is_bot": self.is_bot,
            "bot_description": "loopd fake bot" if self.is_bot else "",
        }


@dataclass
class Team:
    id: str
    name: str
    display_name: str
    members: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "display_name": self.display_name, "type": "O"}


@dataclass
class Channel:
    id: str
    team_id: str
    type: ChannelType
    name: str
    display_name: str
    members: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "create_at": 0,
            "update_at": 0,
            "delete_at": 0,
            "team_id": self.team_id,
            "type": self.type,
            "display_name": self.display_name,
            "name": self.name,
            "header": "",
            "purpose": "",
            "creator_id": "",
        }

    def member_json(self, user_id: str) -> dict[str, Any]:
        """``model.ChannelMember`` (the fields a client reads)."""
        return {
            "channel_id": self.id,
            "user_id": user_id,
            "roles": "channel_user",
            "last_viewed_at": 0,
            "msg_count": 0,
            "mention_count": 0,
            "notify_props": {"desktop": "default", "mark_unread": "all"},
            "last_update_at": 0,
            "scheme_guest": False,
            "scheme_user": True,
            "scheme_admin": False,
        }


@dataclass
class Post:
    id: str
    create_at: int
    update_at: int
    user_id: str
    channel_id: str
    message: str
    root_id: str = ""
    edit_at: int = 0
    delete_at: int = 0
    original_id: str = ""
    type: str = ""
    props: dict[str, Any] = field(default_factory=dict)
    file_ids: list[str] = field(default_factory=list)
    pending_post_id: str = ""
    is_pinned: bool = False
    has_reactions: bool = False

    def to_json(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "create_at": self.create_at,
            "update_at": self.update_at,
            "edit_at": self.edit_at,
            "delete_at": self.delete_at,
            "is_pinned": self.is_pinned,
            "user_id": self.user_id,
            "channel_id": self.channel_id,
            "root_id": self.root_id,
            "original_id": self.original_id,
            "message": self.message,
            "type": self.type,
            "props": dict(self.props),
            "hashtags": "",
            "file_ids": list(self.file_ids),
            "pending_post_id": self.pending_post_id,
            "has_reactions": self.has_reactions,
            "remote_id": "",
            "reply_count": 0,
            "last_reply_at": 0,
            "metadata": metadata if metadata is not None else {},
        }


@dataclass
class Reaction:
    user_id: str
    post_id: str
    emoji_name: str
    create_at: int
    channel_id: str

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "post_id": self.post_id,
            "emoji_name": self.emoji_name,
            "create_at": self.create_at,
            "update_at": self.create_at,
            "delete_at": 0,
            "remote_id": "",
            "channel_id": self.channel_id,
        }


@dataclass
class StoredFile:
    id: str
    user_id: str
    channel_id: str
    name: str
    mime_type: str
    content: bytes
    create_at: int
    post_id: str = ""

    def to_json(self) -> dict[str, Any]:
        extension = self.name.rsplit(".", 1)[1].lower() if "." in self.name else ""
        return {
            "id": self.id,
            "user_id": self.user_id,
            "post_id": self.post_id,
            "channel_id": self.channel_id,
            "create_at": self.create_at,
            "update_at": self.create_at,
            "delete_at": 0,
            "name": self.name,
            "extension": extension,
            "size": len(self.content),
            "mime_type": self.mime_type,
            "width": 0,
            "height": 0,
            "has_preview_image": False,
            "mini_preview": None,
            "remote_id": "",
            "archived": False,
        }


@dataclass(frozen=True)
class PostList:
    """``model.PostList``: ``order`` (newest first) names the posts the query matched; ``posts``
    may hold more (thread roots and siblings), as the real server's does."""

    order: list[str]
    posts: dict[str, Post]
    next_post_id: str = ""
    prev_post_id: str = ""
    has_next: bool | None = None

    def to_json(self, world: "World") -> dict[str, Any]:
        body: dict[str, Any] = {
            "order": self.order,
            "posts": {pid: world.post_json(p) for pid, p in self.posts.items()},
            "next_post_id": self.next_post_id,
            "prev_post_id": self.prev_post_id,
        }
        if self.has_next is not None:
            body["has_next"] = self.has_next
        return body


@dataclass(frozen=True)
class CreateResult:
    post: Post
    created: bool  # False when pending_post_id deduplication returned an earlier post


@dataclass(frozen=True)
class Patch:
    """``model.PostPatch``: ``None`` means "keep"; ``props`` replaces the whole map."""

    message: str | None = None
    props: dict[str, Any] | None = None
    file_ids: list[str] | None = None
    is_pinned: bool | None = None
    has_reactions: bool | None = None


@dataclass
class World:
    """All server state that survives a restart of the fake's connections."""

    clock: Clock
    max_post_size: int = 16383
    dedup_ttl_s: float = 30.0
    edit_time_limit_s: int = -1
    update_at_skew_ms: int = 0
    users: dict[str, User] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    channels: dict[str, Channel] = field(default_factory=dict)
    posts: dict[str, Post] = field(default_factory=dict)  # insertion order = storage order
    reactions: list[Reaction] = field(default_factory=list)
    files: dict[str, StoredFile] = field(default_factory=dict)
    # pending_post_id -> (post id, expiry); the post id is "" while the first create is still
    # in flight (deduplicateCreatePost's unknownPostId).
    _dedup: dict[str, tuple[str, float]] = field(default_factory=dict)
    _last_ms: int = 0

    # ----- setup -----

    def add_user(self, username: str, token: str, *, is_bot: bool = False) -> User:
        password = "" if is_bot else f"{username}-password"
        user = User(id=new_id(), username=username, token=token, is_bot=is_bot, password=password)
        self.users[user.id] = user
        return user

    def add_team(self, name: str, display_name: str, members: Iterable[User] = ()) -> Team:
        team = Team(id=new_id(), name=name, display_name=display_name)
        team.members = {m.id for m in members}
        self.teams[team.id] = team
        return team

    def add_group_channel(self, members: Sequence[User]) -> Channel:
        """A group message (3 to 8 people, no team): named, as the server does, by the sha1 of
        its sorted member ids; shown by the members' usernames."""
        ids = sorted(m.id for m in members)
        if not 3 <= len(ids) <= 8:
            raise AppError("api.channel.create_group.bad_size.app_error", "3 to 8 members.", 400)
        channel = self.add_channel(None, "G", hashlib.sha1("".join(ids).encode()).hexdigest(), ())
        channel.members = set(ids)
        channel.display_name = ", ".join(sorted(m.username for m in members))
        return channel

    def add_channel(
        self, team: Team | None, kind: ChannelType, name: str, members: Iterable[User]
    ) -> Channel:
        channel = Channel(
            id=new_id(),
            team_id=team.id if team else "",
            type=kind,
            name=name,
            display_name=name.replace("-", " ").title() if kind in ("O", "P") else "",
            members={m.id for m in members},
        )
        self.channels[channel.id] = channel
        return channel

    def add_direct_channel(self, a: User, b: User) -> Channel:
        """A DM; its name is the two user ids, sorted, joined by ``__``."""
        name = "__".join(sorted((a.id, b.id)))
        return self.add_channel(None, "D", name, (a, b))

    # ----- lookups -----

    def user_by_token(self, token: str) -> User | None:
        return next((u for u in self.users.values() if token and u.token == token), None)

    def user_by_name(self, name_or_id: str) -> User:
        for user in self.users.values():
            if name_or_id in (user.id, user.username):
                return user
        raise not_found("user")

    def channel_by_name(self, name_or_id: str) -> Channel:
        for channel in self.channels.values():
            if name_or_id in (channel.id, channel.name):
                return channel
        raise not_found("channel")

    def resolve_user(self, user_id: str, session_user: User) -> User:
        """A path's user id, where ``me`` means the caller."""
        if user_id == "me":
            return session_user
        user = self.users.get(user_id)
        if user is None:
            raise not_found("user")
        return user

    def channel(self, channel_id: str) -> Channel:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise not_found("channel")
        return channel

    def member_channel(self, channel_id: str, user: User) -> Channel:
        """The channel, or 403 when ``user`` is not a member (the permission check)."""
        channel = self.channel(channel_id)
        if user.id not in channel.members:
            raise forbidden()
        return channel

    def readable_channel(self, channel_id: str, user: User) -> Channel:
        channel = self.channel(channel_id)
        if channel.type != "O" and user.id not in channel.members:
            raise forbidden()
        return channel

    def channels_of(self, user: User) -> list[Channel]:
        return [c for c in self.channels.values() if user.id in c.members]

    def teams_of(self, user: User) -> list[Team]:
        return [t for t in self.teams.values() if user.id in t.members]

    def channel_members(self, channel_id: str, user: User, page: int, per_page: int) -> list[Any]:
        """``GET /channels/{id}/members``: readable channels only."""
        channel = self.readable_channel(channel_id, user)
        members = sorted(channel.members)[page * per_page : (page + 1) * per_page]
        return [channel.member_json(member) for member in members]

    def login(self, login_id: str, password: str) -> User:
        """``POST /users/login`` with a username and password (humans only)."""
        user = next((u for u in self.users.values() if login_id == u.username), None)
        if user is None or user.is_bot or not password or password != user.password:
            raise AppError(
                "api.user.login.invalid_credentials_email_username",
                "Enter a valid email or username and/or password.",
                401,
            )
        return user

    def live_post(self, post_id: str) -> Post:
        """A post that exists and is not deleted; history rows count as deleted."""
        post = self.posts.get(post_id)
        if post is None or post.delete_at:
            raise not_found("post")
        return post

    def visible_post(self, post_id: str, user: User) -> Post:
        post = self.live_post(post_id)
        self.member_channel(post.channel_id, user)
        return post

    def post_json(self, post: Post) -> dict[str, Any]:
        files = [self.files[f].to_json() for f in post.file_ids if f in self.files]
        reactions = [r.to_json() for r in self.reactions if r.post_id == post.id]
        metadata: dict[str, Any] = {}
        if files:
            metadata["files"] = files
        if reactions:
            metadata["reactions"] = reactions
        return post.to_json(metadata)

    # ----- time -----

    def _tick(self) -> int:
        """Now in ms, strictly after the last time handed out."""
        self._last_ms = max(self.clock.now_ms(), self._last_ms + 1)
        return self._last_ms

    def _skewed(self, ms: int) -> int:
        return ms + self.update_at_skew_ms

    # ----- posts -----

    def create_post(
        self,
        author: User,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
        file_ids: Sequence[str] = (),
        pending_post_id: str = "",
        post_type: str = "",
    ) -> CreateResult:
        channel = self.member_channel(channel_id, author)
        earlier = self._deduplicated(pending_post_id)
        if earlier is not None:
            return CreateResult(earlier, created=False)
        if pending_post_id:  # in flight until the create returns (see finish_create)
            self._dedup[pending_post_id] = ("", self.clock.monotonic() + self.dedup_ttl_s)
        root = self._check_root(root_id, channel) if root_id else None
        clean_props = {k: v for k, v in (props or {}).items() if k not in _FORBIDDEN_PROPS}
        if author.is_bot:
            clean_props["from_bot"] = "true"
        self._check_sizes(message, clean_props, list(file_ids))
        attached = self._claim_files(author, channel, file_ids)
        now = self._tick()
        post = Post(
            id=new_id(),
            create_at=now,
            update_at=self._skewed(now),
            user_id=author.id,
            channel_id=channel.id,
            root_id=root_id,
            message=message,
            type=post_type,
            props=clean_props,
            file_ids=[f.id for f in attached],
            pending_post_id=pending_post_id,
        )
        for stored in attached:
            stored.post_id = post.id
        self.posts[post.id] = post
        if root is not None:
            # SaveMultiple: "UPDATE Posts SET UpdateAt = <reply create_at> WHERE Id = <root>".
            root.update_at = self._skewed(now)
        return CreateResult(post, created=True)

    def finish_create(self, post: Post) -> None:
        """The create of ``post`` returned: a retry with its pending_post_id now gets it (until
        the TTL). Until then a retry is answered 500 ``...deduplicate_create_post.pending``."""
        if post.pending_post_id:
            expires = self.clock.monotonic() + self.dedup_ttl_s
            self._dedup[post.pending_post_id] = (post.id, expires)

    def forget_dedup_cache(self) -> None:
        """The dedup cache lives in server memory: a restart empties it."""
        self._dedup.clear()

    def _deduplicated(self, pending_post_id: str) -> Post | None:
        if not pending_post_id:
            return None
        entry = self._dedup.get(pending_post_id)
        if entry is None:
            return None
        post_id, expires = entry
        if self.clock.monotonic() >= expires:
            del self._dedup[pending_post_id]
            return None
        if not post_id:
            raise AppError(
                "api.post.deduplicate_create_post.pending",
                "Rejecting the post because it is still pending creation.",
                500,
            )
        return self.posts.get(post_id)

    def _check_root(self, root_id: str, channel: Channel) -> Post:
        root = self.posts.get(root_id)
        if root is None or root.delete_at or root.root_id or root.channel_id != channel.id:
            raise AppError(
                "api.post.create_post.root_id.app_error", "Invalid RootId parameter.", 400
            )
        return root

    def _check_sizes(self, message: str, props: dict[str, Any], file_ids: list[str]) -> None:
        # len() of a str counts code points, which is what Go's utf8.RuneCountInString counts.
        if len(message) > self.max_post_size:
            raise AppError(
                "model.post.is_valid.message_length.app_error",
                f"Message must be {self.max_post_size} characters or less.",
                400,
                f"len={len(message)}",
            )
        if len(dumps(props)) > MAX_PROPS_RUNES:
            raise AppError("model.post.is_valid.props.app_error", "Invalid props.", 400)
        if len(dumps(file_ids)) > MAX_FILE_IDS_RUNES:
            raise AppError("model.post.is_valid.file_ids.app_error", "Invalid file ids.", 400)

    def _claim_files(
        self, author: User, channel: Channel, file_ids: Sequence[str]
    ) -> list[StoredFile]:
        claimed = []
        for file_id in file_ids:
            stored = self.files.get(file_id)
            # The real server silently drops ids it cannot attach; so does the fake.
            if (
                stored
                and stored.user_id == author.id
                and stored.channel_id == channel.id
                and not stored.post_id
            ):
                claimed.append(stored)
        return claimed

    def patch_post(self, actor: User, post_id: str, patch: Patch) -> Post:
        existing = self.posts.get(post_id)
        if existing is not None and existing.delete_at and existing.original_id == "":
            # Real Mattermost checks the permission on the post's channel first, and a deleted
            # post has none: a deleted post answers 403, not 404.
            raise forbidden()
        post = self.live_post(post_id)
        self.member_channel(post.channel_id, actor)
        if post.user_id != actor.id:
            raise forbidden()  # a bot has no edit_others_posts permission
        message_changes = patch.message is not None and patch.message != post.message
        now = self._tick()
        if (
            message_changes
            and self.edit_time_limit_s != -1
            and now > post.create_at + self.edit_time_limit_s * 1000
        ):
            raise AppError(
                "api.post.update_post.permissions_time_limit.app_error",
                f"Post edit is only allowed for {self.edit_time_limit_s} seconds.",
                400,
            )
        new_message = patch.message if patch.message is not None else post.message
        new_props = dict(patch.props) if patch.props is not None else dict(post.props)
        if actor.is_bot:
            new_props["from_bot"] = "true"
        self._check_sizes(new_message, new_props, patch.file_ids or post.file_ids)
        history = replace(
            post,
            id=new_id(),
            original_id=post.id,
            delete_at=self._skewed(now),
            update_at=self._skewed(now),
            props=dict(post.props),
            file_ids=list(post.file_ids),
        )
        post.message = new_message
        post.props = new_props
        if patch.file_ids is not None:
            post.file_ids = list(patch.file_ids)
        if patch.is_pinned is not None:
            post.is_pinned = patch.is_pinned
        if patch.has_reactions is not None:
            post.has_reactions = patch.has_reactions
        if message_changes:
            post.edit_at = now
        post.update_at = self._skewed(now)
        self.posts[history.id] = history
        self._bump_root(post, now)
        return post

    def _bump_root(self, post: Post, now: int) -> None:
        if post.root_id and post.root_id in self.posts:
            root = self.posts[post.root_id]
            root.update_at = max(root.update_at, self._skewed(now))

    def delete_post(self, actor: User, post_id: str) -> Post:
        """Soft-delete a post and, for a root, its replies (one ``UPDATE ... OR RootId = ?``)."""
        post = self.live_post(post_id)
        self.member_channel(post.channel_id, actor)
        if post.user_id != actor.id:
            raise forbidden()
        now = self._tick()
        for candidate in self.posts.values():
            in_thread = candidate.id == post.id or candidate.root_id == post.id
            if in_thread and not candidate.delete_at and not candidate.original_id:
                candidate.delete_at = now
                candidate.update_at = self._skewed(now)
        post.props = {**post.props, "deleteBy": actor.id}
        return post

    # ----- reading posts -----

    def thread(self, post_id: str, user: User) -> PostList:
        post = self.visible_post(post_id, user)
        root_id = post.root_id or post.id
        members = [
            p
            for p in self.posts.values()
            if not p.delete_at and (p.id == root_id or p.root_id == root_id)
        ]
        members.sort(key=lambda p: p.create_at, reverse=True)
        return PostList([p.id for p in members], {p.id: p for p in members}, has_next=False)

    def posts_since(self, channel: Channel, since: int) -> PostList:
        """``GetPostsSince`` (non-CRT): rows with ``update_at > since``, deleted rows and edit
        history rows included, capped at 1000 in storage order (so not necessarily the newest),
        plus the roots of those rows; ``order`` lists only the rows past ``since``."""
        matched = [
            p for p in self.posts.values() if p.channel_id == channel.id and p.update_at > since
        ][:SINCE_CAP]
        included = {p.id: p for p in matched}
        for p in matched:
            if p.root_id and p.root_id in self.posts:
                included.setdefault(p.root_id, self.posts[p.root_id])
        newest_first = sorted(included.values(), key=lambda p: p.create_at, reverse=True)
        order = [p.id for p in newest_first if p.update_at > since]
        return PostList(order, {p.id: p for p in newest_first})

    def _channel_timeline(self, channel: Channel) -> list[Post]:
        """Live posts of a channel, newest first."""
        live = [p for p in self.posts.values() if p.channel_id == channel.id and not p.delete_at]
        return sorted(live, key=lambda p: p.create_at, reverse=True)

    def posts_page(
        self, channel: Channel, page: int, per_page: int, *, skip_threads: bool = False
    ) -> PostList:
        timeline = self._channel_timeline(channel)
        chosen = timeline[page * per_page : (page + 1) * per_page]
        return self._with_cursors(channel, timeline, chosen, skip_threads)

    def posts_around(
        self,
        channel: Channel,
        anchor_id: str,
        *,
        before: bool,
        page: int,
        per_page: int,
        skip_threads: bool = False,
    ) -> PostList:
        anchor = self.posts.get(anchor_id)
        if anchor is None or anchor.channel_id != channel.id:
            raise invalid_param("before" if before else "after")
        timeline = self._channel_timeline(channel)
        if before:
            side = [p for p in timeline if p.create_at < anchor.create_at]
        else:
            side = [p for p in reversed(timeline) if p.create_at > anchor.create_at]
        chosen = side[page * per_page : (page + 1) * per_page]
        chosen.sort(key=lambda p: p.create_at, reverse=True)
        return self._with_cursors(channel, timeline, chosen, skip_threads)

    def _with_cursors(
        self, channel: Channel, timeline: list[Post], chosen: list[Post], skip_threads: bool
    ) -> PostList:
        posts = {p.id: p for p in chosen}
        roots = {p.root_id or p.id for p in chosen}
        for p in timeline:
            is_root = p.id in roots
            if (is_root or (not skip_threads and p.root_id in roots)) and p.id not in posts:
                posts[p.id] = p
        if not chosen:
            return PostList([], posts)
        newest, oldest = chosen[0], chosen[-1]
        newer = [p for p in timeline if p.create_at > newest.create_at]
        older = [p for p in timeline if p.create_at < oldest.create_at]
        return PostList(
            [p.id for p in chosen],
            posts,
            next_post_id=newer[-1].id if newer else "",
            prev_post_id=older[0].id if older else "",
        )

    # ----- reactions -----

    def add_reaction(self, actor: User, post_id: str, emoji_name: str) -> Reaction:
        post = self.visible_post(post_id, actor)
        if not _EMOJI_NAME.match(emoji_name):
            raise AppError("model.reaction.is_valid.emoji_name.app_error", "Invalid emoji.", 400)
        existing = self._find_reaction(actor.id, post_id, emoji_name)
        if existing is not None:
            return existing
        now = self._tick()
        reaction = Reaction(actor.id, post_id, emoji_name, now, post.channel_id)
        self.reactions.append(reaction)
        # updatePostForReactionsOnInsert: the post's update_at moves, so `since` sees it.
        post.has_reactions = True
        post.update_at = self._skewed(now)
        return reaction

    def remove_reaction(self, actor: User, post_id: str, emoji_name: str) -> Reaction | None:
        post = self.visible_post(post_id, actor)
        existing = self._find_reaction(actor.id, post_id, emoji_name)
        if existing is None:
            return None
        self.reactions.remove(existing)
        post.has_reactions = any(r.post_id == post_id for r in self.reactions)
        post.update_at = self._skewed(self._tick())
        return existing

    def _find_reaction(self, user_id: str, post_id: str, emoji: str) -> Reaction | None:
        for r in self.reactions:
            if (r.user_id, r.post_id, r.emoji_name) == (user_id, post_id, emoji):
                return r
        return None

    def reactions_for(self, post_id: str, user: User) -> list[Reaction]:
        self.visible_post(post_id, user)
        return [r for r in self.reactions if r.post_id == post_id]

    # ----- files -----

    def store_file(
        self, actor: User, channel_id: str, name: str, mime_type: str, content: bytes
    ) -> StoredFile:
        channel = self.member_channel(channel_id, actor)
        stored = StoredFile(
            id=new_id(),
            user_id=actor.id,
            channel_id=channel.id,
            name=name,
            mime_type=mime_type or "application/octet-stream",
            content=content,
            create_at=self._tick(),
        )
        self.files[stored.id] = stored
        return stored

    def file_for(self, file_id: str, user: User) -> StoredFile:
        stored = self.files.get(file_id)
        if stored is None:
            raise not_found("file_info")
        if stored.user_id != user.id:
            self.member_channel(stored.channel_id, user)
        return stored


def seeded_world(clock: Clock, *, bot_username: str, bot_token: str) -> World:
    """A small team: the bot, two humans (alice, bob), and one channel of each kind.

    - ``town-square`` and ``dev``: open, everyone is a member.
    - ``quiet``: open, the bot is *not* a member (for 403 and broadcast tests).
    - ``secret``: private, alice and the bot.
    - a DM between alice and the bot.
    """
    world = World(clock=clock)
    bot = world.add_user(bot_username, bot_token, is_bot=True)
    alice = world.add_user("alice", "alice-token")
    bob = world.add_user("bob", "bob-token")
    team = world.add_team("loopd-team", "Loopd Team", (bot, alice, bob))
    world.add_channel(team, "O", "town-square", (bot, alice, bob))
    world.add_channel(team, "O", "dev", (bot, alice, bob))
    world.add_channel(team, "O", "quiet", (alice, bob))
    world.add_channel(team, "P", "secret", (bot, alice))
    world.add_direct_channel(alice, bot)
    return world
