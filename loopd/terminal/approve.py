"""The terminal's approval question: the tool, what it says it does, its whole arguments, and y/N.

Asked on the event loop while the main thread waits for the turn (nothing else reads the
keyboard then), so the answer is read in a worker thread, which looks at the terminal a few
times a second: at the time limit it stops, and the line typed next goes to the prompt as
ever, not to a question already denied.

Only a line typed after the question was drawn answers it. Keys typed during the turn wait in
the terminal's input for the next prompt (``loopd.terminal.typeahead``); read as the answer, a
"yes" meant as the next message would allow the call. So once the question is drawn, what was
typed ahead, a line not yet ended included, is taken out of the input and given back to the
next prompt (``give_back``), and the answer is read with the terminal's echo on, so that it
shows as it is typed; the decision is written under it. Only ``y`` or ``yes`` allows; anything
else, or the end of the input, denies. Only a terminal is asked: with piped input a call that
asks is denied.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import anyio

from loopcommon.sanitize import for_terminal
from loopd.approvals.call import AskedCall, Decision
from loopd.approvals.words import decision_line, description_of, minutes

POLL_S = 0.1
_LOCAL_FLAGS = 3  # the indexes of ``lflag`` and ``cc`` in tcgetattr's list
_CONTROL_CHARS = 6


def question(call: AskedCall, wait_s: float) -> str:
    """The prompt (pure): the tool, what it says it does, and its arguments as they will be
    sent, all as text, never as terminal controls."""
    described = description_of(call)
    what = f" It says: {described}" if described else ""
    head = for_terminal(f"{call.tool} wants to run with these arguments.{what}")
    return (
        f"\n🔐 {head}\n{for_terminal(call.arguments)}\n"
        f"   Allow it? [y/N] (within {minutes(wait_s)}, then it is denied) "
    )


def read_terminal_line(stop: threading.Event) -> str:
    """One line from the terminal (canonical mode: a read returns one line), or "" at its end;
    returns "" once ``stop`` is set."""
    fd = sys.stdin.fileno()
    while not stop.is_set():
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            return os.read(fd, 4096).decode("utf-8", "replace")
    return ""


@contextlib.contextmanager
def answering_on_terminal() -> Iterator[str]:
    """While the block reads an answer: what was typed ahead (a line not yet ended included) is
    taken out of the terminal's input and yielded, and the keys typed now are echoed as a line
    is edited; the terminal as it was after. Not a terminal: nothing to do."""
    if not sys.stdin.isatty():
        yield ""
        return
    fd = sys.stdin.fileno()
    try:
        before = termios.tcgetattr(fd)
    except termios.error:
        yield ""
        return
    try:
        # Out of canonical mode every key typed is there to read, the unended line's too.
        draining = list(before)
        draining[_LOCAL_FLAGS] = before[_LOCAL_FLAGS] & ~termios.ICANON
        draining[_CONTROL_CHARS] = list(before[_CONTROL_CHARS])
        draining[_CONTROL_CHARS][termios.VMIN] = 0  # a read returns what there is, or nothing
        draining[_CONTROL_CHARS][termios.VTIME] = 0
        termios.tcsetattr(fd, termios.TCSANOW, draining)
        typed = b""
        while chunk := os.read(fd, 4096):
            typed += chunk
        asking = list(before)
        asking[_LOCAL_FLAGS] = before[_LOCAL_FLAGS] | termios.ICANON | termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, asking)
        yield typed.decode("utf-8", "replace")
    finally:
        with contextlib.suppress(termios.error):  # the terminal went away: nothing to restore
            termios.tcsetattr(fd, termios.TCSANOW, before)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@dataclass
class TerminalAsker:
    """``loopd.approvals.call.Asker`` on the terminal; ``who`` is the local user."""

    who: str
    write: Callable[[str], None] = field(default=_write)
    read_line: Callable[[threading.Event], str] = field(default=read_terminal_line)
    answering: Callable[[], AbstractContextManager[str]] = field(default=answering_on_terminal)
    # What was typed ahead of a question goes to the next prompt (``LineInput.offer``).
    give_back: Callable[[str], None] = field(default=lambda typed: None)

    @property
    def people(self) -> frozenset[str]:
        return frozenset({self.who})

    async def decide(self, call: AskedCall, wait_s: float) -> Decision | None:
        self.write(question(call, wait_s))
        stop, left = threading.Event(), threading.Event()
        answer: str | None = None
        try:
            with anyio.move_on_after(wait_s):
                answer = await anyio.to_thread.run_sync(
                    self._answer, stop, left, abandon_on_cancel=True
                )
        finally:
            stop.set()  # the reader leaves within POLL_S, the terminal as the turn had it
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(left.wait)
        if answer is None:
            self.write("\n")
            return None
        allowed = answer.strip().lower() in ("y", "yes")
        return Decision("allow" if allowed else "deny", f"@{self.who}")

    async def tell(self, call: AskedCall, decision: Decision) -> None:
        self.write(for_terminal(decision_line(decision)) + "\n")

    def _answer(self, stop: threading.Event, left: threading.Event) -> str:
        """In a worker thread: the line typed after the question was drawn."""
        try:
            with self.answering() as typed_ahead:
                if typed_ahead:
                    self.give_back(typed_ahead.removesuffix("\n"))
                return self.read_line(stop)
        finally:
            left.set()
