"""Where every turn runs: the one path of a turn, on one server or several.

The servers are the ``[[endpoint]]`` tables, or the shorthand's one server (a fleet of one,
``loopd.endpoints.server``). A turn is placed (``Fleet.place``, pure) and run on its endpoint: the
session waits for its slot there (FIFO behind the other sessions of the slot, ``loopd.scheduler``),
every prewarm on that server gives way, and the turn is built from the server as it is known now
(``build_turn``). A wait for a person's approval hands the slot to the next session meanwhile
(``loopd.approvals.call.Stepped``). After a compaction, where sessions are pinned, the session is
wanted for a prewarm once another has used its slot (``loopd.endpoints.warm``).

When a turn ends without an answer in a way that shows its server dead, not busy
(``health.endpoint_dead``: nothing answers, or the stream was cut and ``/health`` no longer
answers), and the fleet has another endpoint, the endpoint is marked down and the same turn is
placed again at once: the session moves to an endpoint that is up, and its first request there,
which re-reads the whole prompt, is recorded with the cause ``endpoint lost`` (with durable
sessions on a server of the same model, its save is restored there first instead:
``loopd.turn.saves``, ``moved with its save``). The log is the
truth, so the moved turn sends the conversation as stored: the user's message is answered once,
on the new endpoint. A down endpoint is checked again in the background (``start.recheck_down``);
once it passes, new sessions are placed on it again, and what its check found is what is known of
it. Sessions that moved stay where they are (their cache is there). A fleet of one has nowhere to
move to: its server is never marked down by a turn, and the next turn tries it again at once.
Every front end starts here (``start_checked``, or ``start`` after ``loopd serve``'s own
self-tests: ``loopd.endpoints.start``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from loopcommon.errors import DaemonError
from loopd.approvals.call import Asker, Stepped
from loopd.config import SHORTHAND_ENDPOINT, Settings
from loopd.endpoints.fleet import Fleet
from loopd.endpoints.health import endpoint_dead, needs_health_check
from loopd.endpoints.placement import Move, NowhereUp
from loopd.endpoints.server import Server, TurnRules, build_turn, known
from loopd.endpoints.start import NoEndpointUp, StartChecks, check_at_start, recheck_down
from loopd.engine.cacheloss import PrevRequest
from loopd.engine.client import InferenceClient
from loopd.engine.outcome import TurnOutcome
from loopd.engine.pinning import choose_slot
from loopd.engine.progress import StatusCallback
from loopd.observe.live import LiveTurn, LiveTurns
from loopd.observe.metrics import METRICS
from loopd.prewarm.prewarmer import PrewarmResult
from loopd.requestscope import request_scope
from loopd.scheduler import PositionCallback
from loopd.selftest.endpoints import Checker, EndpointCheck, endpoint_checker
from loopd.selftest.expected import DEFAULT_DIR, ServerAnswers, recorded_answers
from loopd.sessionlog.records import Session
from loopd.sessionlog.store import SessionLog
from loopd.turn.loop import ToolRunner, Turn

log = logging.getLogger(__name__)

# Told of each prewarm of a moved session: its name and how the prewarm went.
Warmed = Callable[[str, PrewarmResult], None]


@dataclass(frozen=True)
class FrontEnd:
    """What a front end passes to a turn: where its progress and its place in line are told,
    who is asked about a tool call that waits for a person's approval (None: nobody, and such
    a call is denied), and the runner of its tool calls."""

    report: StatusCallback
    tools: ToolRunner | None
    on_position: PositionCallback = lambda ahead: None
    asker: Asker | None = None


class Endpoints:
    """The servers (``servers``: each one's current ``Server`` value, by name) and where each
    session's turns run."""

    def __init__(
        self,
        servers: Sequence[Server],
        fleet: Fleet,
        *,
        settings: Settings,
        session_log: SessionLog,
        rules: TurnRules,
        live: LiveTurns,
        head: tuple[str, str],
        recorded: Mapping[str, ServerAnswers | None] = {},
        slots: Mapping[tuple[str, str], int] = {},
        check: Checker | None = None,
    ) -> None:
        """``head``: what a new session's epoch begins with (its tools' sha256 and system text);
        ``recorded``: each server's recorded answers (``loopd selftest --record``); ``slots``:
        ``SessionLog.endpoint_slots()``, the slot each session keeps on each endpoint it ran
        on; ``check``: the re-check of a down endpoint (until a start names its own)."""
        self.servers: dict[str, Server] = {server.name: server for server in servers}
        self.fleet = fleet
        self.settings = settings
        self.log = session_log
        self.rules = rules
        self.live = live
        self.head = head
        self.recorded = dict(recorded)
        self.check = check
        self._slots = dict(slots)  # (session, endpoint) -> its slot there
        self._up_listeners: list[Callable[[str], None]] = []
        self.warm_listeners: list[Warmed] = []

    @classmethod
    def open(
        cls,
        settings: Settings,
        session_log: SessionLog,
        *,
        rules: TurnRules,
        live: LiveTurns,
        head: tuple[str, str],
        tools_text: str = "",
        selftest: Mapping[str, ServerAnswers] = {},
        expected_dir: Path = DEFAULT_DIR,
        client_type: type[InferenceClient] = InferenceClient,
    ) -> Endpoints:
        """Every server of ``settings``, each built with what is known of it: ``selftest``'s
        answers (by endpoint name, where the self-test ran in this process), else those
        recorded in ``expected_dir`` (a down endpoint is re-checked by its self-test against
        them, rendering ``tools_text``). ``client_type``: the class of each server's client."""
        named = settings.has_endpoint_tables
        recorded = {
            e.name: recorded_answers(e.model, e.name if named else None, expected_dir)
            for e in settings.endpoints()
        }
        servers = [
            Server.open(
                e,
                recorded_as=e.name if named else None,
                settings=settings,
                session_log=session_log,
                known=known(settings, selftest=selftest.get(e.name), recorded=recorded[e.name]),
                client_type=client_type,
            )
            for e in settings.endpoints()
        ]
        if named:  # each session where its latest request ran
            placed, slots = session_log.last_endpoints(), session_log.endpoint_slots()
        else:  # the shorthand's requests name no endpoint: every session is on its one server
            placed = {s.name: (SHORTHAND_ENDPOINT, "") for s in session_log.sessions()}
            slots = {}
        fleet = Fleet([s.name for s in servers], placed=placed)
        return cls(
            servers,
            fleet,
            settings=settings,
            session_log=session_log,
            rules=rules,
            live=live,
            head=head,
            recorded=recorded,
            slots=slots,
            check=endpoint_checker(settings, tools_text, expected_dir),
        )

    async def aclose(self) -> None:
        for server in self.servers.values():
            await server.client.aclose()

    @property
    def named(self) -> bool:
        """The servers are ``[[endpoint]]`` tables (not the shorthand's one)."""
        return self.settings.has_endpoint_tables

    # -- what is known of each server ---------------------------------------------------------

    def know(self, name: str, selftest: ServerAnswers | None) -> Server:
        """The self-test's answers for server ``name``: what is known of it is decided again
        (with its recorded answers) and the server replaced whole; a turn already built keeps
        the value it was built from."""
        server = self.servers[name]
        found = known(self.settings, selftest=selftest, recorded=self.recorded.get(name))
        self.servers[name] = server = server.knowing(found)
        log.info("%s", server.describe())
        return server

    # -- the start and the checks ---------------------------------------------------------------

    def start(self, check: Checker, down: Mapping[str, str]) -> None:
        """Serve with ``check`` as the re-check, the endpoints of ``down`` (name -> why) down
        as the start's self-tests found them."""
        self.check = check
        for name, reason in down.items():
            self.fleet.health.mark_down(name, reason, time.monotonic())

    def log_known(self) -> None:
        """One line for each server: what is known of it, which its turns go by (logged once
        the front end's checks passed)."""
        for server in self.servers.values():
            log.info("%s", server.describe())

    async def start_checked(self, check: Checker) -> StartChecks:
        """Check every endpoint at once (``loopd.endpoints.start``) and serve with ``check`` as
        the re-check; ``NoEndpointUp`` when none passed (nothing is marked then)."""
        checks = await check_at_start([s.endpoint for s in self.servers.values()], check)
        if checks.none_up:
            raise NoEndpointUp(checks.down, named=self.named)
        self.start(check, checks.down)
        return checks

    def clients(self) -> dict[str, InferenceClient]:
        return {name: server.client for name, server in self.servers.items()}

    def on_up(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` when a down endpoint passes its re-check."""
        self._up_listeners.append(listener)

    async def watch(self) -> None:
        """Re-check down endpoints until cancelled; returns at once without a checker, or for a
        fleet of one (never marked down: it has nowhere to move its sessions to)."""
        if self.check is None or len(self.servers) == 1:
            return
        await recheck_down(
            self.fleet.health,
            [server.endpoint for server in self.servers.values()],
            self.check,
            on_up=self._came_up,
        )

    def _came_up(self, check: EndpointCheck) -> None:
        name = check.endpoint.name
        if check.report is not None:  # a self-test: what it found is what is known now
            self.know(name, check.report.answers)
        for listener in self._up_listeners:
            listener(name)

    # -- where a session is ----------------------------------------------------------------------

    def slot_on(self, server: Server, session: Session) -> int:
        """The session's slot (or lane) on ``server``: on the shorthand's, the one it was given
        at creation (``Runtime.ensure_session``); on an endpoint, the one it had there, else the
        one fewest of the sessions now placed there use."""
        if server.recorded_as is None:
            return session.slot
        key = (session.name, server.name)
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
        """Each session placed on an endpoint since the start: its endpoint and its slot there."""
        found = {}
        for (session, endpoint), slot in self._slots.items():
            if self.fleet.endpoint_of(session) == endpoint:
                found[session] = (endpoint, slot)
        return found

    def server_of(self, session: str) -> Server:
        """The server the session's cache is on, or, for a session never placed (or placed on
        an endpoint no longer configured), the first configured one."""
        where = self.fleet.endpoint_of(session)
        if where is not None and where in self.servers:
            return self.servers[where]
        return next(iter(self.servers.values()))

    def seat(self, session: Session) -> tuple[Server, int]:
        """Where the session's turn runs now: its server (placed now if it has none, moved if
        its own is down) and its slot there; ``NoEndpointUp`` when none is up."""
        placement = self.fleet.place(session.name)
        if isinstance(placement, NowhereUp):
            down = {name: "down" for name in placement.down}
            raise NoEndpointUp(down, named=self.named)
        server = self.servers[placement.to if isinstance(placement, Move) else placement.endpoint]
        return server, self.slot_on(server, session)

    # -- a turn ----------------------------------------------------------------------------------

    def turn_on(
        self,
        server: Server,
        session: Session,
        slot: int,
        front: FrontEnd,
        *,
        report: StatusCallback | None = None,
        asker: Asker | None = None,
        asked_at: float | None = None,
    ) -> Turn:
        """The turn of ``session`` on ``slot`` of ``server``, as ``front`` asks for it
        (``report`` and ``asker``: in place of its own, the live turn's and the one that steps
        aside; ``asked_at``: when it asked for its slot)."""
        return build_turn(
            server,
            session.name,
            slot,
            session_log=self.log,
            rules=self.rules,
            report=report or front.report,
            tools=front.tools,
            asker=asker or front.asker,
            asked_at=asked_at,
        )

    async def run_turn(self, session: Session, front: FrontEnd) -> TurnOutcome:
        """The session's turn on its endpoint; on another one if that endpoint proves dead."""
        outcome = TurnOutcome(answer=None, failure="no endpoint is configured")
        for _ in range(len(self.servers)):
            placement = self.fleet.place(session.name)
            if isinstance(placement, NowhereUp):
                down = ", ".join(placement.down)
                return TurnOutcome(answer=None, failure=f"no endpoint is up ({down})")
            name = placement.to if isinstance(placement, Move) else placement.endpoint
            server = self.servers[name]
            moved_from = placement.lost if isinstance(placement, Move) else None
            if moved_from is not None:
                log.warning(
                    "session %s moves from endpoint %s (down) to %s; its prompt is read there "
                    "(or its save restored)",
                    session.name,
                    moved_from,
                    server.name,
                )
            outcome = await self._run_on(server, session, front)
            if isinstance(placement, Move):  # its first prompt here: the shared head is read
                self._learn_head(server.name, session.name, outcome)
            if outcome.answer is not None or len(self.servers) == 1:
                return outcome  # answered; or a fleet of one: nowhere to move, tried again next
            if not await self._proves_dead(server, outcome):
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

    async def _run_on(self, server: Server, session: Session, front: FrontEnd) -> TurnOutcome:
        slot = self.slot_on(server, session)
        # Real work: the server's prewarms give way (one beside a turn slows both), and this
        # session's own turn reads what it needs.
        server.prewarmer.preempt_all()
        server.plan.drop(session.name)
        with self.live.turn(session.name, slot, front.report, front.on_position) as live:
            asked_at = time.monotonic()  # the wait a person sees starts (engine.waits)
            async with AsyncExitStack() as held:
                with self.fleet.waiting(server.name):
                    await held.enter_async_context(
                        server.scheduler.slot(session.name, slot, live.on_position)
                    )
                server = self.servers[server.name]  # as known now, the slot being ours
                stepped = None
                if front.asker is not None:  # a wait for a person frees the slot meanwhile
                    stepped = Stepped(front.asker, self._stepping_aside(server, session, live))
                turn = self.turn_on(
                    server,
                    session,
                    slot,
                    front,
                    report=live.report,
                    asker=stepped,
                    asked_at=asked_at,
                )
                with self.fleet.running(session.name):
                    try:
                        outcome = await turn.run()
                    finally:
                        # The plan learns what the slot holds before the slot is released.
                        server.plan.used(session.name, slot)
                # Placed by the server, a compacted epoch waits in its host cache: no read.
                if outcome.compacted and server.known.pinning.pinned:
                    server.plan.want(session.name, slot)
                return live.finished(outcome)
        raise AssertionError("unreachable")  # pragma: no cover - the block returns

    @staticmethod
    def _stepping_aside(
        server: Server, session: Session, live: LiveTurn
    ) -> Callable[[], AbstractAsyncContextManager[None]]:
        slot = live.slot

        @asynccontextmanager
        async def aside() -> AsyncIterator[None]:
            with live.awaiting_person():
                async with server.scheduler.stepped_aside(session.name, slot, live.on_position):
                    yield

        return aside

    def _learn_head(self, endpoint: str, session: str, outcome: TurnOutcome) -> None:
        """A session's first prompt on ``endpoint`` began with the system prompt and tools of
        its epoch; when those are the ones new sessions get, the endpoint holds them now."""
        epoch = self.log.current_epoch(session)
        if (epoch.tools_sha256, epoch.system_text) != self.head:
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

    # -- a prewarm -------------------------------------------------------------------------------

    async def prewarm(
        self, server: Server, session: Session, slot: int, moved: PrevRequest | None = None
    ) -> PrewarmResult:
        """Read ``session``'s prompt into its idle ``slot`` on ``server`` (or restore its save
        there, with durable sessions on); see ``loopd.prewarm``. ``moved``: its previous
        request, made on another endpoint (this read is the move's re-read)."""
        settings = server.request_settings(slot, self.rules)
        with request_scope(session.name):
            result = await server.prewarmer.prewarm(
                replace(session, slot=slot), settings, moved=moved, restorer=server.durable
            )
        METRICS.prewarm_ended(result.outcome.value)
        return result

    def on_warmed(self, listener: Warmed) -> None:
        """Call ``listener(session, result)`` after each prewarm of a moved session
        (``loopd.endpoints.warm``)."""
        self.warm_listeners.append(listener)
