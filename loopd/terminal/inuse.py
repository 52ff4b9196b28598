"""One terminal at a time on a session: two chats on the same session would interleave their turns.

A terminal that has a session holds an exclusive ``flock`` on a file of its own under
``$LOOPD_STATE_DIR/locks`` (named by a digest of the session's name, which may hold anything);
the system lets it go when the process ends, however it ends, so a killed chat leaves no stale
lock. A second ``loopd chat`` or ``loopd run`` on that session is refused with one line naming the
process that has it (``SessionInUse``); ``/resume`` and ``/new`` to it likewise.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Final

from loopd.errors import LoopdError

FOLDER: Final = "locks"


class SessionInUse(LoopdError):
    def __init__(self, name: str, holder: str) -> None:
        self.name = name
        by = f" (process {holder})" if holder else ""
        super().__init__(
            f"session {name!r} is in use by another loopd chat or run{by}; finish there, or "
            "open another session (--session NAME)"
        )


class SessionLocks:
    """The lock of the one session this terminal has."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / FOLDER
        self._held: tuple[str, int] | None = None

    def take(self, name: str) -> None:
        """Hold ``name`` (and let go of the session held before); ``SessionInUse`` when another
        process holds it, and then the session held before stays held."""
        if self._held is not None and self._held[0] == name:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise SessionInUse(name, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.release()
        self._held = (name, fd)

    def release(self) -> None:
        if self._held is not None:
            with contextlib.suppress(OSError):
                os.close(self._held[1])  # closing the descriptor lets go of the lock
            self._held = None
