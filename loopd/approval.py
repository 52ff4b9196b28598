"""Asking a person before brokerd runs a tool that acts on the world: the words and records (pure).

brokerd refuses a call of a tool that asks (``brokerd.approval``) with an approval id that only
loopd sees. loopd asks the person (a line in the thread and a reaction, or a y/n prompt in the
terminal: an ``Asker``), then sends the call again with the decision; brokerd's answer, the
tool result the model reads, says who allowed or denied it. The question and the decision are
notes in the session log (never replayed to the model), so a restart finds the question asked,
and its time limit counts from when it was first asked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from typing import Final, Literal, Protocol

from loopd.sessionlog.records import Entry, EntryKind

Verdict = Literal["allow", "deny", "timeout"]
ASKED_NOTE: Final = "approval asked: "
DECIDED_NOTE: Final = "approval decided: "
MAX_ARGUMENTS_CHARS: Final = 300  # of the call's arguments, in the one line that asks


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


def shown_arguments(arguments: str) -> str:
    """The arguments on one line, cut to ``MAX_ARGUMENTS_CHARS``."""
    try:
        text = json.dumps(json.loads(arguments), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        text = arguments
    text = " ".join(text.split())
    if len(text) > MAX_ARGUMENTS_CHARS:
        text = text[: MAX_ARGUMENTS_CHARS - 1] + "…"
    return text


def minutes(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    whole = round(seconds)
    return "1 second" if whole == 1 else f"{whole} seconds"


def timed_out(limit_s: float) -> Decision:
    return Decision("timeout", f"no answer within {minutes(limit_s)}")


def refused_here() -> Decision:
    return Decision("deny", "loopd (no person can be asked here)")


def asked_note(call: AskedCall) -> str:
    return ASKED_NOTE + json.dumps(asdict(call), ensure_ascii=False)


def decided_note(call: AskedCall, decision: Decision) -> str:
    return DECIDED_NOTE + json.dumps(
        {"approval_id": call.approval_id, "tool": call.tool, **asdict(decision)},
        ensure_ascii=False,
    )


def asked_before(entries: Sequence[Entry], approval_id: str) -> AskedCall | None:
    """The question as first recorded for ``approval_id`` (a restart asks on from it)."""
    for entry in entries:
        text = entry.fields.text or ""
        if entry.kind is not EntryKind.NOTE or not text.startswith(ASKED_NOTE):
            continue
        try:
            raw = json.loads(text[len(ASKED_NOTE) :])
            call = AskedCall(**raw)
        except (ValueError, TypeError):
            continue
        if call.approval_id == approval_id:
            return call
    return None
