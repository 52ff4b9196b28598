"""Ctrl-Z: the chat stops as any terminal program does, and ``fg`` brings it back as it was.

While stopped, the terminal is as it was when the chat started (the shell's own mode); on return
it is as the chat had it (readline's at the prompt, the typed keys unechoed during a turn), and at
the prompt the line being typed is drawn again. The stop itself is the default action of SIGTSTP,
sent to the chat's process group (its tools' processes stop with it) as the terminal sends it:
the shell that started the chat sees it stopped, and ``fg`` continues it. Under ``make run`` the
script that started the chat stops its own job in turn, so that the shell's ``fg`` reaches it
(``scripts/run.sh``); the servers go on in their own sessions. Where no shell could continue it
(an orphaned process group: no job control), the system ignores the stop and the chat goes on.

Ctrl-Z comes as SIGTSTP during a turn (the terminal's suspend key), and at the prompt as the key
itself, the terminal's signals being off there so that a pasted 0x1a byte is text
(``lineinput``); both end in ``Suspender.suspend``. The signal is taken on the main thread only
(the event loop's threads block it: ``loopd.terminal.link``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import termios
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class Suspender:
    """Suspends the chat on Ctrl-Z; ``redraw``, while set, draws the prompt's line again."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.redraw: Callable[[], None] | None = None
        self._at_start = self._mode()

    def _mode(self) -> list[Any] | None:
        try:
            return termios.tcgetattr(self.fd)
        except termios.error:  # not a terminal
            return None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """SIGTSTP suspends the chat while the block runs."""
        before = signal.signal(signal.SIGTSTP, self._on_signal)
        try:
            yield
        finally:
            signal.signal(signal.SIGTSTP, before)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.suspend()

    def suspend(self) -> None:
        """Stop until continued, with the terminal as the shell had it meanwhile."""
        mode = self._mode()
        sys.stdout.flush()
        if self._at_start is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(self.fd, termios.TCSANOW, self._at_start)
        handler = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(0, signal.SIGTSTP)  # returns once continued (``fg``)
        finally:
            signal.signal(signal.SIGTSTP, handler)
            if mode is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(self.fd, termios.TCSANOW, mode)
        if self.redraw is not None:
            self.redraw()
