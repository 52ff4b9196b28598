"""What a request is doing now (``Phase``, ``Status``) and its words (``phase_words``), the same on
the status line, the thread's post and the status page. Data only, no I/O: the stream reports them
(``loopd.engine.stream``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    WAITING = "waiting"  # sent, no byte yet, slot not seen busy
    QUEUED = "queued"  # the slot is busy with another task
    STUCK = "stuck"  # /slots does not answer while /health does
    READING = "reading"  # prompt processing (progress events)
    THINKING = "thinking"
    ANSWERING = "answering"
    TOOL_CALL = "tool_call"


@dataclass(frozen=True)
class Status:
    """What the request is doing now, for the status line or post."""

    phase: Phase
    percent: int | None = None
    tokens: int | None = None
    tool: str | None = None
    # ANSWERING: the answer written so far (a chat thread shows it as it grows); THINKING: the
    # thinking so far (the terminal shows it, folded or whole).
    text: str = ""


StatusCallback = Callable[[Status], None]


def phase_words(status: Status) -> str:
    """The phase in words, the same on every surface (a thread adds an icon)."""
    match status.phase:
        case Phase.QUEUED:
            return "queued behind another request on the server"
        case Phase.WAITING:
            return "waiting for the server"
        case Phase.STUCK:
            return "the server is not answering; still waiting"
        case Phase.READING:
            return f"reading the prompt {status.percent or 0}%"
        case Phase.THINKING:
            return f"thinking ({status.tokens or 0} tokens)"
        case Phase.TOOL_CALL:
            return f"calling {status.tool}"
        case Phase.ANSWERING:
            return "answering"
