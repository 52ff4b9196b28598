"""A call that waits for a person, their decision, and who asks them (pure).

A front end asks through an ``Asker``: a question in the thread and a reaction
(``loopd.chat.approvals``), or a y/N prompt in the terminal (``loopd.terminal.approve``). Who may
decide (``people``) is fixed when the question is first asked and recorded with it, so a restart
asks the same people, whoever joined the thread since.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from loopcommon.approvals import Verdict


@dataclass(frozen=True)
class AskedCall:
    """A call that waits for a person: its approval id, and what is shown to them."""

    session: str
    call_id: str
    tool: str
    arguments: str  # as they are sent (``loopd.approvals.words.canonical_arguments``)
    approval_id: str
    asked_at: float  # seconds since the epoch, when it was first asked
    people: tuple[str, ...] = ()  # who was asked (with the admins: ``loopd.approvals.deciders``)
    description: str = ""  # what the tool says it does


def core_approval_id(session: str, call_id: str, tool: str, arguments: str) -> str:
    """The approval id of a call of one of loopd's core tools (loopd asks about these itself):
    the same call after a restart has the same id, so it finds its question again."""
    key = "\0".join((session, call_id, tool, arguments)).encode()
    return "core-" + hashlib.sha256(key).hexdigest()[:32]


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    by: str  # "@alice"; "loopd (why)" for loopd's own; for a timeout how long nobody answered

    def body(self, approval_id: str) -> dict[str, str]:
        """As brokerd takes it with the call sent again."""
        return {"id": approval_id, "decision": self.verdict, "by": self.by}


class Asker(Protocol):
    """Asks a person about a call, and shows what was decided."""

    @property
    def people(self) -> frozenset[str]:
        """Who this front end asks now: recorded with a new question."""

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        """Their decision, or None when ``wait_s`` passed first."""

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        """Show the decision where the question was (or would have been) asked."""


class Stepped:
    """An asker whose wait gives the turn's slot to the next session in line meanwhile (the
    turn's request has ended: nothing runs on the server for it while a person decides)."""

    def __init__(self, inner: Asker, step_aside: Callable[[], AbstractAsyncContextManager[None]]):
        self.inner = inner
        self.step_aside = step_aside

    @property
    def people(self) -> frozenset[str]:
        return self.inner.people

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        async with self.step_aside():
            return await self.inner.decide(call, wait_s)

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        await self.inner.tell(call, decision)
