"""The server's save folder, kept under the operator's cap: least recently used files go first.

llama-server writes every slot save the box asks for into its ``--slot-save-path`` folder and
never removes one; loopd saves at every turn's end, so without a bound the folder grows until
the disk is full. brokerd runs on the host and can see that folder when the operator names it
(``slot_save_dirs``, with ``slot_save_max_bytes``): before each save it forwards, it removes
loopd's files, least recently used first, until one more state as large as the largest there
fits under the cap, and after the save (whose state may be larger) until the folder is under
the cap again. A save the server answered with success supersedes the session's earlier files
(loopd keeps one save per session and restores only its latest: the older ones would only take
the cap's room from other sessions' latest), and they are removed at once. A file is
used when it is saved (the server writes it) and when brokerd forwards a restore of it (brokerd
then stamps its modification time, before the restore, so the file being read is the last to
go). Only files of loopd's shape count and go: the folder may hold other clients' files, which
are theirs to bound. A router whose models save into several folders shares one cap over all.

``evictions`` is the pure rule; ``SlotFolder`` is its I/O shell.
"""

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio

from loopcommon.slotfiles import is_slot_file_name, parse_slot_file_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedFile:
    path: Path
    size: int
    used_ns: int


def evictions(files: Sequence[SavedFile], cap: int) -> list[SavedFile]:
    """The files to remove, least recently used first, so that the rest total at most ``cap``
    bytes (the newest too, when it alone is over the cap: a cap is a cap)."""
    total = sum(file.size for file in files)
    chosen = []
    for file in sorted(files, key=lambda f: (f.used_ns, f.path.name)):
        if total <= cap:
            break
        chosen.append(file)
        total -= file.size
    return chosen


def superseded(files: Sequence[SavedFile], saved_name: str) -> list[SavedFile]:
    """The files a successful save of ``saved_name`` makes useless: the same session's others."""
    saved = parse_slot_file_name(saved_name)
    if saved is None:
        return []
    return [
        file
        for file in files
        if file.path.name != saved_name
        and (parsed := parse_slot_file_name(file.path.name)) is not None
        and parsed.session_tag == saved.session_tag
    ]


@dataclass
class SlotFolder:
    """The folders one server saves slot states into, and the cap over them all."""

    dirs: tuple[Path, ...]
    max_bytes: int

    def __post_init__(self) -> None:
        self._lock = anyio.Lock()

    def saved_files(self) -> list[SavedFile]:
        files = []
        for folder in self.dirs:
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:
                logger.warning("cannot list the slot save folder %s: %s", folder, exc)
                continue
            for entry in entries:
                if not is_slot_file_name(entry.name):
                    continue
                with contextlib.suppress(OSError):  # removed meanwhile
                    stat = entry.stat(follow_symlinks=False)
                    files.append(SavedFile(Path(entry.path), stat.st_size, stat.st_mtime_ns))
        return files

    def evict_now(self, *, room_for_one: bool = False) -> list[SavedFile]:
        """Remove what the cap calls for; the files removed. ``room_for_one``: also leave room
        for one more state as large as the largest there (before a save)."""
        files = self.saved_files()
        reserve = max((file.size for file in files), default=0) if room_for_one else 0
        chosen = evictions(files, max(self.max_bytes - reserve, 0))
        return _removed(chosen, "slot save folder over its cap")

    def supersede_now(self, saved_name: str) -> list[SavedFile]:
        """``saved_name`` was saved: remove the same session's other files; the files removed."""
        chosen = superseded(self.saved_files(), saved_name)
        return _removed(chosen, "superseded by the session's new save")

    def mark_used(self, name: str) -> None:
        """Stamp the file ``name`` (in whichever folder holds it) as used now."""
        for folder in self.dirs:
            with contextlib.suppress(OSError):
                os.utime(folder / name, follow_symlinks=False)
                return

    async def evict(self, *, room_for_one: bool = False) -> None:
        # One eviction at a time: two would count the same files and remove more than needed.
        async with self._lock:
            await anyio.to_thread.run_sync(partial(self.evict_now, room_for_one=room_for_one))

    async def supersede(self, saved_name: str) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self.supersede_now, saved_name)

    async def used(self, name: str) -> None:
        await anyio.to_thread.run_sync(self.mark_used, name)


def _removed(files: Sequence[SavedFile], why: str) -> list[SavedFile]:
    """Remove ``files``; those removed, told in one line."""
    removed = []
    for file in files:
        try:
            file.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("cannot remove the saved slot state %s: %s", file.path, exc)
            continue
        removed.append(file)
    if removed:
        freed = sum(file.size for file in removed)
        logger.info(
            "%s: removed %d files (%d bytes)",
            why,
            len(removed),
            freed,
            extra={"fields": {"removed": len(removed), "bytes": freed}},
        )
    return removed
