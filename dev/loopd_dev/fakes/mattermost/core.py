"""The fake server's operations, shared by the REST routes and the control API.

``FakeMattermost`` is also the in-process control handle: tests act as human users and flip
fault switches through its methods. Every operation that changes posts goes through here, so
the event log and the WebSocket events cannot disagree with REST.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loopd_dev.fakes.mattermost import events
from loopd_dev.fakes.mattermost.clock import Clock, SystemClock
from loopd_dev.fakes.mattermost.errors import AppError, forbidden
from loopd_dev.fakes.mattermost.events import WsEvent
from loopd_dev.fakes.mattermost.faults import Faults, RateDecision, RateLimiter
from loopd_dev.fakes.mattermost.hub import Connection, Hub, SocketControl
from loopd_dev.fakes.mattermost.model import (
    Channel,
    CreateResult,
    Patch,
    Post,
    Reaction,
    User,
    World,
    seeded_world,
)

NOISE_KINDS = ("status_change", "channel_viewed")


@dataclass(frozen=True)
class FakeConfig:
    """Knobs, defaulting to the real server's values (shorten the timeouts in tests)."""

    bot_username: str = "loopd"
    bot_token: str = "fake-bot-token"
    server_version: str = "10.5.0.123.abc.true"
    max_post_size: int = 16383
    dedup_ttl_s: float = 30.0
    reaper_timeout_s: float = 300.0
    auth_timeout_s: float = 5.0  # authCheckInterval: unauthenticated sockets close after this
    ping_interval_s: float | None = 60.0  # protocol Ping frames (pingInterval)
    pong_wait_s: float | None = 40.0  # closes if no pong this long after a ping (pongWaitTime)
    dead_queue_size: int = 128
    send_queue_size: int = 256


@dataclass(frozen=True)
class LoggedPost:
    """One entry of the event log: what happened to which post, by whom."""

    action: str  # "created", "deduplicated", "edited", "deleted"
    post_id: str
    user_id: str
    channel_id: str
    root_id: str
    message: str
    props: dict[str, Any]


@dataclass(frozen=True)
class Typing:
    """One typing indicator sent (REST or WebSocket), for tests to see."""

    user_id: str
    channel_id: str
    parent_id: str
    at: float  # the fake's monotonic clock


@dataclass
class EventLog:
    entries: list[LoggedPost] = field(default_factory=list)

    def record(self, action: str, post: Post) -> None:
        self.entries.append(
            LoggedPost(
                action,
                post.id,
                post.user_id,
                post.channel_id,
                post.root_id,
                post.message,
                dict(post.props),
            )
        )

    def created(self, user_id: str | None = None, root_id: str | None = None) -> list[LoggedPost]:
        """Posts really created (deduplicated retries excluded), optionally filtered."""
        return [
            e
            for e in self.entries
            if e.action == "created"
            and user_id in (None, e.user_id)
            and root_id in (None, e.root_id)
        ]


class FakeMattermost:
    """The fake's state and operations; also the in-process control handle."""

    def __init__(self, config: FakeConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or FakeConfig()
        self.clock = clock or SystemClock()
        self.world: World = seeded_world(
            self.clock, bot_username=self.config.bot_username, bot_token=self.config.bot_token
        )
        self.world.max_post_size = self.config.max_post_size
        self.world.dedup_ttl_s = self.config.dedup_ttl_s
        self.hub = self._new_hub()
        self.faults = Faults()
        self.rate_limiter = RateLimiter(self.clock)
        self.log = EventLog()
        self.typing: list[Typing] = []
        self.restarts = 0

    def _new_hub(self) -> Hub:
        return Hub(
            server_version=self.config.server_version,
            now=self.clock.monotonic,
            reaper_timeout_s=self.config.reaper_timeout_s,
            dead_queue_size=self.config.dead_queue_size,
            send_queue_size=self.config.send_queue_size,
        )

    # ----- lookups for tests -----

    @property
    def bot(self) -> User:
        return self.world.user_by_name(self.config.bot_username)

    def user(self, name_or_id: str) -> User:
        return self.world.user_by_name(name_or_id)

    def channel(self, name_or_id: str) -> Channel:
        return self.world.channel_by_name(name_or_id)

    def connections(self, user: str | None = None) -> list[Connection]:
        return self.hub.connections(self.user(user).id if user else None)

    def publish(self, event: WsEvent) -> int:
        return self.hub.broadcast(event, lambda cid: self.world.channel(cid).members)

    def admit(self, client_key: str) -> RateDecision:
        """Rate limiting for one request (REST or WebSocket upgrade) from ``client_key``."""
        retry_after = self.faults.take_forced_429()
        if retry_after is not None:
            return RateDecision(
                False,
                {
                    "X-RateLimit-Limit": str(self.rate_limiter.burst + 1),
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": str(retry_after),
                    "Retry-After": str(retry_after),
                },
            )
        return self.rate_limiter.check(client_key)

    # ----- operations (REST and control alike) -----

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
        in_flight: bool = False,
    ) -> CreateResult:
        """``in_flight``: the caller ends the create later (``world.finish_create``); until
        then a retry with the same pending_post_id is answered 500 (pending)."""
        result = self.world.create_post(
            author,
            channel_id,
            message,
            root_id=root_id,
            props=props,
            file_ids=file_ids,
            pending_post_id=pending_post_id,
        )
        if not result.created:
            self.log.record("deduplicated", result.post)
            return result
        if not in_flight:
            self.world.finish_create(result.post)
        self.log.record("created", result.post)
        self.publish(events.posted(self.world, result.post, author))
        return result

    def patch_post(self, actor: User, post_id: str, patch: Patch) -> Post:
        post = self.world.patch_post(actor, post_id, patch)
        self.log.record("edited", post)
        self.publish(events.post_edited(self.world, post))
        return post

    def delete_post(self, actor: User, post_id: str) -> Post:
        post = self.world.delete_post(actor, post_id)
        self.log.record("deleted", post)
        self.publish(events.post_deleted(self.world, post))
        return post

    def add_reaction(self, actor: User, post_id: str, emoji_name: str) -> Reaction:
        reaction = self.world.add_reaction(actor, post_id, emoji_name)
        self.publish(events.reaction_event("reaction_added", reaction))
        return reaction

    def remove_reaction(self, actor: User, post_id: str, emoji_name: str) -> None:
        removed = self.world.remove_reaction(actor, post_id, emoji_name)
        if removed is not None:
            self.publish(events.reaction_event("reaction_removed", removed))

    def user_typing(self, actor: User, channel_id: str, parent_id: str) -> None:
        channel = self.world.member_channel(channel_id, actor)
        self.typing.append(Typing(actor.id, channel.id, parent_id, self.clock.monotonic()))
        self.publish(events.typing(channel.id, actor.id, parent_id))

    def typing_for(self, actor: User, path_user_id: str, channel_id: str, parent_id: str) -> None:
        """``POST /users/{id}/typing``: only for yourself."""
        if self.world.resolve_user(path_user_id, actor).id != actor.id:
            raise forbidden()
        self.user_typing(actor, channel_id, parent_id)

    # ----- acting as a human (control API) -----

    def post_as(
        self,
        username: str,
        channel: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
    ) -> Post:
        author = self.user(username)
        return self.create_post(
            author, self.channel(channel).id, message, root_id=root_id, props=props
        ).post

    def edit_as(self, username: str, post_id: str, message: str) -> Post:
        return self.patch_post(self.user(username), post_id, Patch(message=message))

    def delete_as(self, username: str, post_id: str) -> Post:
        return self.delete_post(self.user(username), post_id)

    def react_as(self, username: str, post_id: str, emoji_name: str) -> Reaction:
        return self.add_reaction(self.user(username), post_id, emoji_name)

    def unreact_as(self, username: str, post_id: str, emoji_name: str) -> None:
        self.remove_reaction(self.user(username), post_id, emoji_name)

    def typing_as(self, username: str, channel: str, parent_id: str = "") -> None:
        self.user_typing(self.user(username), self.channel(channel).id, parent_id)

    # ----- setting up the world (control API) -----

    def add_user(self, username: str, *, teams: Sequence[str] = ()) -> User:
        """A human user (token ``<username>-token``, password ``<username>-password``), in the
        named teams."""
        user = self.world.add_user(username, f"{username}-token")
        for team in self.world.teams.values():
            if team.name in teams or team.id in teams:
                team.members.add(user.id)
        return user

    def add_group(self, usernames: Sequence[str]) -> Channel:
        """A group message among these users."""
        return self.world.add_group_channel([self.user(name) for name in usernames])

    def emit_noise(self, count: int, kind: str = "status_change", user: str | None = None) -> int:
        """Events addressed to ``user`` (the bot by default) that loopd ignores, to fill its
        dead queue as a busy server would. Returns how many were queued."""
        if kind not in NOISE_KINDS:
            raise AppError("fake.noise.kind", f"noise kind must be one of {NOISE_KINDS}", 400)
        target = self.user(user) if user else self.bot
        some_channel = next(iter(self.world.channels_of(target)), None)
        queued = 0
        for i in range(count):
            if kind == "status_change":
                event = events.status_change(target.id, ("online", "away")[i % 2])
            else:
                event = events.channel_viewed(target.id, some_channel.id if some_channel else "")
            queued += self.publish(event)
        return queued

    # ----- fault switches -----

    def _sockets(self, user: str | None) -> list[SocketControl]:
        return [c.socket for c in self.connections(user) if c.socket is not None]

    def drop_sockets(self, user: str | None = None) -> int:
        """Cut live sockets without a close handshake; their connections stay resumable."""
        live = self._sockets(user)
        for socket in live:
            socket.drop()
        return len(live)

    def skip_seq(self, count: int = 1, user: str | None = None) -> None:
        """The next event on each connection skips ``count`` seq numbers (a gap)."""
        for conn in self.connections(user):
            conn.skip_before_next += count

    def duplicate_seq(self, user: str | None = None) -> None:
        """The next event on each connection is written twice with the same seq."""
        for conn in self.connections(user):
            conn.duplicate_next += 1

    def stall(self) -> None:
        """Go silent: no events, no action replies, no protocol pings, frames unread."""
        self.faults.stall_gate.close()
        for socket in self._sockets(None):
            socket.set_stalled(True)

    def unstall(self) -> None:
        self.faults.stall_gate.open()
        for socket in self._sockets(None):
            socket.set_stalled(False)

    def restart(self) -> None:
        """A server restart: sockets close, connections and the dedup cache are forgotten,
        posts stay."""
        self.hub.forget_all()
        self.hub = self._new_hub()
        self.world.forget_dedup_cache()
        self.faults.stall_gate.open()
        self.restarts += 1

    def overflow_send_queue(self, user: str | None = None) -> int:
        """Fill each of the user's (the bot's) send queues past capacity, as a flood on a slow
        connection does: the hub drops those connections. Returns how many were dropped."""
        target = self.user(user) if user else self.bot
        dropped = 0
        for conn in self.hub.connections(target.id):
            # No await in this loop, so the writer cannot drain in between.
            for _ in range(self.config.send_queue_size + 2):
                if not self.hub.enqueue(conn, events.status_change(target.id, "online")):
                    dropped += 1
                    break
        return dropped

    def fail_next_creates(self, count: int = 1, status: int = 500) -> None:
        """The next ``count`` creates commit (and broadcast), then answer ``status``."""
        self.faults.failing_creates = count
        self.faults.failing_create_status = status

    def hang_next_creates(self, count: int = 1) -> None:
        """The next ``count`` creates commit (and broadcast), then their answer never comes: a
        server that dies between its commit and its reply. ``0`` turns the switch off."""
        self.faults.hanging_creates = count

    def refuse_patches(self, status: int | None = 403) -> None:
        """Every post patch answers ``status`` until called with ``None``: 403 is a permission
        scheme without ``edit_post``, 5xx an outage that hits edits only."""
        self.faults.refused_patches = status

    def burst_429(self, count: int, retry_after_s: int = 1) -> None:
        """The next ``count`` REST requests get 429 ``limit exceeded`` with Retry-After."""
        self.faults.forced_429 = count
        self.faults.forced_429_retry_after_s = retry_after_s

    def set_rate_limit(self, enabled: bool, per_second: float = 10.0, burst: int = 100) -> None:
        self.rate_limiter = RateLimiter(
            self.clock, enabled=enabled, per_second=per_second, burst=burst
        )

    def set_edit_time_limit(self, seconds: int | None) -> None:
        """``PostEditTimeLimit``; ``None`` restores the default, no limit (-1)."""
        self.world.edit_time_limit_s = -1 if seconds is None else seconds

    def set_update_at_skew(self, ms: int) -> None:
        """Offset every ``update_at`` written from now on (a server clock that jumps)."""
        self.world.update_at_skew_ms = ms
