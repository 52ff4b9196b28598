"""Receiving posts without loss or duplicates, and routing each through one intake.

Each connection: open the socket first (events queue up), then catch up over REST from the
stored per-channel cursors (minus an overlap), then read events. Every post, from either path,
goes through ``intake``, which is idempotent by post id: the session log stores a user message
once per post id, and decided posts are remembered. A channel's cursor advances only after the
post was durably taken in. A seq gap, a missed ping reply or a closed socket means: reconnect
(resuming where the server allows) after the jittered backoff of ``LOOPD_MM_BACKOFF_S``, doubling
with each failure in a row up to ``LOOPD_MM_BACKOFF_CAP_S``, and catch up again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from loopcommon.backoff import Backoff
from loopcommon.statuspage import ThreadView
from loopd.chat.attachments import ReadFile, kind_of, read_file, unread_notice
from loopd.chat.cursor import ChatState, ChatStateError
from loopd.chat.intake import Action, Allowlist, PostDecision, decide
from loopd.chat.labels import thread_label
from loopd.chat.model import Channel, Post, User, WireFormatError
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostClient, MattermostError
from loopd.chat.threads import (
    CONTEXT_KEY,
    RETRY_WORDS,
    StopResult,
    Threads,
    root_of,
    session_name,
)
from loopd.chat.ws import NoHello, Resume, SocketLost, WsEvent, open_socket
from loopd.chatsettings import ChatSettings
from loopd.observe.metrics import METRICS
from loopd.sessionlog.errors import DiskFullError, LockedError
from loopd.sessions import Runtime

log = logging.getLogger("loopd.chat.adapter")

EDIT_NOTICE = (
    "✏️ Edits are not re-read: I work from the message as it was first posted. "
    "Post a new reply instead."
)
REFUSAL = "🚫 I am not enabled for you here. Ask the admin to add you (or this channel) to loopd."
NOTHING_TO_READ = "📎 There is nothing here I can read: I read text and text files only."


@dataclass(frozen=True)
class UserText:
    text: str
    cut_from: int | None  # the original length, when the post was cut


def user_text(
    post: Post, author: User, max_chars: int, files: list[ReadFile] | None = None
) -> UserText:
    """The log's user message for a post: ``@username: message``, so the model knows who
    speaks; cut at ``max_chars``; then its attachments, read (``files``) or only counted."""
    message = post.message
    cut_from = None
    if len(message) > max_chars:
        cut_from = len(message)
        message = message[:max_chars] + f"\n[cut: the message had {cut_from} characters]"
    if files:
        message = "\n\n".join([message, *(f.text for f in files)]).lstrip("\n")
    elif post.file_ids:
        count = len(post.file_ids)
        message += f"\n[{count} attached file{'s' * (count != 1)}, not read]"
    return UserText(f"@{author.username}: {message}", cut_from)


def group_refusal(outsiders: Sequence[str]) -> str:
    """The refusal in a group message, naming who may not use loopd (the author included)."""
    names = [f"@{name}" for name in outsiders]
    who = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    verb = "is" if len(names) == 1 else "are"
    return (
        f"🚫 In a group message I answer only when everyone in it may use me, and {who} {verb} "
        "not enabled. Ask the admin to add them, or message me directly."
    )


def refusal_text(decision: PostDecision, channel: Channel) -> str:
    """What loopd posts for a refused post: in a group message, who may not use it."""
    return group_refusal(decision.outsiders) if channel.is_group else REFUSAL


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
        # Jittered: loopd's that lost Mattermost together do not all knock again together.
        self.reconnect = Backoff(settings.backoff_s, settings.backoff_cap_s, jitter=0.5)
        self.allow = Allowlist.of(
            settings.allowed_users, settings.allowed_teams, settings.allowed_channels
        )
        self.started_ms = int(time.time() * 1000)
        self.connects = 0  # connections that completed a catch-up (for health and tests)
        self.caught_up = anyio.Event()
        self._channels: dict[str, Channel] = {}
        self._users: dict[str, User] = {bot.id: bot}
        self._teams: dict[str, str] = {}
        self._outsiders: dict[str, list[str]] = {}

    # -- the connection loop ---------------------------------------------------------------------

    def thread_labels(self) -> dict[str, ThreadView]:
        """The status page's label of each thread, by its session's name."""
        return {session_name(root): label for root, label in self.state.thread_labels().items()}

    async def run(self) -> None:
        """Stay connected until cancelled."""
        resume = self._stored_resume()
        failures = 0
        token = self.settings.token()
        while True:
            resume, healthy = await self._connection(token, resume)
            failures = 1 if healthy else failures + 1
            delay = self.reconnect.jittered(failures)
            log.info("reconnecting to Mattermost in %.1f s", delay)
            await anyio.sleep(delay)
            METRICS.mattermost_reconnect()

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
                METRICS.mattermost_connected(True)
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
        except (DiskFullError, LockedError, ChatStateError) as exc:
            # Full or busy for now: the post was not taken in, so its channel's cursor is still
            # before it, and the next connection's catch-up takes it in.
            log.warning("could not take in a post (%s); trying again after reconnecting", exc)
        finally:
            METRICS.mattermost_connected(False)  # also when the daemon is stopping
        if opened is not None:
            with contextlib.suppress(ChatStateError):  # only a hint for the resume
                self.state.save_connection(opened.connection_id, opened.next_seq)
        # A resume that never got going (the server closes the socket at once on parameters it
        # rejects) is not tried again: the next attempt starts fresh.
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
        METRICS.mattermost_event(event.event)
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
        emoji = str(reaction.get("emoji_name", ""))
        answers = (self.settings.allow_reaction, self.settings.deny_reaction)
        acted_on = (self.settings.stop_reaction, self.settings.retry_reaction, *answers)
        if emoji not in acted_on:
            return
        user = await self._user(str(reaction.get("user_id", "")))
        if user.id == self.bot.id or not self.allow.allows_user(user):
            return
        post_id = str(reaction.get("post_id", ""))
        if emoji in answers:
            if self.threads.questions.react(post_id, emoji, user.username, user.id):
                log.info("approval %s answered by @%s: %s", post_id, user.username, emoji)
        elif emoji == self.settings.retry_reaction:
            await self._retry(post_id, user)
        elif self.threads.stop_by_post(post_id, user.username, user.id) is StopResult.STOPPED:
            log.info("turn stopped by @%s's reaction on %s", user.username, post_id)

    async def _retry(self, post_id: str, user: User) -> None:
        """A retry reaction: the answer generated again, or one line saying why not."""
        result = self.threads.retry_by_post(post_id, user.username, user.id)
        log.info("retry reaction by @%s on %s: %s", user.username, post_id, result.value)
        said = RETRY_WORDS.get(result)
        keys = self.state.post_keys(post_id)
        root = root_of(keys[0].partition("#")[0]) if keys else ""
        channel = self.state.thread_channel(root)
        if said is not None and channel is not None:
            # Once per post and person: a reaction taken back and given again says it once.
            notice_key = f"retry:{post_id}:{user.id}"
            if self.state.seen(notice_key) is None:
                await self.outbox.post_once(notice_key, channel, root, said)
                self.state.mark_seen(notice_key, "notice")

    # -- the intake ------------------------------------------------------------------------------

    async def intake(self, post: Post) -> None:
        """Decide and act on one post, at most once per post id; then advance the cursor."""
        if post.user_id == self.bot.id:
            # loopd's own posts and edits (an answer being written is edited every few
            # seconds) need no decision, and no cursor write: each write waits for the disk on
            # the event loop, and a stop must not queue behind them. A catch-up that reads them
            # again ignores them again.
            return
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
                    replies_need_mention=self._replies_need_mention(channel),
                    group_outsiders=await self._group_outsiders(channel),
                )
                await self._act(decision, post, author, channel)
        self.state.advance(post.channel_id, post.update_at, post.id)

    async def _act(
        self, decision: PostDecision, post: Post, author: User, channel: Channel
    ) -> None:
        root = decision.root_id
        match decision.action:
            case Action.IGNORE:
                log.debug("ignored post %s: %s", post.id, decision.reason)
            case Action.START | Action.REPLY:
                await self._store(post, author, channel, decision)
            case Action.STOP:
                await self._stop(post, author, channel, root)
            case Action.EDIT_NOTICE:
                await self._notice(f"edit:{post.id}", channel, root, EDIT_NOTICE)
            case Action.REFUSE:
                log.info("refused post %s: %s", post.id, decision.reason)
                text = refusal_text(decision, channel)
                await self._notice(f"refuse:{post.id}", channel, root, text)
                self.state.mark_seen(post.id, "refused")

    async def _stop(self, post: Post, author: User, channel: Channel, root: str) -> None:
        name = session_name(root)
        with self.state.together():  # the stop and the post taken in, or neither
            result = self.threads.stop(name, author.username, author.id)
            self.state.mark_seen(post.id, "stop")
        match result:
            case StopResult.NOTHING_RUNNING:
                await self._notice(f"stop:{post.id}", channel, root, "Nothing is running.")
            case StopResult.NOT_ALLOWED:
                owners = " or ".join(f"@{o}" for o in sorted(self.threads.owners(name)))
                await self._notice(
                    f"stop:{post.id}",
                    channel,
                    root,
                    f"⏹️ Only {owners or 'the person who asked'} (or an admin) can stop this turn.",
                )
            case StopResult.STOPPED:
                pass

    async def _store(
        self, post: Post, author: User, channel: Channel, decision: PostDecision
    ) -> None:
        root = post.thread_root
        name = session_name(root)
        refusal = self.threads.admission(name, author.username)
        if refusal is not None:
            log.info("did not take post %s: %s", post.id, refusal)
            await self._notice(f"full:{post.id}", channel, root, refusal)
            self.state.mark_seen(post.id, "queue full")
            return
        files = await self._read_files(post)
        if not post.message.strip() and not any(f.text and not f.notice for f in files):
            notice = unread_notice(files) or NOTHING_TO_READ
            await self._notice(f"files:{post.id}", channel, root, notice)
            self.state.mark_seen(post.id, "nothing to read")
            return
        text = user_text(post, author, self.settings.max_message_chars, files)
        context = await self._context(post, channel, decision)
        self.state.remember_thread(root, channel.id)
        self.state.label_thread(thread_label(root, channel, author, post.message))
        self.runtime.ensure_session(name)
        for key, message in [*context, (post.id, text.text)]:
            too_long = await self._take(name, key, message)
            if too_long is not None:  # a message longer than the context: said, never silent
                await self._notice(f"long:{key}", channel, root, f"✂️ {too_long}")
        for key, _ in context:
            self.state.mark_seen(key.removeprefix(CONTEXT_KEY), "context")
        self.state.mark_seen(post.id, "stored")
        self.threads.waiting(name, author.username)
        if text.cut_from is not None:
            await self._notice(
                f"cut:{post.id}",
                channel,
                root,
                f"✂️ Your message had {text.cut_from:,} characters; I read only the first "
                f"{self.settings.max_message_chars:,}.",
            )
        if notice := unread_notice(files):
            await self._notice(f"files:{post.id}", channel, root, notice)
        self.threads.wake(name)

    async def _take(self, name: str, key: str, text: str) -> str | None:
        """Into the log, or held while the thread's turn runs (see ``threads``); what to tell
        the thread of a message too long for the context (``Runtime.append_user``)."""
        if self.threads.holds(name):
            self.state.hold(key, name, text)
            return None
        return (await self.runtime.append_user(name, text, external_key=key)).notice

    async def _context(
        self, post: Post, channel: Channel, decision: PostDecision
    ) -> list[tuple[str, str]]:
        """The thread's earlier posts loopd has not read, with their authors, as the opening of
        the conversation: when a mention brings loopd into a thread partway through, and, under
        the thread policy ``mentions``, what was said between two mentions."""
        starts_mid_thread = decision.action is Action.START and bool(post.root_id)
        between_mentions = decision.action is Action.REPLY and self._replies_need_mention(channel)
        if not (starts_mid_thread or between_mentions):
            return []
        try:
            thread = await self.client.thread(post.thread_root)
        except MattermostError as exc:
            if exc.status is None:
                raise
            log.warning("the thread of %s could not be read (%s); no context", post.id, exc)
            return []
        context = []
        for earlier in thread:
            if earlier.create_at >= post.create_at or earlier.id == post.id:
                continue
            if self.state.seen(earlier.id) is not None or earlier.user_id == self.bot.id:
                continue
            if earlier.type.startswith("system_") or not earlier.message.strip():
                continue
            author = await self._user(earlier.user_id)
            text = user_text(earlier, author, self.settings.max_message_chars)
            context.append((f"{CONTEXT_KEY}{earlier.id}", text.text))
        return context

    async def _read_files(self, post: Post) -> list[ReadFile]:
        """The post's attachments: text files read (up to ``max_file_bytes``), others named."""
        files = []
        for file_id in post.file_ids:
            try:
                info = await self.client.file_info(file_id)
                head = None
                if kind_of(info) == "text":
                    head = await self.client.file_head(file_id, self.settings.max_file_bytes)
            except MattermostError as exc:
                if exc.status is None:
                    raise
                log.warning("attachment %s of post %s: %s", file_id, post.id, exc)
                continue
            files.append(read_file(info, head, self.settings.max_file_bytes))
        return files

    def _replies_need_mention(self, channel: Channel) -> bool:
        return self.settings.thread_policy == "mentions" and not channel.is_direct

    async def _group_outsiders(self, channel: Channel) -> list[str]:
        """For a group message: the usernames of members who are not allowed (the members of a
        group message never change, so this is asked once per channel)."""
        if not channel.is_group:
            return []
        outsiders = self._outsiders.get(channel.id)
        if outsiders is None:
            members = [
                await self._user(i) for i in await self.client.channel_member_ids(channel.id)
            ]
            outsiders = [
                m.username for m in members if m.id != self.bot.id and not self.allow.allows_user(m)
            ]
            self._outsiders[channel.id] = outsiders
        return outsiders

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
