"""The terminal's approval question: one line naming the tool and its arguments, and y/n.

Asked on the event loop while the main thread waits for the turn (nothing reads the keyboard
then), so the answer is read in a worker thread; when the time limit passes first the call is
denied and the read is abandoned. Only ``y`` or ``yes`` allows; anything else, or the end of
the input, denies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from loopcommon.sanitize import for_terminal
from loopd.approval import AskedCall, Decision, minutes, shown_arguments


def question(call: AskedCall, wait_s: float) -> str:
    """The prompt (pure): the tool and arguments as text, never as terminal controls."""
    shown = for_terminal(f"{call.tool} wants to run with {shown_arguments(call.arguments)}")
    return f"\n🔐 {shown}\n   Allow it? [y/N] (within {minutes(wait_s)}, then it is denied) "


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@dataclass
class TerminalAsker:
    """``loopd.approval.Asker`` on the terminal; ``who`` is the local user."""

    who: str
    write: Callable[[str], None] = field(default=_write)
    read_line: Callable[[], str] = field(default=sys.stdin.readline)

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        self.write(question(call, wait_s))
        answer: str | None = None
        with anyio.move_on_after(wait_s):
            answer = await anyio.to_thread.run_sync(self.read_line, abandon_on_cancel=True)
        if answer is None:
            self.write("\n")
            return None
        allowed = answer.strip().lower() in ("y", "yes")
        return Decision("allow" if allowed else "deny", f"@{self.who}")
