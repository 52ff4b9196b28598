"""Prewarm after a move: a session moved off a dead server starts its next turn warm.

When an endpoint is marked down (a request found it dead, or the start's check did), each of its
sessions with no turn under way or pending is placed again at once (``Fleet.place``: a ``Move``,
so the endpoint it goes to counts it from now on) and wanted for a prewarm there. While that
endpoint is idle (``loopd.prewarm.prewarmer``'s rules: no turn of loopd's runs or waits on it, no
slot busy with another client's request) the session's prompt is read there, ``max_tokens`` 1.
That prewarm is the move's one re-read, recorded ``endpoint lost``; the session's next turn reads
only its own tokens. A session moved by its own turn (the turn that found its server dead) needs
none: that turn read its prompt there. A turn on the endpoint cancels its prewarms at once.

Only with ``LOOPD_PREWARM``, as on one server: a prewarm costs the server a read nobody may need.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace

import anyio

from loopcommon.errors import DaemonError
from loopd.endpoints.placement import Move
from loopd.endpoints.runtime import SessionRuntime
from loopd.endpoints.serving import Endpoints, Server, Warmed
from loopd.engine.cacheloss import endpoint_changed, previous_request
from loopd.observe.context import request_scope
from loopd.observe.metrics import METRICS
from loopd.prewarm.prewarmer import PrewarmOutcome, PrewarmResult

log = logging.getLogger(__name__)


async def keep_warm(
    endpoints: Endpoints, runtime: SessionRuntime, sessions: Collection[str]
) -> None:
    """Re-check down endpoints, and with LOOPD_PREWARM prewarm those of ``sessions`` (the front
    end's) moved off one, until cancelled."""
    if not runtime.settings.prewarm:
        await endpoints.watch()
        return
    warmer = MoveWarmer(endpoints, runtime, sessions)
    warmer.listeners.extend(endpoints.warm_listeners)
    async with anyio.create_task_group() as tg:
        tg.start_soon(endpoints.watch)
        tg.start_soon(warmer.run)


class MoveWarmer:
    """Moves the idle sessions of an endpoint that went down, and prewarms them where they go."""

    def __init__(
        self, endpoints: Endpoints, runtime: SessionRuntime, sessions: Collection[str]
    ) -> None:
        """``sessions``: the front end's (a terminal's one, a daemon's threads); another
        front end's sessions are its own to prewarm."""
        self.endpoints = endpoints
        self.runtime = runtime
        self.sessions = sessions
        self._wake = {name: anyio.Event() for name in endpoints.servers}
        self.listeners: list[Warmed] = []

    async def run(self) -> None:
        """Until cancelled."""
        fleet = self.endpoints.fleet
        fleet.health.on_down(self.moved_off)
        for server in self.endpoints.servers.values():
            server.scheduler.on_idle(self._waker(server.name))
        for name in fleet.names:  # found down before this ran (the start's check)
            if not fleet.health.is_up(name):
                self.moved_off(name)
        async with anyio.create_task_group() as tg:
            for server in self.endpoints.servers.values():
                tg.start_soon(self._serve, server)

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
            if fleet.is_running(name) or not self.runtime.log.state(name).idle:
                continue  # its turn, under way or coming, moves it and reads its prompt
            placement = fleet.place(name)
            if not isinstance(placement, Move):
                continue  # no endpoint up: its next turn says so
            server = self.endpoints.servers[placement.to]
            server.plan.want(name, self.endpoints.slot_on(server, name))
            log.info(
                "session %s moves from endpoint %s (down) to %s; its prompt is read there "
                "once the endpoint is idle",
                name,
                down,
                server.name,
            )
            self._wake[server.name].set()

    async def _serve(self, server: Server) -> None:
        while True:
            self._wake[server.name] = anyio.Event()
            for slot in server.endpoint.slots:
                await self._slot(server, slot)
            await self._wake[server.name].wait()

    async def _slot(self, server: Server, slot: int) -> None:
        name = server.plan.next_for(slot)
        if name is None or not self.endpoints.fleet.health.is_up(server.name):
            return
        # Dropped while it runs, so that one that raises is not tried again and again.
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
        elif self.runtime.log.state(name).idle:
            server.plan.want(name, slot)  # cancelled or skipped: the next idle moment tries again
        for listener in self.listeners:
            listener(name, result)

    async def _prewarm(self, server: Server, name: str, slot: int) -> PrewarmResult:
        session = self.runtime.log.get_session(name)
        turn = self.endpoints.aim(self.runtime, server, session, lambda status: None)
        prev = previous_request(self.runtime.log.latest_request(name, counted=True))
        moved = prev if prev is not None and endpoint_changed(prev.endpoint, server.name) else None
        with request_scope(name):
            result = await server.prewarmer.prewarm(
                replace(session, slot=slot), turn.settings, moved=moved
            )
        METRICS.prewarm_ended(result.outcome.value)
        return result
