"""Prewarms on every server: a session's prompt read into its slot while the server is idle, so
that its next turn starts warm (``loopd.prewarm``; with ``LOOPD_PREWARM`` only, as a prewarm costs
the server a read nobody may need).

A session is wanted for a prewarm on its server (``PrewarmPlan``, pure) when:

- **loopd started again**: nothing is known to be in any slot, so on each server the front end's
  most recently active session of each slot is read back (``restart_wants``), with durable
  sessions its save restored instead;
- **it was compacted** (where sessions are pinned): its turn asks for it
  (``loopd.endpoints.serving``), and the prewarm runs once another session has used its slot;
- **its server died**: when an endpoint is marked down (a request found it dead, or the start's
  check did), each of its sessions with no turn under way or pending is placed again at once
  (``Fleet.place``: a ``Move``, so the endpoint it goes to counts it from now on) and wanted there.
  That prewarm is the move's one re-read, recorded ``endpoint lost``; the session's next turn
  reads only its own tokens. A session moved by its own turn needs none: that turn read its
  prompt there.

Each server's prewarms run while that server is idle (``loopd.prewarm.prewarmer``'s rules: no turn
of loopd's runs or waits on it, no slot busy with another client's request); a turn there cancels
them at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import anyio

from loopcommon.errors import DaemonError
from loopd.endpoints.placement import Move
from loopd.endpoints.server import Server
from loopd.endpoints.serving import Endpoints
from loopd.engine.cacheloss import endpoint_changed, previous_request
from loopd.prewarm.plan import restart_wants
from loopd.prewarm.prewarmer import PrewarmOutcome, PrewarmResult

log = logging.getLogger(__name__)


async def keep_warm(endpoints: Endpoints, sessions: Collection[str]) -> None:
    """Re-check down endpoints, and with LOOPD_PREWARM prewarm those of ``sessions`` (the front
    end's: a terminal's one, a daemon's threads) that are wanted, until cancelled."""
    if not endpoints.settings.prewarm:
        await endpoints.watch()
        return
    warmer = Warmer(endpoints, sessions)
    async with anyio.create_task_group() as tg:
        tg.start_soon(endpoints.watch)
        tg.start_soon(warmer.run)


class Warmer:
    """Runs each server's wanted prewarms whenever that server falls idle."""

    def __init__(self, endpoints: Endpoints, sessions: Collection[str]) -> None:
        """``sessions``: the front end's; another front end's sessions are its own to
        prewarm."""
        self.endpoints = endpoints
        self.sessions = sessions
        self._wake = {name: anyio.Event() for name in endpoints.servers}
        # Each server's slots not yet looked at since it last fell idle (while it is not empty,
        # the warmer has not decided about every idle slot).
        self.unseen: dict[str, set[int]] = {name: set() for name in endpoints.servers}

    async def run(self) -> None:
        """Until cancelled."""
        fleet = self.endpoints.fleet
        self._want_after_restart()
        fleet.health.on_down(self.moved_off)
        for server in self.endpoints.servers.values():
            server.scheduler.on_idle(self._waker(server.name))
        for name in fleet.names:  # found down before this ran (the start's check)
            if not fleet.health.is_up(name):
                self.moved_off(name)
        async with anyio.create_task_group() as tg:
            for name in self.endpoints.servers:
                tg.start_soon(self._serve, name)

    def _want_after_restart(self) -> None:
        """On each server, the most recently active of the front end's sessions of each slot
        (where no turn of its slot is pending: that turn reads its own prompt)."""
        session_log = self.endpoints.log
        for server in self.endpoints.servers.values():
            placed = [
                session
                for session in session_log.sessions()
                if session.name in self.sessions
                and self.endpoints.fleet.endpoint_of(session.name) == server.name
            ]
            slots = {session.name: self.endpoints.slot_on(server, session) for session in placed}
            busy = [
                name
                for name in slots
                if (state := session_log.state(name)).pending_turn or state.interrupted_calls
            ]
            for name, slot in restart_wants(slots, session_log.last_answered(), busy):
                server.plan.want(name, slot)

    def _waker(self, name: str) -> Callable[[int], None]:
        def wake(slot: int) -> None:
            self._wake[name].set()

        return wake

    def moved_off(self, down: str) -> None:
        """``down`` is down: its idle sessions move now, each wanted for a prewarm."""
        fleet = self.endpoints.fleet
        for name in fleet.sessions_on(down):
            if name not in self.sessions:
                continue
            if fleet.is_running(name) or not self.endpoints.log.state(name).idle:
                continue  # its turn, under way or coming, moves it and reads its prompt
            placement = fleet.place(name)
            if not isinstance(placement, Move):
                continue  # no endpoint up: its next turn says so
            server = self.endpoints.servers[placement.to]
            session = self.endpoints.log.get_session(name)
            server.plan.want(name, self.endpoints.slot_on(server, session))
            log.info(
                "session %s moves from endpoint %s (down) to %s; its prompt is read there "
                "once the endpoint is idle",
                name,
                down,
                server.name,
            )
            self._wake[server.name].set()

    async def _serve(self, name: str) -> None:
        while True:
            self._wake[name] = anyio.Event()
            server = self.endpoints.servers[name]
            self.unseen[name].update(server.endpoint.slots)
            while self.unseen[name]:
                slot = min(self.unseen[name])
                self.unseen[name].discard(slot)
                await self._slot(self.endpoints.servers[name], slot)
            await self._wake[name].wait()

    async def _slot(self, server: Server, slot: int) -> None:
        name = server.plan.next_for(slot)
        if name is None or not self.endpoints.fleet.health.is_up(server.name):
            return
        # Dropped while it runs, so that one that raises is not tried again and again (its own
        # release of the slot would bring this loop straight back to it).
        server.plan.drop(name)
        try:
            result = await self._prewarm(server, name, slot)
        except DaemonError:  # optional work: a log or server error must not end the front end
            log.exception("prewarm of %s on endpoint %s failed; prewarm goes on", name, server.name)
            return
        if result.outcome is PrewarmOutcome.DONE:
            server.plan.warmed(name, slot)
        elif result.outcome is PrewarmOutcome.FAILED:
            log.warning(
                "prewarm of %s failed (%s); its next turn reads its prompt", name, result.detail
            )
        elif self.endpoints.log.state(name).idle:
            # Cancelled by another session's work, or skipped while the server was busy: the
            # next idle moment tries again. (A session whose own turn is coming needs none.)
            server.plan.want(name, slot)
        for listener in self.endpoints.warm_listeners:
            listener(name, result)

    async def _prewarm(self, server: Server, name: str, slot: int) -> PrewarmResult:
        session_log = self.endpoints.log
        prev = previous_request(session_log.latest_request(name, counted=True))
        moved = (
            prev
            if prev is not None and endpoint_changed(prev.endpoint, server.recorded_as)
            else None
        )
        return await self.endpoints.prewarm(server, session_log.get_session(name), slot, moved)
