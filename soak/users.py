"""The simulated users: one task per thread, posting as a person would.

A user posts, usually waits for the answer (or loses patience and posts again), thinks, and posts
the next message. Now and then they post a burst of messages, stop the turn (the stop word, or
the stop reaction on the status post) or edit an earlier message. Every post, edit and reaction
goes into the ledger the checks start from.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from soak.mattermost import FakeControl, Mirror
from soak.plan import Place, Style, ThreadPlan
from soak.script import Directive

STOP_REACTION = "octagonal_sign"
SHORT = (
    "Name a colour.",
    "Say hello to the team.",
    "Give me one word for happy.",
    "What is two plus two?",
    "Name a fruit.",
    "Say something about rivers in one sentence.",
    "Suggest a name for a cat.",
    "What day comes after Monday?",
    "Tell me a very short joke.",
    "Name a planet.",
)
WORDS = [
    "river",
    "lighthouse",
    "harbour",
    "ledger",
    "meadow",
    "cobalt",
    "ticket",
    "engine",
    "lantern",
    "orchard",
    "signal",
    "granite",
    "thread",
    "window",
    "compass",
    "summit",
    "harvest",
    "beacon",
    "cedar",
    "marble",
    "anchor",
    "island",
]


@dataclass(frozen=True)
class UserPost:
    post_id: str
    thread: str
    root_id: str
    user: str
    kind: str  # "message" or "stop"
    text: str
    at: float


@dataclass(frozen=True)
class UserEdit:
    post_id: str
    thread: str
    at: float


@dataclass(frozen=True)
class UserReaction:
    post_id: str  # the status post reacted to
    thread: str
    root_id: str
    at: float


@dataclass
class Ledger:
    posts: list[UserPost] = field(default_factory=list)
    edits: list[UserEdit] = field(default_factory=list)
    reactions: list[UserReaction] = field(default_factory=list)
    directives: list[Directive] = field(default_factory=list)


@dataclass(frozen=True)
class Pace:
    think_s: float = 60.0  # mean pause between an answer and the next message
    patience_s: tuple[int, int] = (180, 360)  # a user waits this long, then posts anyway
    calls: tuple[int, int] = (1, 4)  # tool calls asked for per tool message


@dataclass
class World:
    """Ids the users need: their own, the channels', each user's direct message with the bot."""

    bot_username: str
    channels: dict[str, str]
    dms: dict[str, str]

    @classmethod
    def from_announcement(cls, data: dict[str, Any]) -> World:
        return cls(str(data["bot"]["username"]), dict(data["channels"]), dict(data["dms"]))

    def channel_of(self, plan: ThreadPlan) -> str:
        return self.dms[plan.user] if plan.place is Place.DM else self.channels[plan.place.value]


@dataclass
class SimulatedThread:
    plan: ThreadPlan
    world: World
    control: FakeControl
    mirror: Mirror
    ledger: Ledger
    pace: Pace
    rng: random.Random
    root_id: str = ""
    count: int = 0

    async def run(self, load_start: float, load_end: float) -> None:
        await anyio.sleep(max(0.0, load_start + self.plan.start_s - time.time()))
        while time.time() < load_end:
            last = await self.post(self.compose())
            roll = self.rng.random()
            if roll < 0.12:
                for _ in range(self.rng.randint(1, 2)):
                    await anyio.sleep(self.rng.uniform(0.2, 1.5))
                    last = await self.post(self.compose())
            elif roll < 0.20:
                await self.stop(load_end)
            elif roll < 0.27:
                await anyio.sleep(self.rng.uniform(1.0, 4.0))
                await self.edit()
            await self.wait_for_answer(last.at, self.rng.uniform(*self.pace.patience_s), load_end)
            await anyio.sleep(self.rng.expovariate(1.0 / self.pace.think_s))

    def compose(self) -> str:
        self.count += 1
        match self.plan.style:
            case Style.TOOLS if self.rng.random() < 0.85:
                directive = Directive(
                    f"{self.plan.name}m{self.count}",
                    self.rng.randint(*self.pace.calls),
                    1 if self.rng.random() < 0.2 else 0,
                )
                self.ledger.directives.append(directive)
                return f"Please close these tickets. {directive.text()}"
            case Style.LONG:
                words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(150, 250)))
                return f"Keep these notes in mind, then name one of the words: {words}"
            case _:
                return self.rng.choice(SHORT)

    async def post(self, text: str, kind: str = "message") -> UserPost:
        message = text
        if not self.root_id and self.plan.place is not Place.DM:
            message = f"@{self.world.bot_username} {text}"
        result = await self.control.act(
            "post_as",
            username=self.plan.user,
            channel=self.world.channel_of(self.plan),
            message=message,
            root_id=self.root_id,
        )
        post = UserPost(
            str(result["id"]),
            self.plan.name,
            self.root_id or str(result["id"]),
            self.plan.user,
            kind,
            message,
            time.time(),
        )
        self.root_id = post.root_id
        self.ledger.posts.append(post)
        return post

    async def stop(self, load_end: float) -> None:
        """Wait for the turn to show its status post, then stop it (the word or the reaction)."""
        with anyio.move_on_after(30.0):
            while self.mirror.status_post(self.root_id) is None and time.time() < load_end:  # noqa: ASYNC110
                await anyio.sleep(0.3)
        status = self.mirror.status_post(self.root_id)
        if status is None:
            return
        if self.rng.random() < 0.5:
            await self.post("stop", kind="stop")
        else:
            reacted = await self.control.react_if_there(
                self.plan.user, status.post_id, STOP_REACTION
            )
            if not reacted:  # the turn ended first: there is nothing left to stop
                return
            self.ledger.reactions.append(
                UserReaction(status.post_id, self.plan.name, self.root_id, time.time())
            )

    async def edit(self) -> None:
        mine = [p for p in self.ledger.posts if p.thread == self.plan.name and p.kind == "message"]
        if not mine:
            return
        target = self.rng.choice(mine)
        await self.control.act(
            "edit_as",
            username=self.plan.user,
            post_id=target.post_id,
            message=target.text + " (edited)",
        )
        self.ledger.edits.append(UserEdit(target.post_id, self.plan.name, time.time()))

    async def wait_for_answer(self, since: float, patience_s: float, load_end: float) -> None:
        deadline = min(time.time() + patience_s, load_end)
        while time.time() < deadline and not self.mirror.replied_since(self.root_id, since):  # noqa: ASYNC110
            await anyio.sleep(0.5)
