"""A tool's approval question in a thread: one line, and the reaction that answers it.

The line names the tool and its arguments (cut short, in a code span so that nothing in them
is read as a mention or as markup) and who may answer: the people whose messages the turn
answers, and the admins. A reaction from anyone else, or any other reaction, is ignored. The
line is posted under a key of the approval's id (``Outbox.post_once``), so a restart that asks
again finds the same post, and the reactions put on it while loopd was away count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.deciders import Deciders, may_decide
from loopd.approvals.words import minutes, shown_arguments
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostError
from loopd.chatsettings import ChatSettings

log = logging.getLogger(__name__)


def question_line(
    call: AskedCall, settings: ChatSettings, deciders: Deciders, wait_s: float
) -> str:
    """The one line that asks (pure)."""
    arguments = shown_arguments(call.arguments).replace("`", "'")
    who = " or ".join(f"@{name}" for name in sorted(deciders.people)) or "someone of this thread"
    return (
        f"🔐 `{call.tool}` wants to run with `{arguments}`. {who} or an admin: react "
        f":{settings.allow_reaction}: to allow or :{settings.deny_reaction}: to deny "
        f"(within {minutes(wait_s)}, then it is denied)."
    )


@dataclass
class _Question:
    deciders: Deciders
    decided: anyio.Event = field(default_factory=anyio.Event)
    decision: Decision | None = None


class Questions:
    """The approval questions open in the threads, by the post that asks."""

    def __init__(self, settings: ChatSettings) -> None:
        self.settings = settings
        self._open: dict[str, _Question] = {}

    def is_open(self, post_id: str) -> bool:
        return post_id in self._open

    def react(self, post_id: str, emoji: str, username: str, user_id: str) -> bool:
        """A reaction on a question's post: True when it decided the question."""
        question = self._open.get(post_id)
        if question is None or question.decision is not None:
            return False
        verdicts = {self.settings.allow_reaction: "allow", self.settings.deny_reaction: "deny"}
        verdict = verdicts.get(emoji)
        if verdict is None:
            return False
        if not may_decide(question.deciders, username, user_id):
            return False
        question.decision = Decision("allow" if verdict == "allow" else "deny", f"@{username}")
        question.decided.set()
        return True

    def asker(
        self, outbox: Outbox, session: str, channel: str, root: str, deciders: Deciders
    ) -> ThreadAsker:
        return ThreadAsker(self, outbox, session, channel, root, deciders)

    async def wait(
        self,
        post_id: str,
        deciders: Deciders,
        wait_s: float,
        earlier: Sequence[tuple[str, str, str]] = (),
    ) -> Decision | None:
        """The decision on the question of ``post_id``; ``earlier`` are reactions already on it
        (emoji, username, user id), in order, counted first."""
        question = _Question(deciders)
        self._open[post_id] = question
        try:
            for emoji, username, user_id in earlier:
                self.react(post_id, emoji, username, user_id)
            with anyio.move_on_after(wait_s):
                await question.decided.wait()
            return question.decision
        finally:
            del self._open[post_id]


@dataclass
class ThreadAsker:
    """Asks in one thread (``loopd.approvals.call.Asker``)."""

    questions: Questions
    outbox: Outbox
    session: str
    channel: str
    root: str
    deciders: Deciders

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        line = question_line(call, self.questions.settings, self.deciders, wait_s)
        key = f"{self.session}#approval:{call.approval_id}"
        asked_before = self.outbox.state.planned_parts(key) is not None
        [post_id, *_] = await self.outbox.post_once(key, self.channel, self.root, line)
        earlier = await self._reactions_on(post_id) if asked_before else []
        return await self.questions.wait(post_id, self.deciders, wait_s, earlier)

    async def _reactions_on(self, post_id: str) -> list[tuple[str, str, str]]:
        """The reactions on the question (a restart: given while loopd was away)."""
        client = self.outbox.client
        try:
            posts = await client.thread(self.root)
            found = next((post for post in posts if post.id == post_id), None)
            if found is None:
                return []
            return [
                (emoji, (await client.user(user_id)).username, user_id)
                for user_id, emoji in found.reactions
                if user_id != self.outbox.bot_id
            ]
        except MattermostError as exc:
            log.warning("could not read the reactions on %s (%s)", post_id, exc)
            return []
