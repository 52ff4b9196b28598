"""The terminal's approval question: one line naming the tool and its arguments, and y/n.

Asked on the event loop while the main thread waits for the turn (nothing else reads the
keyboard then), so the answer is read in a worker thread, which looks at the terminal a few
times a second: at the time limit it stops, and the line typed next goes to the prompt as
ever, not to a question already denied. Only ``y`` or ``yes`` allows; anything else, or the end
of the input, denies. Only a terminal is asked: with piped input a call that asks is denied.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from loopcommon.sanitize import for_terminal
from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.words import minutes, shown_arguments

POLL_S = 0.1


def question(call: AskedCall, wait_s: float) -> str:
    """The prompt (pure): the tool and arguments as text, never as terminal controls."""
    shown = for_terminal(f"{call.tool} wants to run with {shown_arguments(call.arguments)}")
    return f"\n🔐 {shown}\n   Allow it? [y/N] (within {minutes(wait_s)}, then it is denied) "


def read_terminal_line(stop: threading.Event) -> str:
    """One line from the terminal (canonical mode: a read returns one line), or "" at its end;
    returns "" once ``stop`` is set."""
    fd = sys.stdin.fileno()
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            return os.read(fd, 4096).decode("utf-8", "replace")
    return ""


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@dataclass
class TerminalAsker:
    """``loopd.approvals.call.Asker`` on the terminal; ``who`` is the local user."""

    who: str
    write: Callable[[str], None] = field(default=_write)
    read_line: Callable[[threading.Event], str] = field(default=read_terminal_line)

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        self.write(question(call, wait_s))
        stop = threading.Event()
        answer: str | None = None
        try:
            with anyio.move_on_after(wait_s):
                answer = await anyio.to_thread.run_sync(
                    self.read_line, stop, abandon_on_cancel=True
                )
        finally:
            stop.set()  # the reader leaves within POLL_S
        if answer is None:
            self.write("\n")
            return None
        allowed = answer.strip().lower() in ("y", "yes")
        return Decision("allow" if allowed else "deny", f"@{self.who}")
