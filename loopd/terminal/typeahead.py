"""Keys typed while an answer streams: kept for the next prompt, not drawn inside the answer.

Between prompts the terminal is in its ordinary (cooked) mode, in which the terminal itself echoes
every key where the cursor is, the middle of the answer being written. So while a turn runs its
echo is off (``termios``: ``ECHO`` and ``ECHONL`` cleared, nothing else). The keys wait in the
terminal's input as before, and readline, which draws its line itself, shows them on the next
prompt once the answer has ended; a line ended with Enter is sent as the next message. Ctrl-C
still stops the turn (``ISIG`` is left on). The mode is set with ``TCSANOW``, which keeps what is
waiting (``TCSAFLUSH`` would drop it).
"""

from __future__ import annotations

import contextlib
import termios
from collections.abc import Iterator
from typing import TextIO

_LOCAL_FLAGS = 3  # the index of ``lflag`` in tcgetattr's list


@contextlib.contextmanager
def typed_keys_unechoed(stream: TextIO) -> Iterator[None]:
    """While the block runs, the terminal ``stream`` reads from echoes nothing; as it was after.
    Not a terminal (a pipe, a file): nothing to do."""
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
    quiet[_LOCAL_FLAGS] = before[_LOCAL_FLAGS] & ~(termios.ECHO | termios.ECHONL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):  # the terminal went away: nothing to restore
            termios.tcsetattr(fd, termios.TCSANOW, before)
