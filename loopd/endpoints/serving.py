"""Turns on several servers: the I/O shell around ``Fleet`` (placement and health, pure).

Each ``[[endpoint]]`` table gets its own client, context budget and slot queue. A turn is placed
(``Fleet.place``) and run on its endpoint like a one-server turn, its requests naming the endpoint
in the log. When a turn ends without an answer in a way that shows its server dead, not busy
(``health.endpoint_dead``: nothing answers, or the stream was cut and ``/health`` no longer
answers), the endpoint is marked down and the same turn is placed again at once: the session moves
to an endpoint that is up, and its first request there, which re-reads the whole prompt, is
recorded with the cause ``endpoint lost``. The log is the truth, so the moved turn sends the
conversation as stored: the user's message is answered once, on the new endpoint. A down endpoint
is self-tested again in the background (``selftest.endpoints.recheck_down``); once it passes, new
sessions are placed on it again. Sessions that moved stay where they are (their cache is there).
Every front end starts here (``start_checked``, or ``start`` after ``loopd serve``'s own
``check_at_start``: ``loopd.endpoints.start``), and with LOOPD_PREWARM the idle sessions of an
endpoint that went down are moved and read on their new one at once (``loopd.endpoints.warm``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace

from loopcommon.errors import DaemonError
from loopd.approval import Asker
from loopd.config import EndpointSettings, Settings
from loopd.contextwindow.budget import ServerBudget
from loopd.contextwindow.compaction import Compactor
from loopd.endpoints.fleet import Fleet
from loopd.endpoints.health import endpoint_dead, needs_health_check
from loopd.endpoints.placement import Move, NowhereUp
from loopd.endpoints.runtime import SessionRuntime
from loopd.endpoints.start import NoEndpointUp, StartChecks, check_at_start
from loopd.engine.client import InferenceClient
from loopd.engine.outcome import TurnOutcome
from loopd.engine.pinning import choose_slot
from loopd.engine.progress import StatusCallback
from loopd.engine.turn import Turn
from loopd.prewarm.plan import PrewarmPlan
from loopd.prewarm.prewarmer import Prewarmer, PrewarmResult
from loopd.scheduler import PositionCallback, Scheduler
from loopd.selftest.endpoints import Checker, recheck_down
from loopd.sessionlog.records import Session
from loopd.sessionlog.store import SessionLog

log = logging.getLogger(__name__)

# Told of each prewarm of a moved session: its name and how the prewarm went.
Warmed = Callable[[str, PrewarmResult], None]


@dataclass
class Server:
    """One endpoint's client, budget (its own ``n_ctx``), slot queue, and its prewarms: the
    sessions moved here whose prompt is read back while it is idle (``loopd.endpoints.warm``)."""

    endpoint: EndpointSettings
    client: InferenceClient
    budget: ServerBudget = field(init=False)
    scheduler: Scheduler = field(default_factory=Scheduler)
    plan: PrewarmPlan = field(default_factory=PrewarmPlan)
    prewarmer: Prewarmer = field(init=False)

    def __post_init__(self) -> None:
        self.budget = ServerBudget(self.client)

    def open_prewarm(self, log: SessionLog, *, enabled: bool) -> None:
        self.prewarmer = Prewarmer(
            self.client, log, self.scheduler, enabled=enabled, endpoint=self.name
        )

    @property
    def name(self) -> str:
        return self.endpoint.name


class Endpoints:
    """The servers of an ``[[endpoint]]`` configuration, and where each session's turns run."""

    def __init__(
        self,
        servers: Sequence[Server],
        fleet: Fleet,
        check: Checker | None = None,
        slots: Mapping[tuple[str, str], int] = {},
    ) -> None:
        """``slots``: ``SessionLog.endpoint_slots()``, the slot each session keeps on each
        endpoint it ran on."""
        self.servers: dict[str, Server] = {server.name: server for server in servers}
        self.fleet = fleet
        self.check = check
        self._slots = dict(slots)  # (session, endpoint) -> its slot there
        self._up_listeners: list[Callable[[str], None]] = []
        self.warm_listeners: list[Warmed] = []

    @classmethod
    def open(
        cls, settings: Settings, session_log: SessionLog, check: Checker | None = None
    ) -> Endpoints:
        servers = [
            Server(e, InferenceClient(e.url, e.model, connect_s=settings.connect_s))
            for e in settings.endpoints()
        ]
        for server in servers:
            server.open_prewarm(session_log, enabled=settings.prewarm)
        fleet = Fleet([s.name for s in servers], placed=session_log.last_endpoints())
        return cls(servers, fleet, check, session_log.endpoint_slots())

    async def aclose(self) -> None:
        for server in self.servers.values():
            await server.client.aclose()

    def start(self, check: Checker, down: Mapping[str, str]) -> None:
        """Serve with ``check`` as the re-check, the endpoints of ``down`` (name -> why) down
        as the start's self-tests found them."""
        self.check = check
        for name, reason in down.items():
            self.fleet.health.mark_down(name, reason, time.monotonic())

    async def start_checked(self, check: Checker) -> StartChecks:
        """Check every endpoint at once (``loopd.endpoints.start``) and serve with ``check`` as
        the re-check; ``NoEndpointUp`` when none passed (nothing is marked then)."""
        checks = await check_at_start([s.endpoint for s in self.servers.values()], check)
        if checks.none_up:
            raise NoEndpointUp(checks.down)
        self.start(check, checks.down)
        return checks

    def clients(self) -> dict[str, InferenceClient]:
        return {name: server.client for name, server in self.servers.items()}

    def on_up(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` when a down endpoint passes its re-check."""
        self._up_listeners.append(listener)

    def slot_on(self, server: Server, session: str) -> int:
        """The session's slot on ``server``: the one it had there, else the one fewest of the
        sessions now placed there use."""
        key = (session, server.name)
        slot = self._slots.get(key)
        if slot is None or slot not in server.endpoint.slots:
            taken = [
                slot
                for (other, where), slot in self._slots.items()
                if where == server.name and self.fleet.endpoint_of(other) == where
            ]
            slot = self._slots[key] = choose_slot(server.endpoint.slots, taken)
        return slot

    def where(self) -> Mapping[str, tuple[str, int]]:
        """Each session placed since the start: its endpoint and its slot there."""
        found = {}
        for (session, endpoint), slot in self._slots.items():
            if self.fleet.endpoint_of(session) == endpoint:
                found[session] = (endpoint, slot)
        return found

    def on_warmed(self, listener: Warmed) -> None:
        """Call ``listener(session, result)`` after each prewarm of a moved session
        (``loopd.endpoints.warm``)."""
        self.warm_listeners.append(listener)

    async def watch(self) -> None:
        """Re-check down endpoints until cancelled (nothing to do without a checker)."""
        if self.check is None:
            return
        await recheck_down(
            self.fleet.health,
            [server.endpoint for server in self.servers.values()],
            self.check,
            on_up=self._came_up,
        )

    def _came_up(self, name: str) -> None:
        for listener in self._up_listeners:
            listener(name)

    async def run_turn(
        self,
        runtime: SessionRuntime,
        session: Session,
        report: StatusCallback,
        on_position: PositionCallback,
        asker: Asker | None = None,
    ) -> TurnOutcome:
        """The session's turn on its endpoint; on another one if that endpoint proves dead."""
        outcome = TurnOutcome(answer=None, failure="no endpoint is configured")
        for _ in range(len(self.servers)):
            placement = self.fleet.place(session.name)
            if isinstance(placement, NowhereUp):
                down = ", ".join(placement.down)
                return TurnOutcome(
                    answer=None,
                    failure=f"no endpoint is up ({down})",
                )
            name = placement.to if isinstance(placement, Move) else placement.endpoint
            server = self.servers[name]
            moved_from = placement.lost if isinstance(placement, Move) else None
            if moved_from is not None:
                log.warning(
                    "session %s moves from endpoint %s (down) to %s; its prompt is read there",
                    session.name,
                    moved_from,
                    server.name,
                )
            outcome = await self._run_on(runtime, server, session, report, on_position, asker)
            if isinstance(placement, Move):  # its first prompt here: the shared head is read
                self._learn_head(runtime, server.name, session.name, outcome)
            if outcome.answer is not None or not await self._proves_dead(server, outcome):
                return outcome
            reason = outcome.failure or "a request found it dead"
            if self.fleet.health.mark_down(server.name, reason, time.monotonic()):
                log.warning(
                    "endpoint %s is down: %s; its sessions move to the others, it is re-checked "
                    "in the background",
                    server.name,
                    reason,
                )
        return outcome

    async def _run_on(
        self,
        runtime: SessionRuntime,
        server: Server,
        session: Session,
        report: StatusCallback,
        on_position: PositionCallback,
        asker: Asker | None,
    ) -> TurnOutcome:
        slot = self.slot_on(server, session.name)
        # Real work: the server's prewarms give way (one beside a turn slows both), and this
        # session's own turn reads what it needs.
        server.prewarmer.preempt_all()
        server.plan.drop(session.name)
        with runtime.live.turn(session.name, slot, report, on_position) as live:
            turn = replace(self.aim(runtime, server, session, live.report), asker=asker)
            async with AsyncExitStack() as held:
                with self.fleet.waiting(server.name):
                    await held.enter_async_context(
                        server.scheduler.slot(session.name, slot, live.on_position)
                    )
                with self.fleet.running(session.name):
                    try:
                        return live.finished(await turn.run())
                    finally:
                        server.plan.used(session.name, slot)
        raise AssertionError("unreachable")  # pragma: no cover - the block returns

    def aim(
        self, runtime: SessionRuntime, server: Server, session: Session, report: StatusCallback
    ) -> Turn:
        """The one-server turn of ``session``, aimed at ``server`` and its slot there."""
        slot = self.slot_on(server, session.name)
        turn = runtime.turn(session, report)
        turn.client, turn.slot = server.client, slot
        # Pinned or placed by the server as the runtime decided (engine.pinning).
        id_slot = slot if turn.pinned else -1
        turn.settings = replace(turn.settings, model=server.endpoint.model, slot=id_slot)
        turn.gate = Compactor(server.budget, runtime.budget_rules())
        turn.endpoint = server.name  # named in each request's record (the cache-loss rule)
        # Durable sessions are not yet made per endpoint: each server would need its own
        # self-test answer and save folder.
        turn.durable = None
        return turn

    def _learn_head(
        self, runtime: SessionRuntime, endpoint: str, session: str, outcome: TurnOutcome
    ) -> None:
        """A session's first prompt on ``endpoint`` began with the system prompt and tools of
        its epoch; when those are the ones new sessions get, the endpoint holds them now."""
        epoch = runtime.log.current_epoch(session)
        if (epoch.tools_sha256, epoch.system_text) != runtime.new_session_head():
            return
        for record in outcome.requests:  # the first the server counted for
            cache_n, prompt_n = record.perf.cache_n, record.perf.prompt_n
            if cache_n is not None and prompt_n is not None:
                self.fleet.holds_head(endpoint, max(cache_n + prompt_n - 1, 0))
                return

    async def _proves_dead(self, server: Server, outcome: TurnOutcome) -> bool:
        answers: bool | None = None
        if needs_health_check(outcome.cause):
            try:
                answers = await server.client.health()
            except DaemonError:
                answers = False
        return endpoint_dead(outcome.cause, answers)
