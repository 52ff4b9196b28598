"""Keys typed while an answer streams: kept, not drawn inside the answer, and never lost.

Between prompts the terminal is in its ordinary (cooked) mode, in which the terminal itself echoes
every key where the cursor is, the middle of the answer being written. So while a turn runs its
echo is off (``termios``: ``ECHO`` and ``ECHONL`` cleared) and ``NOFLSH`` is set: Ctrl-C still
stops the turn (``ISIG`` is left on), but no longer throws away what was typed. The mode is set
with ``TCSANOW``, which keeps what is waiting (``TCSAFLUSH`` would drop it).

When the turn has ended, ``take_typed`` reads what was typed meanwhile (the lines ended with Enter,
and the line begun), and ``split_typed`` parts it: the chat shows each ended line as sent and
sends it, and puts the line begun on the next prompt; after a stop (Ctrl-C) everything typed goes
back on the prompt, to send or edit.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import termios
from collections.abc import Iterator
from typing import Final, TextIO

_LOCAL_FLAGS = 3  # the index of ``lflag`` in tcgetattr's list
_CONTROL_CHARS = 6  # ... and of ``cc``
# A key that sends an escape sequence (an arrow, Home, a function key): not text to send.
_KEY_SEQUENCE: Final = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|.)?")


@contextlib.contextmanager
def typed_keys_unechoed(stream: TextIO) -> Iterator[None]:
    """While the block runs, the terminal ``stream`` reads from echoes nothing and a Ctrl-C
    keeps what was typed; as it was after. Not a terminal (a pipe, a file): nothing to do."""
    if not stream.isatty():
        yield
        return
    fd = stream.fileno()
    try:
        before = termios.tcgetattr(fd)
    except termios.error:
        yield
        return
    quiet = list(before)
    quiet[_LOCAL_FLAGS] = (before[_LOCAL_FLAGS] & ~(termios.ECHO | termios.ECHONL)) | termios.NOFLSH
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):  # the terminal went away: nothing to restore
            termios.tcsetattr(fd, termios.TCSANOW, before)


def take_typed(stream: TextIO) -> str:
    """What was typed and not read yet, the line begun included (the terminal holds it back
    from a read until Enter, but not in non-canonical mode, which this read uses for a moment).
    "" for a pipe, or when nothing was typed."""
    if not stream.isatty():
        return ""
    fd = stream.fileno()
    try:
        before = termios.tcgetattr(fd)
    except termios.error:
        return ""
    raw = list(before)
    raw[_LOCAL_FLAGS] = before[_LOCAL_FLAGS] & ~(termios.ICANON | termios.ECHO | termios.ECHONL)
    raw[_CONTROL_CHARS] = list(before[_CONTROL_CHARS])
    raw[_CONTROL_CHARS][termios.VMIN] = 0
    raw[_CONTROL_CHARS][termios.VTIME] = 0
    typed = bytearray()
    try:
        termios.tcsetattr(fd, termios.TCSANOW, raw)
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            typed += chunk
    except (termios.error, OSError):
        pass
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, before)
    return typed.decode("utf-8", "replace")


def split_typed(typed: str) -> tuple[list[str], str]:
    """(the lines ended with Enter, the line begun) of what was typed, without the escape
    sequences of editing keys. Pure."""
    text = _KEY_SEQUENCE.sub("", typed.replace("\r\n", "\n").replace("\r", "\n"))
    *ended, begun = text.split("\n")
    return [line for line in ended if line.strip()], begun
