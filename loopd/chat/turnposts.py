"""A turn's presence in its thread while it runs: the status post (the phase, and how to stop
it), the answer post written as the answer streams, and the typing indicator.

The answer post is created at the first answer token under the key ``<turn>:draft`` and edited
at most every ``interval_s`` with the text so far; ``Threads.deliver`` later makes it the
answer's first part (``answer_parts``). Everything here is best effort, like the status post: a
post that cannot be made or edited costs only itself, never the turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from loopd.chat.outbox import Outbox, StatusPost
from loopd.chat.rest import MattermostError
from loopd.chat.status import Shown, draft_text, next_edit, wants_typing
from loopd.engine.progress import Phase, Status

log = logging.getLogger("loopd.chat.turnposts")

DRAFT = ":draft"
CREATE_S = 30.0  # the longest a shielded create may hold up a stop
STATUS = ":status"


class AnswerDraft:
    """The answer post while the answer is being written."""

    def __init__(
        self,
        outbox: Outbox,
        key: str,
        channel_id: str,
        root_id: str,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outbox = outbox
        self.key = key
        self.channel_id = channel_id
        self.root_id = root_id
        self.interval_s = interval_s
        self.clock = clock
        self.post_id = draft_post(outbox, key)  # after a restart: the post the last run made
        self._written = ""
        self._sent: str | None = None
        self._sent_at: float | None = None
        self._changed = anyio.Event()
        self._failed = False

    @property
    def written(self) -> str:
        return self._written

    def write(self, text: str) -> None:
        """The answer so far (the whole text, not a delta); synchronous, like ``show``."""
        if text and text != self._written:
            self._written = text
            self._changed.set()

    async def follow(self) -> None:
        """Create the post at the first text, then keep it in step, until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            if self._failed:
                continue
            text = draft_text(self._written, self.outbox.max_post_size)
            decision = next_edit(
                self.clock(),
                text,
                last_at=self._sent_at,
                last_text=self._sent,
                interval_s=self.interval_s,
            )
            if decision.wait_s > 0:
                await anyio.sleep(decision.wait_s)
                text = draft_text(self._written, self.outbox.max_post_size)
            await self._send(text)

    async def _send(self, text: str) -> None:
        try:
            if self.post_id is None:
                # Shielded: a create cut off by a stop would leave a post nobody recorded.
                with anyio.CancelScope(shield=True), anyio.fail_after(CREATE_S):
                    [self.post_id, *_] = await self.outbox.post_once(
                        self.key, self.channel_id, self.root_id, text
                    )
            elif text != self._sent:
                await self.outbox.client.patch_message(self.post_id, text, root_id=self.root_id)
        except (MattermostError, TimeoutError) as exc:
            # The answer still comes, as new posts, when the turn ends.
            log.warning("the answer post of %s could not be written (%s)", self.key, exc)
            self._failed = True
            return
        self._sent, self._sent_at = text, self.clock()


def draft_post(outbox: Outbox, key: str) -> str | None:
    """The answer post made under ``key``, unless it was since taken away or closed."""
    posted = outbox.state.posted_parts(key)
    post_id = posted.get(0)
    if post_id is None or outbox.removed(post_id) or closed(outbox, post_id):
        return None
    return post_id


def closed(outbox: Outbox, post_id: str) -> bool:
    """The draft became an answer, a stop notice, or was removed: it is no one's draft now."""
    return outbox.state.seen(f"closed:{post_id}") is not None


def close(outbox: Outbox, post_id: str, how: str) -> None:
    outbox.state.mark_seen(f"closed:{post_id}", how)


class TurnPosts:
    """The status post, the answer draft and the typing indicator of one turn."""

    def __init__(
        self,
        outbox: Outbox,
        turn_key: str,
        channel_id: str,
        root_id: str,
        *,
        interval_s: float,
        typing_interval_s: float,
        stop_hint: str,
    ) -> None:
        self.outbox = outbox
        self.channel_id = channel_id
        self.root_id = root_id
        self.typing_interval_s = typing_interval_s
        self.status = StatusPost(
            outbox,
            turn_key + STATUS,
            channel_id,
            root_id,
            interval_s=interval_s,
            stop_hint=stop_hint,
        )
        self.draft = AnswerDraft(
            outbox, turn_key + DRAFT, channel_id, root_id, interval_s=interval_s
        )
        self._typing = True
        self._typing_changed = anyio.Event()

    def show(self, shown: Shown) -> None:
        """What the turn does now (the engine's status callback)."""
        self.status.show(shown)
        if isinstance(shown, Status) and shown.phase is Phase.ANSWERING:
            self.draft.write(shown.text)
        typing = wants_typing(shown)
        if typing != self._typing:
            self._typing = typing
            self._typing_changed.set()

    def owns(self, post_id: str) -> bool:
        """The post is this turn's status post or answer post (a stop reaction may go on
        either)."""
        return post_id in (self.status.post_id, self.draft.post_id)

    async def open(self) -> None:
        await self.status.open()

    async def follow(self) -> None:
        """Keep the posts and the typing indicator in step until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.status.follow)
            tg.start_soon(self.draft.follow)
            tg.start_soon(self._type)

    async def _type(self) -> None:
        bot = self.outbox.bot_id
        while True:
            if self._typing:
                try:
                    await self.outbox.client.typing(bot, self.channel_id, self.root_id)
                except MattermostError as exc:
                    log.debug("typing indicator not sent: %s", exc)
            self._typing_changed = anyio.Event()
            with anyio.move_on_after(self.typing_interval_s):
                await self._typing_changed.wait()
