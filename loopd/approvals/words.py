"""What a person reads of a call that waits for a decision, and loopd's own decisions (pure).

A person approves exactly what will run: the call's arguments are shown whole, as loopd sends
them (``canonical_arguments``: one text for both), never cut. Where they are too long to show
in full, the call is denied instead of asked (``unshowable``).
"""

from __future__ import annotations

import json
from typing import Final

from loopcommon.sanitize import is_hidden, visible
from loopd.approvals.call import AskedCall, Decision

# The most of a call's arguments a question shows; a longer call is denied, not asked.
MAX_SHOWN_ARGUMENTS_CHARS: Final = 20_000
MAX_DESCRIPTION_CHARS: Final = 200  # of the tool's description, on the question's first line


def canonical_arguments(arguments: object) -> str:
    """A call's arguments as loopd sends them to brokerd and shows them to a person: JSON with
    sorted keys and an indent of two (the model's key order and padding are gone), each hidden
    character inside a string as its ``\\u`` escape (the same value, every character seen).
    A string is the arguments as the model wrote them: parsed when it is JSON, else kept."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)
    return "".join(_escaped(char) if is_hidden(char) else char for char in text)


def _escaped(char: str) -> str:
    """``char`` as a JSON escape (above U+FFFF, a surrogate pair of them)."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def unshowable(call: AskedCall) -> str | None:
    """Why the call's arguments cannot be shown in full (None: they can)."""
    size = len(call.arguments)
    if size <= MAX_SHOWN_ARGUMENTS_CHARS:
        return None
    return f"its arguments, {size:,} characters, are too long to show in full"


def description_of(call: AskedCall) -> str:
    """The tool's description on one line, bounded, its hidden characters shown."""
    flat = " ".join(visible(call.description).split())
    if len(flat) > MAX_DESCRIPTION_CHARS:
        flat = flat[: MAX_DESCRIPTION_CHARS - 1] + "…"
    return flat


def decision_line(decision: Decision) -> str:
    """What was decided, where the question was asked."""
    match decision.verdict:
        case "allow":
            return f"✅ allowed by {decision.by}"
        case "deny":
            return f"❌ denied by {decision.by}"
        case "timeout":
            return "⌛ nobody decided in time"


def minutes(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    whole = round(seconds)
    return "1 second" if whole == 1 else f"{whole} seconds"


def timed_out(limit_s: float) -> Decision:
    return Decision("timeout", f"no answer within {minutes(limit_s)}")


def refused_here() -> Decision:
    return Decision("deny", "loopd (no person can be asked here)")


def refused_unshown(reason: str) -> Decision:
    return Decision("deny", f"loopd ({reason})")
