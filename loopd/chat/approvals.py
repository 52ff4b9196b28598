"""A tool's approval question in a thread: the whole arguments, one question, and the reaction
that answers it.

The call's arguments are posted first, whole, exactly as they will be sent, in a fenced block
(split over posts where one cannot hold them; more than ``MAX_ARGUMENT_POSTS`` and the call is
denied instead). Then the question: the tool, what it says it does (in a code span, so nothing
in it is a mention or markup), and who may answer: the people recorded with the question (those
whose messages the turn answered when it was asked) and the admins (``loopd.approvals.deciders``).
A reaction from anyone else, or any other reaction, is ignored. While it waits the turn's status
post says whose approval it waits for; once decided, the question post is edited to say what was
decided and by whom.

Both are posted under keys of the approval's id (``Outbox.post_once``), so a restart that asks
again finds the same posts, and the reactions put on them while loopd was away count.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio

from loopcommon.sanitize import visible
from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.deciders import Deciders, may_decide
from loopd.approvals.words import decision_line, description_of, minutes, refused_unshown
from loopd.chat.outbox import Outbox
from loopd.chat.rest import MattermostError
from loopd.chat.status import AwaitingApproval, Shown
from loopd.chatsettings import ChatSettings

log = logging.getLogger(__name__)

MAX_ARGUMENT_POSTS: Final = 5  # a call whose arguments need more posts is denied, not asked
_OPEN: Final = "```json\n"
_CLOSE: Final = "\n```"
# The reactions already on a question's posts: (emoji, username, user id), in order.
Reactions = Callable[[Sequence[str]], Awaitable[list[tuple[str, str, str]]]]


def question_head(call: AskedCall, posts: int = 1) -> str:
    """The question's first line (pure): the tool, its arguments above in ``posts`` posts (0:
    not shown), and what it says it does."""
    where = {0: "", 1: " with the arguments above"}.get(
        posts, f" with the arguments in the {posts} posts above, read one after the other"
    )
    described = description_of(call).replace("`", "'")
    what = f" It says: `{described}`" if described else ""
    return f"🔐 `{call.tool}` wants to run{where}.{what}"


def ask_line(settings: ChatSettings, deciders: Deciders, wait_s: float) -> str:
    """The question's second line while it is open (pure): who answers, and how."""
    people = " or ".join(f"@{name}" for name in sorted(deciders.people))
    who = f"{people} or an admin" if people else "An admin"
    return (
        f"{who}: react :{settings.allow_reaction}: to allow or "
        f":{settings.deny_reaction}: to deny (within {minutes(wait_s)}, then it is denied)."
    )


def argument_posts(call: AskedCall, limit: int) -> list[str]:
    """The arguments, whole, in fenced blocks of at most ``limit`` characters (pure): read one
    after the other, the blocks hold exactly the arguments. A block is cut where a line ends if
    one is in its second half, else where it is full. A fence cannot close early: every line of
    canonical JSON starts with a space, a quote, a bracket, a digit or a letter."""
    room = limit - len(_OPEN) - len(_CLOSE)
    chunks, rest = [], visible(call.arguments)
    while len(rest) > room:
        cut = rest.rfind("\n", room // 2, room) + 1 or room
        chunks.append(rest[:cut])
        rest = rest[cut:]
    return [f"{_OPEN}{chunk}{_CLOSE}" for chunk in [*chunks, rest]]


@dataclass
class _Question:
    deciders: Deciders
    decided: anyio.Event = field(default_factory=anyio.Event)
    decision: Decision | None = None


class Questions:
    """The approval questions open in the threads, by the posts that ask (the question and its
    arguments: a reaction on any of them answers)."""

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
        if verdict is None or not may_decide(question.deciders, username, user_id):
            return False
        question.decision = Decision("allow" if verdict == "allow" else "deny", f"@{username}")
        question.decided.set()
        return True

    def asker(
        self,
        outbox: Outbox,
        session: str,
        channel: str,
        root: str,
        deciders: Deciders,
        show: Callable[[Shown], None] = lambda shown: None,
    ) -> ThreadAsker:
        return ThreadAsker(self, outbox, session, channel, root, deciders, show)

    async def wait(
        self,
        post_ids: Sequence[str],
        deciders: Deciders,
        wait_s: float,
        earlier: Reactions | None = None,
    ) -> Decision | None:
        """The decision on the question asked in ``post_ids``: reactions already on them
        (``earlier``, read once the question is open, so that none falls between) count first,
        then those that come, until ``wait_s`` has passed."""
        question = _Question(deciders)
        self._open.update(dict.fromkeys(post_ids, question))
        try:
            for emoji, username, user_id in await earlier(post_ids) if earlier else []:
                self.react(post_ids[0], emoji, username, user_id)
            with anyio.move_on_after(wait_s):
                await question.decided.wait()
            return question.decision
        finally:
            for post_id in post_ids:
                del self._open[post_id]


@dataclass
class ThreadAsker:
    """Asks in one thread (``loopd.approvals.call.Asker``)."""

    questions: Questions
    outbox: Outbox
    session: str
    channel: str
    root: str
    deciders: Deciders  # who the turn belongs to now: recorded with a new question
    show: Callable[[Shown], None]  # the turn's status post

    @property
    def people(self) -> frozenset[str]:
        return self.deciders.people

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        settings = self.questions.settings
        deciders = Deciders.of(call.people, settings.admins)
        posts = argument_posts(call, self.outbox.max_post_size)
        if len(posts) > MAX_ARGUMENT_POSTS:
            return refused_unshown(
                f"its arguments need {len(posts)} posts to show in full; at most "
                f"{MAX_ARGUMENT_POSTS} are posted"
            )
        key = self._key(call)
        shown = [
            (await self.outbox.post_once(f"{key}:arguments:{i}", self.channel, self.root, post))[0]
            for i, post in enumerate(posts)
        ]
        text = f"{question_head(call, len(posts))}\n{ask_line(settings, deciders, wait_s)}"
        [post_id] = await self.outbox.post_once(key, self.channel, self.root, text)
        self.show(AwaitingApproval(tuple(sorted(deciders.people))))
        return await self.questions.wait([post_id, *shown], deciders, wait_s, self._reactions_on)

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        """The question post says what was decided (a call denied before it was asked gets a
        post of its own); best effort: the turn goes on without it."""
        key = self._key(call)
        asked = self.outbox.state.posted_parts(key).get(0)
        posts = len(argument_posts(call, self.outbox.max_post_size)) if asked is not None else 0
        text = f"{question_head(call, posts)}\n{decision_line(decision)}"
        try:
            if asked is None:
                await self.outbox.post_once(key, self.channel, self.root, text)
            else:
                await self.outbox.client.patch_message(asked, text, root_id=self.root)
        except MattermostError as exc:
            log.warning("the approval question of %s could not show the decision (%s)", key, exc)

    def _key(self, call: AskedCall) -> str:
        return f"{self.session}#approval:{call.approval_id}"

    async def _reactions_on(self, post_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """The reactions already on the question's posts (given while loopd was away, or before
        the question was open): emoji, username, user id, in order."""
        client = self.outbox.client
        try:
            posts = await client.thread(self.root)
            return [
                (emoji, (await client.user(user_id)).username, user_id)
                for post in posts
                if post.id in post_ids
                for user_id, emoji in post.reactions
                if user_id != self.outbox.bot_id
            ]
        except MattermostError as exc:
            log.warning("could not read the reactions on %s (%s)", post_ids[0], exc)
            return []
