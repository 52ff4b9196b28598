"""Posting into threads without ever posting twice, and the throttled status post.

A reply is keyed (``props.loopd_turn``). Before the first part is posted the intent is stored;
each part's post id is stored once posted. A create carries a ``pending_post_id`` derived from the
key, so a retry within 30 s returns the post already made; after a restart (when that window may
have passed) a reply with an intent but missing parts is first looked for in the thread.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

import anyio

from loopcommon.sanitize import visible
from loopd.chat.cursor import ChatState
from loopd.chat.rest import MattermostClient, MattermostError
from loopd.chat.split import split_message
from loopd.chat.status import Finished, Shown, next_edit, status_text

log = logging.getLogger("loopd.chat.outbox")

TURN_PROP = "loopd_turn"
PART_PROP = "loopd_part"


def pending_post_id(bot_id: str, key: str, part: int) -> str:
    digest = hashlib.sha256(f"{key}\0{part}".encode()).hexdigest()[:20]
    return f"{bot_id}:{digest}"


class Outbox:
    def __init__(
        self, client: MattermostClient, state: ChatState, bot_id: str, max_post_size: int
    ) -> None:
        self.client = client
        self.state = state
        self.bot_id = bot_id
        self.max_post_size = max_post_size

    def parts(self, text: str) -> list[str]:
        """The posts ``text`` is split into, as they will read: its hidden characters shown
        first (``loopd.chat.rest`` shows them too), so that each part keeps within the limit."""
        return split_message(visible(text), self.max_post_size)

    def delivered(self, key: str) -> bool:
        planned = self.state.planned_parts(key)
        return planned is not None and len(self.state.posted_parts(key)) >= planned

    def removed(self, post_id: str) -> bool:
        return self.state.seen(f"removed:{post_id}") is not None

    async def remove(self, post_id: str) -> bool:
        """Delete one of loopd's own posts, once (best effort): True when it is gone. A post
        someone else already deleted (403, 404) counts as gone; an outage leaves it for the
        next tidy-up."""
        if self.removed(post_id):
            return True
        try:
            await self.client.delete_post(post_id)
        except MattermostError as exc:
            if exc.status is None:
                log.warning("could not delete post %s (%s); it stays for now", post_id, exc)
                return False
        self.state.mark_seen(f"removed:{post_id}", "removed")
        return True

    async def post_once(self, key: str, channel_id: str, root_id: str, text: str) -> list[str]:
        """Post ``text`` (split as needed) under ``key`` unless it is already there; the ids."""
        parts = self.parts(text)
        posted = self.state.posted_parts(key)
        if len(posted) < len(parts):
            if self.state.planned_parts(key) is not None:
                posted |= await self._found_in_thread(key, root_id, posted)
            else:
                self.state.record_intent(key, len(parts))
        for index, part in enumerate(parts):
            if index in posted:
                continue
            post = await self.client.create_post(
                channel_id,
                part,
                root_id=root_id,
                props={TURN_PROP: key, PART_PROP: index},
                pending_post_id=pending_post_id(self.bot_id, key, index),
            )
            self.state.record_posted(key, index, post.id)
            posted[index] = post.id
        return [posted[i] for i in sorted(posted)]

    async def recover(self, key: str, root_id: str) -> None:
        """Record parts of ``key`` that were posted but not recorded (a create cut short)."""
        planned = self.state.planned_parts(key)
        posted = self.state.posted_parts(key)
        if planned is not None and len(posted) < planned:
            await self._found_in_thread(key, root_id, posted)

    async def _found_in_thread(
        self, key: str, root_id: str, known: dict[int, str]
    ) -> dict[int, str]:
        """Parts of ``key`` already in the thread but not recorded (a restart mid-post)."""
        found: dict[int, str] = {}
        for post in await self.client.thread(root_id):
            if post.user_id != self.bot_id or post.props.get(TURN_PROP) != key:
                continue
            part = post.props.get(PART_PROP)
            if isinstance(part, int) and part not in known:
                self.state.record_posted(key, part, post.id)
                found[part] = post.id
        if found:
            log.info("found %d part(s) of reply %s already posted", len(found), key)
        return found


class StatusPost:
    """One post per turn showing its phase, edited at most every ``interval_s``.

    Best effort: the status post only shows progress, so when it cannot be created or edited
    (a permission scheme without ``edit_post``, the post deleted by a moderator, Mattermost
    failing past the retries) loopd gives it up for the rest of the turn, with one log line,
    and the turn and its answer go on.
    """

    def __init__(
        self,
        outbox: Outbox,
        key: str,
        channel_id: str,
        root_id: str,
        *,
        interval_s: float,
        stop_hint: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outbox = outbox
        self.key = key
        self.channel_id = channel_id
        self.root_id = root_id
        self.interval_s = interval_s
        self.stop_hint = stop_hint
        self.clock = clock
        self.post_id: str | None = None
        self._text = "⏳ starting" + stop_hint
        self._sent: str | None = None
        self._sent_at: float | None = None
        self._changed = anyio.Event()
        self._generation = 0

    def show(self, shown: Shown) -> None:
        """The latest phase; synchronous, so the engine can call it from its stream loop."""
        text = status_text(shown, self.stop_hint)
        if text != self._text:
            self._text = text
            self._changed.set()

    def _key(self, generation: int) -> str:
        return self.key if generation == 0 else f"{self.key}.{generation}"

    async def open(self) -> str | None:
        """Create (or, after a restart, find) the status post; None when it cannot be."""
        key = self._key(self._generation)
        reused = self.outbox.delivered(key)
        posted = self.outbox.state.posted_parts(key)
        if reused and any(self.outbox.removed(i) for i in posted.values()):
            # This turn's earlier run ended and took its status post away (a failed turn now
            # resumed after a restart): carry on in a new one.
            self._generation += 1
            return await self.open()
        try:
            ids = await self.outbox.post_once(key, self.channel_id, self.root_id, self._text)
        except MattermostError as exc:
            self._give_up("could not be posted", exc)
            return None
        self.post_id = ids[0]
        if reused:
            # A restart resumes the turn in its old status post, which still shows the phase
            # the previous run last reached: show the turn starting again.
            await self._edit(self._text)
        else:
            self._sent, self._sent_at = self._text, self.clock()
        return self.post_id

    async def follow(self) -> None:
        """Keep the post in step with ``show`` until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            decision = next_edit(
                self.clock(),
                self._text,
                last_at=self._sent_at,
                last_text=self._sent,
                interval_s=self.interval_s,
            )
            if decision.wait_s > 0:
                await anyio.sleep(decision.wait_s)
            await self._edit(self._text)

    async def finish(self, finished: Finished) -> None:
        """The final text, sent at once: the turn is over and nothing follows it."""
        self._text = status_text(finished)
        await self._edit(self._text)

    async def remove(self) -> None:
        """Take the status post (every one this turn opened) out of the thread: the turn is
        over, and its answer or closing line says how it went."""
        self.post_id = None
        generation = 0
        while parts := self.outbox.state.posted_parts(self._key(generation)):
            for post_id in parts.values():
                await self.outbox.remove(post_id)
            generation += 1

    async def _edit(self, text: str) -> None:
        if self.post_id is None or text == self._sent:
            return
        try:
            await self.outbox.client.patch_message(self.post_id, text, root_id=self.root_id)
        except MattermostError as exc:
            if exc.status != 400:
                self._give_up(f"{self.post_id} could not be edited", exc)
                return
            # Past the server's edit time limit: carry on in a new status post.
            log.info("status post %s can no longer be edited (%s)", self.post_id, exc.detail)
            self._generation += 1
            await self.open()
            return
        self._sent, self._sent_at = text, self.clock()

    def _give_up(self, what: str, exc: MattermostError) -> None:
        log.warning("status post of %s %s (%s); the turn goes on without it", self.key, what, exc)
        self.post_id = None
