"""What llama-server says it did with its slots and caches for one request, from its trace log.

Started with ``-lv 4`` (trace), llama-server build 11434 logs, per request: how it chose the slot
(``selected slot by id / LCP similarity / LRU``), whether it saved the slot's prompt to the host
prompt cache and loaded a better one from it, which context checkpoint it restored (a hybrid
model's recurrent state can only go back to one), and which idle slots it cleared when the task
launched (``--cache-idle-slots`` on a unified pool). :func:`parse` reads those lines into
:class:`ServerSteps`; :class:`LogFollower` hands out the lines each request added to the log.

The lines come from ``tools/server/server-context.cpp`` and ``server-task.cpp`` of build 11434
(``get_available_slot``, ``process_single_task``, ``server_prompt_cache::load``, the checkpoint
search in ``update_slots``); another build may word them differently, so the benchmark reports a
request whose lines it cannot read as such rather than guessing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import BenchError

_SLOT = r"id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \|"
_SELECTED = re.compile(_SLOT + r" selected slot by (?P<how>id|LCP similarity|LRU)")
_EMPTY = re.compile(_SLOT + r"\s+- skipping, slot is empty")
_LAUNCH = re.compile(_SLOT + r" processing task")
_CLEARED = re.compile(_SLOT + r" clearing prompt with (?P<tokens>\d+) tokens")
_NEW_PROMPT = re.compile(_SLOT + r" new prompt, .*task\.n_tokens = (?P<tokens>\d+)")
_CHECKPOINT = re.compile(_SLOT + r" restored context checkpoint \(.*n_tokens = (?P<tokens>\d+),")
_FULL_REREAD = re.compile(_SLOT + r" forcing full prompt re-processing")
_RELEASE = re.compile(_SLOT + r" stop processing")
_CACHE_LOADED = re.compile(r"found better prompt with f_keep = (?P<keep>[\d.]+)")
_CACHE_UPDATE = re.compile(r"updating prompt cache")
_PURGED = re.compile(r"purging slot (?P<slot>\d+) with (?P<tokens>\d+) tokens")


@dataclass(frozen=True)
class ServerSteps:
    """What the server did for one request (its task), in the order it did it."""

    task: int | None = None
    slot: int | None = None  # the slot that ran it
    selected_by: str = ""  # "id", "LCP similarity", "LRU"; "" if not logged
    pinned_slot_empty: bool = False  # requested by id and found empty: no restore on that path
    cache_updated: bool = False  # the host prompt cache was consulted for this slot
    cache_loaded: bool = False  # ... and a saved prompt was loaded into the slot
    checkpoint: int | None = None  # tokens kept by the restored context checkpoint
    full_reread: bool = False  # no usable checkpoint: everything read again
    prompt_tokens: int | None = None
    # Idle slots this task's launch cleared (slot -> tokens it held); saved to the host cache.
    cleared: dict[int, int] = field(default_factory=dict)
    purged: dict[int, int] = field(default_factory=dict)  # cleared for room, not saved

    @property
    def readable(self) -> bool:
        return self.task is not None and self.slot is not None


def parse(lines: Sequence[str]) -> ServerSteps:
    """The steps of the one request whose lines these are (the router's ``[port]`` prefix and
    lines of other kinds are ignored)."""
    task: int | None = None
    slot: int | None = None
    selected_by = ""
    pinned_empty = cache_updated = cache_loaded = full = False
    checkpoint: int | None = None
    prompt_tokens: int | None = None
    cleared: dict[int, int] = {}
    purged: dict[int, int] = {}
    for line in lines:
        if m := _SELECTED.search(line):
            selected_by = m["how"]
        elif _EMPTY.search(line):
            # After "selected slot by id" the scan looks at the requested slot only.
            pinned_empty = pinned_empty or selected_by == "id"
        elif m := _LAUNCH.search(line):
            task, slot = int(m["task"]), int(m["slot"])
        elif m := _CLEARED.search(line):
            if task is not None and int(m["slot"]) != slot and int(m["tokens"]) > 0:
                cleared[int(m["slot"])] = int(m["tokens"])
        elif m := _NEW_PROMPT.search(line):
            prompt_tokens = int(m["tokens"])
        elif m := _CHECKPOINT.search(line):
            checkpoint = int(m["tokens"])
        elif _FULL_REREAD.search(line):
            full = True
        elif _CACHE_LOADED.search(line):
            cache_loaded = True
        elif _CACHE_UPDATE.search(line):
            cache_updated = True
        elif m := _PURGED.search(line):
            purged[int(m["slot"])] = int(m["tokens"])
    return ServerSteps(
        task=task,
        slot=slot,
        selected_by=selected_by,
        pinned_slot_empty=pinned_empty,
        cache_updated=cache_updated,
        cache_loaded=cache_loaded,
        checkpoint=checkpoint,
        full_reread=full,
        prompt_tokens=prompt_tokens,
        cleared=cleared,
        purged=purged,
    )


class LogFollower:
    """The lines a request adds to the server's log: call :meth:`mark` before sending it and
    :meth:`lines_until_release` after its answer, which waits (polling the file, bounded) for
    the line the server writes when the slot lets go of the task."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def mark(self) -> None:
        self._offset = self.path.stat().st_size

    def lines_until_release(self, timeout_s: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
            data = data[: data.rfind(b"\n") + 1]  # a line still being written waits
            lines = data.decode("utf-8", errors="replace").splitlines()
            if any(_RELEASE.search(line) for line in lines):
                self._offset += len(data)
                return lines
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.path}: no 'stop processing' line within {timeout_s:g} s "
                    "(was the server started with -lv 4?)"
                )
            time.sleep(0.01)  # the router relays its child's log lines a moment later
