"""A call that waits for a person, their decision, and who asks them (pure).

A front end asks through an ``Asker``: a line in the thread and a reaction
(``loopd.chat.approvals``), or a y/N prompt in the terminal (``loopd.terminal.approve``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

Verdict = Literal["allow", "deny", "timeout"]


@dataclass(frozen=True)
class AskedCall:
    """A call that waits for a person: brokerd's approval id, and what is shown to them."""

    session: str
    call_id: str
    tool: str
    arguments: str
    approval_id: str
    asked_at: float  # seconds since the epoch, when it was first asked


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    by: str  # "@alice", or for a timeout how long nobody answered

    def body(self, approval_id: str) -> dict[str, str]:
        """As brokerd takes it with the call sent again."""
        return {"id": approval_id, "decision": self.verdict, "by": self.by}


class Asker(Protocol):
    """Asks a person about one call: their decision, or None when ``wait_s`` passed first."""

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None: ...


class Stepped:
    """An asker whose wait gives the turn's slot to the next session in line meanwhile (the
    turn's request has ended: nothing runs on the server for it while a person decides)."""

    def __init__(self, inner: Asker, step_aside: Callable[[], AbstractAsyncContextManager[None]]):
        self.inner = inner
        self.step_aside = step_aside

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        async with self.step_aside():
            return await self.inner.decide(call, wait_s)
