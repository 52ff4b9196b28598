"""Reading the user's messages: readline on a terminal, lines from a pipe otherwise.

On a terminal the line can be edited (arrow keys, Home/End, Ctrl-R history search), history is
kept in a file in the state dir, and bracketed paste is on: the terminal marks a paste, readline
inserts it whole (newlines included) and Enter sends it as one message. CPython's readline module
turns bracketed paste off for its own prompt; loopd turns it back on. A paste of several lines is
kept in this run's history but not written to the history file, which holds one entry a line.

Tab completes the word before the cursor with what ``complete_with`` was given (words are split at
whitespace only, so a session name such as ``mm:abc-1`` completes whole). ``offer`` puts a line
on the next prompt, edited or sent with Enter as if typed (several offers before a prompt: one
after the other).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

# The words that may follow the text before the cursor.
Completer = Callable[[str], list[str]]

PROMPT = "you> "
HISTORY_LENGTH = 1000


class LineInput(Protocol):
    def read(self) -> str | None:
        """The next message; None at the end of input (Ctrl-D). Ctrl-C raises
        KeyboardInterrupt."""

    def offer(self, text: str) -> None:
        """Have ``text`` on the next line, ready to send (where lines are typed)."""


class PipedInput:
    """One message a line, from a pipe or a file."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def read(self) -> str | None:
        return self.stream.readline() or None

    def offer(self, text: str) -> None:
        """A pipe's lines are written beforehand: nothing to offer them."""


class TerminalInput:
    """readline, with its history in ``history_path``."""

    def __init__(self, history_path: Path) -> None:
        import readline  # here: only a terminal needs it, and it sets the terminal up on import

        self.readline = readline
        self.history_path = history_path
        self._complete: Completer = lambda before: []
        self._found: list[str] = []
        self._offered = ""
        readline.parse_and_bind("set enable-bracketed-paste on")
        readline.parse_and_bind("tab: complete")
        readline.set_completer_delims(" \t\n")
        readline.set_completer(self._completion)
        readline.set_history_length(HISTORY_LENGTH)
        with contextlib.suppress(OSError):  # no history yet, or unreadable: start without
            readline.read_history_file(history_path)
            if readline.get_current_history_length() >= HISTORY_LENGTH:
                readline.write_history_file(history_path)  # cut to the last HISTORY_LENGTH

    def complete_with(self, complete: Completer) -> None:
        self._complete = complete

    def offer(self, text: str) -> None:
        self._offered += text

        def insert() -> None:
            self.readline.insert_text(self._offered)
            self._offered = ""
            self.readline.redisplay()
            self.readline.set_pre_input_hook(None)  # for the next line only

        self.readline.set_pre_input_hook(insert)

    def _completion(self, word: str, state: int) -> str | None:
        """readline's completer: called with state 0, 1, ... for the candidates of ``word``."""
        if state == 0:
            before = self.readline.get_line_buffer()[: self.readline.get_endidx()]
            self._found = self._complete(before)
        return self._found[state] if state < len(self._found) else None

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
