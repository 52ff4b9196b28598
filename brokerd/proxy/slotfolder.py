"""The server's save folder, kept under the operator's cap: brokerd's own saves only, least
recently used first.

llama-server writes every slot save the box asks for into its ``--slot-save-path`` folder and
never removes one; loopd saves at every turn's end, so without a bound the folder grows until
the disk is full. brokerd runs on the host and can see that folder when the operator names it
(``slot_save_dirs``, with ``slot_save_max_bytes``).

The folder may be shared with other clients of the same server (another loopd deployment,
another harness), whose files can have loopd's shape too, even a session's name of this box's.
So brokerd touches only the files it forwarded a save of: it records each such name, before the
save goes on, in a ledger of its own beside them (``.brokerd-<16 hex>.saves``, the hex naming this
client: its host, account and socket; a name of another shape than loopd's, so no box can have the
server write it), and forgets a name once its file is gone. Only those files count towards the
cap and only they are removed; another client's files are never counted, stamped or removed.

Before each save it forwards, brokerd removes its files, least recently used first, until one
more state as large as the largest of them fits under the cap, and after the save (whose state
may be larger) until they are under the cap again. A save the server answered with success
supersedes the session's earlier files (loopd keeps one save per session and restores only its
latest: the older ones would only take the cap's room from other sessions' latest), and they are
removed at once. A file is used when it is saved (the server writes it) and when brokerd forwards
a restore of it (brokerd then stamps its modification time, before the restore, so the file
being read is the last to go). A router whose models save into several folders shares one cap
over all, and one ledger (in the first folder).

A session moves to another server when its own dies (loopd's ``[[endpoint]]`` tables), and its
latest save should follow it: a restore of a file of brokerd's own that this server's folders do
not hold, but another server's folders do (``peers``: the other endpoints' folders, each with
its ledger), is first copied into this server's first folder under the same name (the name
holds the model's fingerprint, so loopd asks for it only on a server of the same weights), and
recorded here as this client's. The copy is written beside its final name and renamed, so a
restore never reads half of one.

``evictions`` and ``superseded`` are the pure rules; ``SlotFolder`` is their I/O shell.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

import anyio

from loopcommon.slotfiles import is_slot_file_name, parse_slot_file_name

logger = logging.getLogger(__name__)

LEDGER_VERSION: Final = 1


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


def ledger_name(client: str) -> str:
    """The ledger's file name for ``client`` (what tells this brokerd from another client)."""
    return f".brokerd-{hashlib.sha256(client.encode()).hexdigest()[:16]}.saves"


@dataclass
class SlotFolder:
    """The folders one server saves slot states into, the cap over this client's files in them
    all, and the ledger of those files. ``client`` names this brokerd among the folder's
    clients (``brokerd.serve`` gives its host, account and socket)."""

    dirs: tuple[Path, ...]
    max_bytes: int
    client: str = "brokerd"
    # The other servers' folders of this brokerd (``brokerd.serve`` links them): where a moved
    # session's save is copied from.
    peers: list[SlotFolder] = field(default_factory=list, init=False)
    _names: set[str] = field(default_factory=set, init=False)
    _saving: set[str] = field(default_factory=set, init=False)  # forwarded, not answered yet

    def __post_init__(self) -> None:
        self._lock = anyio.Lock()
        self.ledger = self.dirs[0] / ledger_name(self.client)
        self._names = self._load()

    # -- the ledger ---------------------------------------------------------------------------

    def _load(self) -> set[str]:
        try:
            data = json.loads(self.ledger.read_bytes())
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as exc:
            data = f"unreadable ({exc})"
        names = data.get("names") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
            logger.warning(
                "the slot save ledger %s is not one brokerd wrote; its files are left alone, and "
                "a new ledger is started",
                self.ledger,
            )
            return set()
        return {name for name in names or () if isinstance(name, str) and is_slot_file_name(name)}

    def _store(self) -> None:
        """Write the ledger whole, in place of the old one (a crash leaves one or the other)."""
        data = {"version": LEDGER_VERSION, "client": self.client, "names": sorted(self._names)}
        temporary = self.ledger.with_name(self.ledger.name + ".tmp")
        try:
            temporary.write_text(json.dumps(data, indent=0) + "\n", encoding="utf-8")
            os.replace(temporary, self.ledger)
        except OSError as exc:
            logger.warning("cannot write the slot save ledger %s: %s", self.ledger, exc)

    @property
    def names(self) -> frozenset[str]:
        """The files this client forwarded a save of, and that were there when last looked."""
        return frozenset(self._names)

    def forwarded_now(self, name: str) -> None:
        """A save of ``name`` is about to be forwarded: the file is this client's from now."""
        if name not in self._names and is_slot_file_name(name):
            self._names.add(name)
            self._store()

    def _forget(self, names: Iterable[str]) -> None:
        gone = self._names & set(names)
        if gone:
            self._names -= gone
            self._store()

    # -- the files ------------------------------------------------------------------------------

    def saved_files(self) -> list[SavedFile]:
        """This client's files, as they are now; a name whose file is gone (and whose save is
        not under way) is forgotten."""
        files = []
        found: set[str] = set()
        for folder in self.dirs:
            for name in sorted(self._names):
                with contextlib.suppress(OSError):  # not in this folder, or removed meanwhile
                    stat = (folder / name).lstat()
                    files.append(SavedFile(folder / name, stat.st_size, stat.st_mtime_ns))
                    found.add(name)
        self._forget(self._names - found - self._saving)
        return files

    def evict_now(self, *, room_for_one: bool = False) -> list[SavedFile]:
        """Remove what the cap calls for; the files removed. ``room_for_one``: also leave room
        for one more state as large as the largest there (before a save)."""
        files = self.saved_files()
        reserve = max((file.size for file in files), default=0) if room_for_one else 0
        chosen = evictions(files, max(self.max_bytes - reserve, 0))
        return self._removed(chosen, "slot save folder over its cap")

    def supersede_now(self, saved_name: str) -> list[SavedFile]:
        """``saved_name`` was saved: remove the same session's other files; the files removed."""
        chosen = superseded(self.saved_files(), saved_name)
        return self._removed(chosen, "superseded by the session's new save")

    def holding(self, name: str) -> Path | None:
        """The file ``name`` of this client's, where one of these folders holds it."""
        if name not in self._names:
            return None
        for folder in self.dirs:
            if (folder / name).is_file():
                return folder / name
        return None

    def copy_from_peer(self, name: str) -> Path | None:
        """Copy this client's file ``name`` from another server's folder into this one's (see
        the module doc); the copy, or None when no peer holds it (or these folders already
        do)."""
        if not is_slot_file_name(name) or self.holding(name) is not None:
            return None
        source = next((p for peer in self.peers if (p := peer.holding(name)) is not None), None)
        if source is None:
            return None
        if source.parent.resolve() in {folder.resolve() for folder in self.dirs}:
            self.forwarded_now(name)  # a folder both servers save into: nothing to copy
            return source
        target = self.dirs[0] / name
        partial = target.with_name(f".{name}.copy")
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        except OSError as exc:
            logger.warning("cannot copy the saved slot state %s into %s: %s", source, target, exc)
            with contextlib.suppress(OSError):
                partial.unlink()
            return None
        self.forwarded_now(name)
        logger.info(
            "copied the saved slot state %s from %s for a session that moved here",
            name,
            source.parent,
            extra={"fields": {"bytes": target.stat().st_size}},
        )
        return target

    def mark_used(self, name: str) -> None:
        """Stamp the file ``name`` (in whichever folder holds it) as used now, when it is this
        client's."""
        if name not in self._names:
            return
        for folder in self.dirs:
            with contextlib.suppress(OSError):
                os.utime(folder / name, follow_symlinks=False)
                return

    def _removed(self, files: Sequence[SavedFile], why: str) -> list[SavedFile]:
        """Remove ``files``; those removed, told in one line. A name no folder holds any more
        is forgotten."""
        removed = _removed(files, why)
        names = {file.path.name for file in files}
        self._forget(n for n in names if not any((d / n).exists() for d in self.dirs))
        return removed

    # -- off the event loop, one change at a time -------------------------------------------------

    async def forwarding_save(self, name: str) -> None:
        """Before a save of ``name`` is forwarded: record it, and make room for it."""
        async with self._lock:
            self._saving.add(name)
            await anyio.to_thread.run_sync(self.forwarded_now, name)
            await anyio.to_thread.run_sync(partial(self.evict_now, room_for_one=True))

    async def save_answered(self, name: str, *, succeeded: bool) -> None:
        """After the server answered a save of ``name``: a success supersedes the session's
        earlier files; whatever the answer, the cap is kept (a save answered with an error may
        still have written)."""
        async with self._lock:
            self._saving.discard(name)
            if succeeded:
                await anyio.to_thread.run_sync(self.supersede_now, name)
            await anyio.to_thread.run_sync(self.evict_now)

    async def used(self, name: str) -> None:
        await anyio.to_thread.run_sync(self.mark_used, name)

    async def restoring(self, name: str) -> None:
        """Before a restore of ``name`` is forwarded: copied from another server's folder where
        only that one holds it (a moved session), kept under the cap, and stamped as used."""
        async with self._lock:
            if await anyio.to_thread.run_sync(self.copy_from_peer, name) is not None:
                await anyio.to_thread.run_sync(self.evict_now)
        await self.used(name)


def link_peers(folders: Sequence[SlotFolder]) -> None:
    """Each server's folder learns the others' (one brokerd, several ``[[endpoint]]`` tables)."""
    for folder in folders:
        folder.peers = [other for other in folders if other is not folder]


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
