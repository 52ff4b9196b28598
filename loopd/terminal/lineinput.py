"""Reading the user's messages: readline on a terminal, lines from a pipe otherwise.

On a terminal the line can be edited (arrow keys, Home/End, Ctrl-R history search), history is
kept in a file in the state dir, and bracketed paste is on: the terminal marks a paste, loopd reads
it whole (newlines and control bytes included: ``paste``, a long one drawn as one short line) and
Enter sends it as one message. CPython's readline module turns bracketed paste off for its own
prompt; loopd turns it back on. A paste of several lines is kept in this run's history but not
written to the history file, which holds one entry a line.

While a line is read the terminal's signal keys are keys, so that a pasted byte is never taken for
one: Ctrl-C (leave) and Ctrl-Z (suspend: ``suspend``) are bound in readline (``rlkeys``); a 0x03
or 0x1a byte in a paste is text.

Tab completes the word before the cursor with what ``complete_with`` was given (words are split at
whitespace only, so a session name such as ``mm:abc-1`` completes whole). ``offer`` puts a line
on the next prompt, edited or sent with Enter as if typed (several offers before a prompt: one
after the other).
"""

from __future__ import annotations

import contextlib
import re
import sys
import termios
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, Protocol, TextIO

from loopd.errors import LoopdError
from loopd.terminal import paste
from loopd.terminal.paste import Pastes
from loopd.terminal.rlkeys import GnuReadline
from loopd.terminal.suspend import Suspender

# The words that may follow the text before the cursor.
Completer = Callable[[str], list[str]]

# What stdin's decoding leaves of bytes that are not UTF-8 (``surrogateescape``: U+DC80 to
# U+DCFF), and any other lone surrogate: neither can be stored or sent.
_NOT_TEXT: Final = re.compile("[\ud800-\udfff]")


class NotText(LoopdError):
    """A message that is not text (bytes that are not UTF-8); nothing was sent."""


def checked_text(text: str, what: str = "the message") -> str:
    """``text``, or ``NotText`` naming the first byte that is not UTF-8 and where it is."""
    found = _NOT_TEXT.search(text)
    if found is None:
        return text
    code = ord(found.group())
    at = len(text[: found.start()].encode("utf-8", "surrogateescape"))
    byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
    raise NotText(f"{what} is not UTF-8 text ({byte} at byte {at:,}); nothing was sent")


PROMPT = "you> "
HISTORY_LENGTH = 1000
_CONTROL_CHARS = 6  # the index of ``cc`` in tcgetattr's list
_DISABLED = b"\x00"  # _POSIX_VDISABLE: a control character that no key is


class LineInput(Protocol):
    def read(self) -> str | None:
        """The next message; None at the end of input (Ctrl-D). Ctrl-C raises
        KeyboardInterrupt."""

    def offer(self, text: str) -> None:
        """Have ``text`` on the next line, ready to send (where lines are typed)."""


def read_all(stream: TextIO) -> str:
    """All of ``stream``: bytes that are not UTF-8 kept as lone surrogates for
    ``checked_text`` to name, whatever the locale's own decoding would do with them."""
    raw = getattr(stream, "buffer", None)
    if raw is None:
        return stream.read()
    return str(raw.read().decode("utf-8", "surrogateescape"))


class PipedInput:
    """One message a line, from a pipe or a file; ``NotText`` for a line that is not text."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def read(self) -> str | None:
        raw = getattr(self.stream, "buffer", None)
        line = (
            raw.readline().decode("utf-8", "surrogateescape")
            if raw is not None
            else self.stream.readline()
        )
        return checked_text(line) if line else None

    def offer(self, text: str) -> None:
        """A pipe's lines are written beforehand: nothing to offer them."""


class TerminalInput:
    """readline, with its history in ``history_path``; Ctrl-Z at the prompt asks ``suspender``."""

    def __init__(self, history_path: Path, suspender: Suspender | None = None) -> None:
        import readline  # here: only a terminal needs it, and it sets the terminal up on import

        self.readline = readline
        self.history_path = history_path
        self.suspender = suspender
        self.pastes = Pastes()
        self._complete: Completer = lambda before: []
        self._found: list[str] = []
        self._interrupted = False
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
        self.gnu = GnuReadline.load(readline)
        if self.gnu is not None:
            self.gnu.bind("\\C-c", self._interrupt)
            self.gnu.bind(paste.START.replace("\x1b", "\\e"), self._paste)
            if suspender is not None:
                self.gnu.bind("\\C-z", suspender.suspend)

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

    def _interrupt(self) -> None:
        """Ctrl-C at the prompt: the line ends, and ``read`` raises KeyboardInterrupt."""
        assert self.gnu is not None
        self._interrupted = True
        self.gnu.accept_empty()

    def _paste(self) -> None:
        assert self.gnu is not None
        data, after = paste.read_paste(sys.stdin.fileno())
        text = paste.pasted_text(data)
        self.gnu.insert(self.pastes.keep(text) if paste.is_long(text) else text)
        self.gnu.stuff(after)

    def read(self) -> str | None:
        self._interrupted = False
        with self._signal_keys_as_keys():
            try:
                text = input(PROMPT)
            except EOFError:
                return None
        if self._interrupted:
            raise KeyboardInterrupt
        if text.strip() and "\n" not in text and not self.pastes.holds(text):
            with contextlib.suppress(OSError):  # history is a convenience; never fail for it
                if not self.history_path.exists():
                    self.history_path.touch(mode=0o600)
                self.readline.append_history_file(1, self.history_path)
        return self.pastes.expand(text)

    @contextlib.contextmanager
    def _signal_keys_as_keys(self) -> Iterator[None]:
        """While a line is read: the terminal makes no signal of a key (its interrupt, quit and
        suspend characters off: readline turns ``ISIG`` itself back on), where readline has
        loopd's own Ctrl-C and Ctrl-Z; Ctrl-Z draws the line again on return."""
        if self.gnu is None:
            yield
            return
        fd = sys.stdin.fileno()
        if self.suspender is not None:
            self.suspender.redraw = self.gnu.redraw
        try:
            before = termios.tcgetattr(fd)
        except termios.error:
            before = None
        if before is not None:
            keys = list(before)
            keys[_CONTROL_CHARS] = list(before[_CONTROL_CHARS])
            for char in (termios.VINTR, termios.VQUIT, termios.VSUSP):
                keys[_CONTROL_CHARS][char] = _DISABLED
            termios.tcsetattr(fd, termios.TCSANOW, keys)
        try:
            yield
        finally:
            if before is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(fd, termios.TCSANOW, before)
            if self.suspender is not None:
                self.suspender.redraw = None
