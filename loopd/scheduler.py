"""Shares the harness's slots between sessions: one generation per slot at a time.

A session keeps one slot for life (moving a pinned session costs a full re-read: docs/design,
behaviour (d), measured by tests/contract/test_contract_slots.py), so sessions on one slot wait
for each other in FIFO order, while different slots run at once. FIFO is also the fairness rule: a
session that just ran and comes back joins the end of the line, behind every session already
waiting. Where the server places requests itself (``loopd.engine.pinning``) a slot here is a
*lane*: the lanes bound how many of loopd's turns run at once, the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

PositionCallback = Callable[[int], None]
"""Told how many sessions are ahead (0: the slot is ours), whenever that changes."""


@dataclass(eq=False)
class _Waiter:
    session: str
    on_position: PositionCallback
    granted: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class _Line:
    slot: int
    holder: str | None = None
    waiting: deque[_Waiter] = field(default_factory=deque)


class Scheduler:
    """Per-slot FIFO queues of sessions."""

    def __init__(self) -> None:
        self._lines: dict[int, _Line] = {}
        self._idle_listeners: list[Callable[[int], None]] = []

    def on_idle(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(slot)`` whenever a slot is released with nobody waiting for it."""
        self._idle_listeners.append(listener)

    @asynccontextmanager
    async def slot(
        self, session: str, slot: int, on_position: PositionCallback = lambda ahead: None
    ) -> AsyncIterator[None]:
        """Hold ``slot`` for ``session`` for the block; waits behind earlier sessions."""
        line = self._lines.setdefault(slot, _Line(slot))
        await self._acquire(line, session, on_position)
        try:
            yield
        finally:
            # Not held when a wait to hold it again (``stepped_aside``) was cancelled.
            if line.holder == session:
                self._release(line)

    @asynccontextmanager
    async def stepped_aside(
        self, session: str, slot: int, on_position: PositionCallback = lambda ahead: None
    ) -> AsyncIterator[None]:
        """Inside ``slot``: while the block runs (a wait for a person, not for the server) the
        slot goes to the next in line; then ``session`` holds it again, queued behind those
        already waiting, as any session that comes back is."""
        line = self._lines[slot]
        if line.holder != session:
            yield
            return
        self._release(line)
        try:
            yield
        finally:
            await self._acquire(line, session, on_position)

    async def _acquire(self, line: _Line, session: str, on_position: PositionCallback) -> None:
        if line.holder is None and not line.waiting:
            line.holder = session
        else:
            waiter = _Waiter(session, on_position)
            line.waiting.append(waiter)
            self._announce(line)
            try:
                await waiter.granted.wait()
            except BaseException:
                if waiter.granted.is_set():
                    self._release(line)  # granted as we were cancelled: pass it on
                else:
                    line.waiting.remove(waiter)
                    self._announce(line)
                raise
        on_position(0)

    def position(self, session: str, slot: int) -> int | None:
        """Sessions ahead of ``session`` on ``slot`` (0 when it holds it); None if not there."""
        line = self._lines.get(slot)
        if line is None:
            return None
        if line.holder == session:
            return 0
        for index, waiter in enumerate(line.waiting):
            if waiter.session == session:
                return index + 1
        return None

    def holder(self, slot: int) -> str | None:
        line = self._lines.get(slot)
        return None if line is None else line.holder

    def idle(self) -> bool:
        """Nothing holds or waits for any slot."""
        return all(line.holder is None and not line.waiting for line in self._lines.values())

    def _release(self, line: _Line) -> None:
        line.holder = None
        if line.waiting:
            waiter = line.waiting.popleft()
            line.holder = waiter.session
            waiter.granted.set()
            self._announce(line)
        else:
            for listener in self._idle_listeners:
                listener(line.slot)

    @staticmethod
    def _announce(line: _Line) -> None:
        for index, waiter in enumerate(line.waiting):
            waiter.on_position(index + 1)
