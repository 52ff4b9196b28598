"""Reading the user's messages: readline on a terminal, lines from a pipe otherwise.

On a terminal the line can be edited (arrow keys, Home/End, Ctrl-R history search), history is
kept in a file in the state dir, and bracketed paste is on: the terminal marks a paste, readline
inserts it whole (newlines included) and Enter sends it as one message. CPython's readline module
turns bracketed paste off for its own prompt; loopd turns it back on. A paste of several lines is
kept in this run's history but not written to the history file, which holds one entry a line.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol, TextIO

PROMPT = "you> "
HISTORY_LENGTH = 1000


class LineInput(Protocol):
    def read(self) -> str | None:
        """The next message; None at the end of input (Ctrl-D). Ctrl-C raises
        KeyboardInterrupt."""


class PipedInput:
    """One message a line, from a pipe or a file."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def read(self) -> str | None:
        return self.stream.readline() or None


class TerminalInput:
    """readline, with its history in ``history_path``."""

    def __init__(self, history_path: Path) -> None:
        import readline  # here: only a terminal needs it, and it sets the terminal up on import

        self.readline = readline
        self.history_path = history_path
        readline.parse_and_bind("set enable-bracketed-paste on")
        readline.set_history_length(HISTORY_LENGTH)
        with contextlib.suppress(OSError):  # no history yet, or unreadable: start without
            readline.read_history_file(history_path)
            if readline.get_current_history_length() >= HISTORY_LENGTH:
                readline.write_history_file(history_path)  # cut to the last HISTORY_LENGTH

    def read(self) -> str | None:
        try:
            text = input(PROMPT)
        except EOFError:
            return None
        if text.strip() and "\n" not in text:
            with contextlib.suppress(OSError):  # history is a convenience; never fail for it
                if not self.history_path.exists():
                    self.history_path.touch(mode=0o600)
                self.readline.append_history_file(1, self.history_path)
        return text
