"""Receiving posts without loss or duplicates, and routing each through one intake.

Each connection: open the socket first (events queue up), then catch up over REST from the
stored per-channel cursors (minus an overlap), then read events. Every post, from either path,
goes through ``intake``, which is idempotent by post id: the session log stores a user message
once per post id, and decided posts are remembered. A channel's cursor advances only after the
post was durably taken in. A seq gap, a missed ping reply or a closed socket means: reconnect
(resuming where the server allows), with jittered backoff, and catch up again.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass

import anyio

from loopd.chat.config import ChatSettings
from loopd.chat.cursor import ChatState
from loopd.chat.intake import Action, Allowlist, Decision, decide
from loopd.chat.model import Channel, Post, User, WireFormatError
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostClient, MattermostError
from loopd.chat.threads import Threads, session_name
from loopd.chat.ws import NoHello, Resume, SocketLost, WsEvent, open_socket
from loopd.sessions import Runtime

log = logging.getLogger("loopd.chat.adapter")

EDIT_NOTICE = (
    "✏️ Edits are not re-read: I work from the message as it was first posted. "
    "Post a new reply instead."
)
REFUSAL = "🚫 I am not enabled for you here. Ask the admin to add you (or this channel) to loopd."
FILES_ONLY = "📎 I cannot read attachments yet. Paste the text into a message instead."


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """The web client's schedule: ``base`` (+ jitter) for the first 7 failures, then
    ``base * n²``, capped."""
    delay = base_s if failures <= 7 else base_s * failures * failures
    return min(cap_s, delay) + random.random() * base_s * 2 / 3


@dataclass(frozen=True)
class UserText:
    text: str
    cut_from: int | None  # the original length, when the post was cut


def user_text(post: Post, author: User, max_chars: int) -> UserText:
    """The log's user message for a post: ``@username: message``, so the model knows who
    speaks; cut at ``max_chars``; attachments named, since they are not read."""
    message = post.message
    cut_from = None
    if len(message) > max_chars:
        cut_from = len(message)
        message = message[:max_chars] + f"\n[cut: the message had {cut_from} characters]"
    if post.file_ids:
        count = len(post.file_ids)
        message += f"\n[{count} attached file{'s' * (count != 1)}, not read]"
    return UserText(f"@{author.username}: {message}", cut_from)


class ChatAdapter:
    def __init__(
        self,
        client: MattermostClient,
        state: ChatState,
        runtime: Runtime,
        threads: Threads,
        outbox: Outbox,
        settings: ChatSettings,
        bot: User,
    ) -> None:
        self.client = client
        self.state = state
        self.runtime = runtime
        self.threads = threads
        self.outbox = outbox
        self.settings = settings
        self.bot = bot
        self.allow = Allowlist.of(
            settings.allowed_users, settings.allowed_teams, settings.allowed_channels
        )
        self.started_ms = int(time.time() * 1000)
        self.connects = 0  # connections that completed a catch-up (for health and tests)
        self.caught_up = anyio.Event()
        self._channels: dict[str, Channel] = {}
        self._users: dict[str, User] = {bot.id: bot}
        self._teams: dict[str, str] = {}

    # -- the connection loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Stay connected until cancelled."""
        resume = self._stored_resume()
        failures = 0
        token = self.settings.token()
        while True:
            resume, healthy = await self._connection(token, resume)
            failures = 1 if healthy else failures + 1
            delay = backoff_s(failures, self.settings.backoff_s, self.settings.backoff_cap_s)
            log.info("reconnecting to Mattermost in %.1f s", delay)
            await anyio.sleep(delay)

    async def _connection(
        self, token: str | None, resume: Resume | None
    ) -> tuple[Resume | None, bool]:
        """One connection, to its end. Returns where a resume would start (None to start
        fresh) and whether it got as far as reading events."""
        opened: Resume | None = None
        try:
            async with open_socket(
                self.settings.url,
                token,
                resume,
                ping_interval_s=self.settings.ping_interval_s,
                hello_timeout_s=self.settings.hello_timeout_s,
            ) as socket:
                opened = Resume(socket.connection_id, socket.next_seq)
                log.info(
                    "Mattermost socket %s (%s)",
                    socket.connection_id,
                    "resumed" if socket.resumed else "new connection",
                )
                await self.catch_up()
                self.connects += 1
                self.caught_up.set()
                async for event in socket.events():
                    await self.on_event(event)
                    opened = Resume(socket.connection_id, socket.next_seq)
                    if event.event == "posted":
                        self.state.save_connection(opened.connection_id, opened.next_seq)
        except NoHello as exc:
            log.error("%s", exc)  # noqa: TRY400 - the message says it all
        except SocketLost as exc:
            log.warning("Mattermost socket lost: %s", exc)
        except (MattermostError, WireFormatError) as exc:
            log.warning("Mattermost catch-up failed: %s", exc)
        if opened is not None:
            self.state.save_connection(opened.connection_id, opened.next_seq)
        # A resume that never got going (rejected params close the socket at once, case E) is
        # not tried again: the next attempt starts fresh.
        return opened, opened is not None

    def _stored_resume(self) -> Resume | None:
        saved = self.state.connection()
        if saved is None or time.time() - saved.saved_at > self.settings.resume_max_age_s:
            return None
        return Resume(saved.connection_id, saved.next_seq)

    # -- catch-up --------------------------------------------------------------------------------

    async def catch_up(self) -> None:
        """Every post since each channel's cursor (minus the overlap), through the intake."""
        if not self._teams:
            self._teams = {team.id: team.name for team in await self.client.my_teams()}
        overlap_ms = int(self.settings.catchup_overlap_s * 1000)
        for channel in await self.client.my_channels():
            self._channels[channel.id] = channel
            cursor = self.state.cursor(channel.id)
            if cursor is None:  # first sight: from this start on (minus the overlap)
                since = self.started_ms - overlap_ms
            else:
                since = cursor.update_at - overlap_ms
            for post in await self.client.posts_since(channel.id, max(since, 1)):
                await self.intake(post)
            if cursor is None:
                self.state.advance(channel.id, since, "")

    # -- events ----------------------------------------------------------------------------------

    async def on_event(self, event: WsEvent) -> None:
        try:
            if event.event in ("posted", "post_edited"):
                await self.intake(Post.from_json(event.data.get("post")))
            elif event.event == "reaction_added":
                await self._reaction(event.data.get("reaction"))
        except WireFormatError as exc:
            log.warning("ignored a malformed %s event: %s", event.event, exc)

    async def _reaction(self, raw: object) -> None:
        reaction = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(reaction, dict):
            raise WireFormatError("reaction is not an object")
        if reaction.get("emoji_name") != self.settings.stop_reaction:
            return
        user = await self._user(str(reaction.get("user_id", "")))
        if user.id != self.bot.id and self.allow.allows_user(user):
            self.threads.stop_by_status_post(str(reaction.get("post_id", "")), user.username)

    # -- the intake ------------------------------------------------------------------------------

    async def intake(self, post: Post) -> None:
        """Decide and act on one post, at most once per post id; then advance the cursor."""
        known = self.state.seen(post.id) is not None
        if not (known and post.edit_at == 0):
            channel = await self._channel(post.channel_id)
            if channel is None:
                log.warning(
                    "post %s is in channel %s, which loopd cannot see", post.id, post.channel_id
                )
            else:
                author = await self._user(post.user_id)
                decision = decide(
                    post,
                    channel=channel,
                    author=author,
                    bot=self.bot,
                    allow=self.allow,
                    team_name=self._teams.get(channel.team_id, ""),
                    thread_known=self.threads.known(post.thread_root),
                    post_known=known,
                    stop_word=self.settings.stop_word,
                )
                await self._act(decision, post, author, channel)
        self.state.advance(post.channel_id, post.update_at, post.id)

    async def _act(self, decision: Decision, post: Post, author: User, channel: Channel) -> None:
        root = decision.root_id
        match decision.action:
            case Action.IGNORE:
                log.debug("ignored post %s: %s", post.id, decision.reason)
            case Action.START | Action.REPLY:
                await self._store(post, author, channel)
            case Action.STOP:
                self.state.mark_seen(post.id, "stop")
                if not self.threads.stop(session_name(root), author.username):
                    await self._notice(f"stop:{post.id}", channel, root, "Nothing is running.")
            case Action.EDIT_NOTICE:
                await self._notice(f"edit:{post.id}", channel, root, EDIT_NOTICE)
            case Action.REFUSE:
                log.info("refused post %s: %s", post.id, decision.reason)
                await self._notice(f"refuse:{post.id}", channel, root, REFUSAL)
                self.state.mark_seen(post.id, "refused")

    async def _store(self, post: Post, author: User, channel: Channel) -> None:
        root = post.thread_root
        if not post.message.strip():
            await self._notice(f"files:{post.id}", channel, root, FILES_ONLY)
            self.state.mark_seen(post.id, "no text")
            return
        text = user_text(post, author, self.settings.max_message_chars)
        name = session_name(root)
        self.state.remember_thread(root, channel.id)
        self.runtime.ensure_session(name)
        appended = await self.runtime.append_user(name, text.text, external_key=post.id)
        self.state.mark_seen(post.id, "stored")
        if text.cut_from is not None:
            await self._notice(
                f"cut:{post.id}",
                channel,
                root,
                f"✂️ Your message had {text.cut_from:,} characters; I read only the first "
                f"{self.settings.max_message_chars:,}.",
            )
        if appended.is_new:
            self.threads.wake(name)

    async def _notice(self, key: str, channel: Channel, root: str, text: str) -> None:
        if self.state.seen(key) is None:
            await self.outbox.post_once(key, channel.id, root, text)
            self.state.mark_seen(key, "notice")

    # -- lookups ---------------------------------------------------------------------------------

    async def _channel(self, channel_id: str) -> Channel | None:
        channel = self._channels.get(channel_id)
        if channel is None:
            try:
                channel = await self.client.channel(channel_id)
            except MattermostError as exc:
                if exc.status is None:
                    raise
                return None
            self._channels[channel_id] = channel
        return channel

    async def _user(self, user_id: str) -> User:
        user = self._users.get(user_id)
        if user is None:
            try:
                user = await self.client.user(user_id)
            except MattermostError as exc:
                if exc.status is None:
                    raise
                user = User(user_id, user_id)
            self._users[user_id] = user
        return user
