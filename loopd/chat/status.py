"""The status post of a turn: its text for each phase, and when it may be edited again.

Pure: the shell (``outbox.StatusPost``) feeds it what happened and a clock reading."""

from __future__ import annotations

from dataclasses import dataclass

from loopd.engine.stream import Phase, Status


@dataclass(frozen=True)
class InLine:
    """Waiting in loopd's own queue for the session's slot."""

    slot: int
    ahead: int


@dataclass(frozen=True)
class Finished:
    """The turn's end, shown in its status post for good."""

    outcome: str  # "done", "stopped", "failed", "interrupted"
    detail: str = ""


Shown = Status | InLine | Finished


def status_text(shown: Shown, stop_hint: str = "") -> str:
    """One line for the status post; a running turn carries the hint on how to stop it."""
    match shown:
        case InLine(slot, ahead):
            who = "1 other thread" if ahead == 1 else f"{ahead} other threads"
            text = f"⏳ waiting for slot {slot} (behind {who})"
        case Finished(outcome, detail):
            icon = {"done": "✅", "stopped": "⏹️", "failed": "❌"}.get(outcome, "⚠️")
            return f"{icon} {outcome}" + (f" {detail}" if detail else "")
        case Status():
            text = _phase_text(shown)
    return f"{text}{stop_hint}"


def _phase_text(status: Status) -> str:
    match status.phase:
        case Phase.QUEUED:
            return "⏳ queued behind another client on the server"
        case Phase.WAITING:
            return "⏳ waiting for the server"
        case Phase.STUCK:
            return "⏳ the server is not answering /slots; still waiting"
        case Phase.READING:
            return f"📖 reading the prompt {status.percent or 0}%"
        case Phase.THINKING:
            return f"💭 thinking ({status.tokens or 0} tokens)"
        case Phase.TOOL_CALL:
            return f"🔧 calling {status.tool}"
        case Phase.ANSWERING:
            return "✍️ answering"


@dataclass(frozen=True)
class EditDecision:
    send: bool
    wait_s: float = 0.0  # when not sending now: how long until an edit is allowed


def next_edit(
    now: float, text: str, *, last_at: float | None, last_text: str | None, interval_s: float
) -> EditDecision:
    """Edit now, later, or not at all: never the same text twice, never more often than every
    ``interval_s`` (each edit is stored as a history row and broadcast to the channel)."""
    if text == last_text:
        return EditDecision(False)
    if last_at is None or now - last_at >= interval_s:
        return EditDecision(True)
    return EditDecision(False, last_at + interval_s - now)
