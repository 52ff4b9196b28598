"""A tool's approval question in a thread: one line, and the reaction that answers it.

The line names the tool and its arguments (cut short, in a code span so that nothing in them
is read as a mention or as markup) and who may answer: the people whose messages the turn
answers, and the admins. A reaction from anyone else, or any other reaction, is ignored. The
line is posted under a key of the approval's id (``Outbox.post_once``), so a restart that asks
again finds the same post and the reactions on it count.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import anyio

from loopd.approval import AskedCall, Decision, minutes, shown_arguments
from loopd.chat.config import ChatSettings
from loopd.chat.outbox import Outbox


def question_line(
    call: AskedCall, settings: ChatSettings, people: Collection[str], wait_s: float
) -> str:
    """The one line that asks (pure)."""
    arguments = shown_arguments(call.arguments).replace("`", "'")
    who = " or ".join(f"@{name}" for name in sorted(people)) or "someone of this thread"
    return (
        f"🔐 `{call.tool}` wants to run with `{arguments}`. {who} or an admin: react "
        f":{settings.allow_reaction}: to allow or :{settings.deny_reaction}: to deny "
        f"(within {minutes(wait_s)}, then it is denied)."
    )


@dataclass
class _Question:
    people: frozenset[str]
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
        admins = set(self.settings.admins)
        if username.lower() not in question.people and not ({username, user_id} & admins):
            return False
        question.decision = Decision("allow" if verdict == "allow" else "deny", f"@{username}")
        question.decided.set()
        return True

    def asker(
        self, outbox: Outbox, session: str, channel: str, root: str, people: frozenset[str]
    ) -> ThreadAsker:
        return ThreadAsker(self, outbox, session, channel, root, people)

    async def wait(self, post_id: str, people: frozenset[str], wait_s: float) -> Decision | None:
        question = _Question(frozenset(name.lower() for name in people))
        self._open[post_id] = question
        try:
            with anyio.move_on_after(wait_s):
                await question.decided.wait()
            return question.decision
        finally:
            del self._open[post_id]


@dataclass
class ThreadAsker:
    """Asks in one thread (``loopd.approval.Asker``)."""

    questions: Questions
    outbox: Outbox
    session: str
    channel: str
    root: str
    people: frozenset[str]

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        line = question_line(call, self.questions.settings, self.people, wait_s)
        key = f"{self.session}#approval:{call.approval_id}"
        [post_id, *_] = await self.outbox.post_once(key, self.channel, self.root, line)
        return await self.questions.wait(post_id, self.people, wait_s)
