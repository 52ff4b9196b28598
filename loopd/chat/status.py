"""What a turn is doing, in words: the one wording of each phase, for the thread's status post and
for the terminal's status line, and when a post may be edited again.

Pure: the shells (``turnposts.TurnPosts``, ``terminal.render.TurnView``) feed it what happened and a
clock reading."""

from __future__ import annotations

from dataclasses import dataclass

from loopcommon.sanitize import visible
from loopd.engine.progress import Phase, Status, phase_words


@dataclass(frozen=True)
class InLine:
    """Waiting in loopd's own queue for the session's slot."""

    slot: int
    ahead: int


@dataclass(frozen=True)
class Finished:
    """The turn's end, for a status post that stays (a turn cut short by a shutdown)."""

    outcome: str  # "done", "stopped", "failed", "interrupted"
    detail: str = ""


@dataclass(frozen=True)
class AwaitingApproval:
    """A tool call waits for a person's decision (``loopd.chat.approvals``)."""

    people: tuple[str, ...]  # who was asked (the admins may answer too)


Shown = Status | InLine | Finished | AwaitingApproval

_ICONS = {
    Phase.QUEUED: "⏳",
    Phase.WAITING: "⏳",
    Phase.STUCK: "⏳",
    Phase.READING: "📖",
    Phase.THINKING: "💭",
    Phase.TOOL_CALL: "🔧",
    Phase.ANSWERING: "✍️",
}


def in_line_words(in_line: InLine) -> str:
    who = "1 other thread" if in_line.ahead == 1 else f"{in_line.ahead} other threads"
    return f"waiting for its turn (behind {who})"


def approval_words(awaiting: AwaitingApproval) -> str:
    whose = " or ".join(f"@{name}'s" for name in awaiting.people) or "an admin's"
    return f"waiting for {whose} approval"


def status_text(shown: Shown, stop_hint: str = "") -> str:
    """One line for the status post; a running turn carries the hint on how to stop it."""
    match shown:
        case InLine():
            text = f"⏳ {in_line_words(shown)}"
        case AwaitingApproval():
            text = f"⏳ {approval_words(shown)}"
        case Finished(outcome, detail):
            icon = {"done": "✅", "stopped": "⏹️", "failed": "❌"}.get(outcome, "⚠️")
            return f"{icon} {outcome}" + (f" {detail}" if detail else "")
        case Status():
            text = f"{_ICONS[shown.phase]} {phase_words(shown)}"
    return f"{text}{stop_hint}"


def wants_typing(shown: Shown) -> bool:
    """The typing indicator shows while the turn waits or thinks, not while the answer itself
    is being written into its post (that post moving says as much)."""
    match shown:
        case InLine():
            return True
        case Status():
            return shown.phase is not Phase.ANSWERING
        case _:
            return False


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


DRAFT_MARK = " …"  # ends an answer post while more is coming


def draft_text(written: str, limit: int) -> str:
    """An answer post while the answer is being written: the text so far (at most the first
    post's worth, its hidden characters shown as the post will show them) and a mark that more
    is coming."""
    written = visible(written)
    mark = DRAFT_MARK
    head = written if len(written) + len(mark) <= limit else written[: limit - len(mark)]
    return head.rstrip() + mark
