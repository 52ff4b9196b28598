"""What a request is doing now (``Phase``, ``Status``): the status line's, post's and page's words
come from here. Data only, no I/O: the stream reports them (``loopd.engine.stream``).
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
