"""How much of the disk a session's workspace may take, and the room kept for everyone else.

A file cap (``RLIMIT_FSIZE``) bounds each file, not a workspace: many files under it can fill the
filesystem, and when that one also holds the session log every session's next append fails
(``SQLITE_FULL``). So each workspace has a quota (``LOOPD_WORKSPACE_MAX_BYTES``), and the
filesystem that holds it keeps a reserve free (``LOOPD_DISK_RESERVE_BYTES``): room for the session
log to record what happened, whatever a command does. loopd enforces both, outside the sandbox:

- a command starts with its file size limit lowered to the room left (none left: no file may
  grow, but files can still be deleted), so no single file passes the quota;
- while it runs, loopd measures the workspace and the free space every ``POLL_S`` (less often
  where measuring takes long: at most a tenth of the time), and stops the command once either is
  passed and the workspace holds more than when the command started (many files, each under the
  limit): a command started past a bound runs on, so that it can delete files to make room;
- write_file and edit_file refuse a write that would pass them;
- every result over the quota says so in one line, naming the setting.

A command that writes faster than it is measured can still fill the disk. So the state folder
also holds a reserve file (``ReserveFile``, 8 MiB allocated): after each core tool call, when its
disk has less than that free, loopd deletes it, so that the session log has the room to record
the call and its result; it is made again once the disk has room.

``usage`` is the allocated size (``st_blocks``), which is what fills a disk, counting every file
and folder once; symbolic links are not followed.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loopd.tools.workspace import describe_size

log = logging.getLogger(__name__)

POLL_S: Final = 0.1
RESERVE_FILE: Final = "disk-reserve"
RESERVE_FILE_BYTES: Final = 8 * 1024**2
_CHUNK: Final = 1024**2
_QUOTA: Final = "LOOPD_WORKSPACE_MAX_BYTES"
_RESERVE: Final = "LOOPD_DISK_RESERVE_BYTES"


def usage(root: Path) -> int:
    """Bytes allocated under ``root`` (files and folders, hard links once)."""
    total, seen, stack = 0, set(), [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # gone meanwhile, or unreadable: nothing of it counts
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def free_bytes(root: Path) -> int:
    """Free bytes of the filesystem holding ``root``."""
    return shutil.disk_usage(root).free


@dataclass(frozen=True)
class Quota:
    """A workspace's quota and the filesystem's reserve, in bytes (0: no quota)."""

    max_bytes: int
    reserve_bytes: int

    def room(self, used: int, free: int) -> int:
        """Bytes the workspace may still grow by."""
        room = free - self.reserve_bytes
        if self.max_bytes:
            room = min(room, self.max_bytes - used)
        return max(room, 0)

    def passed(self, used: int, free: int) -> str | None:
        """The one line saying which bound the workspace has passed, or None."""
        after = "no file may grow until files are deleted"
        if self.max_bytes and used > self.max_bytes:
            held, quota = describe_size(used), describe_size(self.max_bytes)
            return f"the workspace holds {held}, past its quota of {quota} ({_QUOTA}): {after}"
        if free < self.reserve_bytes:
            left, kept = describe_size(free), describe_size(self.reserve_bytes)
            return (
                f"the disk of the workspaces has {left} free, under the {kept} kept for the "
                f"session log ({_RESERVE}): {after}"
            )
        return None

    def stop(self, started: int, used: int, free: int) -> str | None:
        """The line that stops a running command, or None: a bound passed while the workspace
        holds more than the ``started`` bytes it held when the command began. What the workspace
        and the disk held before is not the command's doing: it runs on, and may delete files."""
        return self.passed(used, free) if used > started else None

    def refusal(self, used: int, free: int, adding: int) -> str | None:
        """Why writing ``adding`` more bytes is refused, or None."""
        if adding <= self.room(used, free):
            return None
        size = describe_size(adding)
        if self.max_bytes and used + adding > self.max_bytes:
            total, quota = describe_size(used + adding), describe_size(self.max_bytes)
            return (
                f"writing {size} would take the workspace to {total}, past its quota of {quota} "
                f"({_QUOTA}); delete files first"
            )
        kept = describe_size(self.reserve_bytes)
        return (
            f"writing {size} would leave the disk of the workspaces under the {kept} kept for the "
            f"session log ({_RESERVE})"
        )


@dataclass(frozen=True)
class ReserveFile:
    """Room kept on the state's disk for the session log: a file deleted when the disk is full."""

    path: Path
    size: int = RESERVE_FILE_BYTES

    def after_tool(self) -> None:
        """Delete the file when the disk has less than its size free, else make sure it is there
        (blocking: run it in a thread)."""
        try:
            free = free_bytes(self.path.parent)
            if free < self.size:
                if self.path.exists():
                    self.path.unlink()
                    log.error(
                        "the disk of %s has %s free: its reserve of %s is released so that the "
                        "session log can record what happened; free space on it",
                        self.path.parent,
                        describe_size(free),
                        describe_size(self.size),
                    )
            elif not self.path.exists() and free >= 2 * self.size:
                self._make()
        except OSError as exc:
            log.warning("the disk reserve %s could not be kept: %s", self.path, exc)

    def _make(self) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        with partial.open("wb") as file:
            try:
                os.posix_fallocate(file.fileno(), 0, self.size)
            except OSError:  # a filesystem without fallocate: write it
                for _ in range(self.size // _CHUNK):
                    file.write(bytes(_CHUNK))
        partial.replace(self.path)
