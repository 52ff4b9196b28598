"""What a person reads of a call that waits for a decision, and loopd's own decisions (pure)."""

from __future__ import annotations

import json
from typing import Final

from loopd.approvals.call import Decision

MAX_ARGUMENTS_CHARS: Final = 300  # of the call's arguments, in the one line that asks


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
