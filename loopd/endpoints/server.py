"""One llama-server as loopd uses it: what is known of it, the pieces kept for it, and a turn
built from them.

Every configuration is a fleet (``loopd.endpoints.serving``): the ``[[endpoint]]`` tables, or the
one server of the shorthand (``LOOPD_INFER_URL``, ``LOOPD_MODEL``, ``LOOPD_SLOTS``), an endpoint
named ``default`` whose requests name no endpoint in the log, as before loopd had several. Each
server has its own client, slot queue (``loopd.scheduler``), prewarms (``loopd.prewarm``) and, from
what is known of it, its context budget, whether its requests are pinned to a slot, and its
durable sessions (``loopd.turn.saves``; each server answers for its own save folder).

What is known of a server (``Known``, decided by ``known``, pure) comes from the self-test where
it ran in this process (``loopd serve``), else from what ``loopd selftest --record`` stored for it
(its ``expected/endpoints/NAME.json``, else its model's file: ``loopd chat``, ``loopd run``). It is
an input to building the server, never set on it later: a later self-test's answers make a new
``Server`` value (``knowing``) that replaces the old one whole in the fleet, sharing its client,
queue, prewarms and restores under way, while a turn already built keeps the value it was built
from. A turn (``build_turn``) is made once, from a server, the session's slot there, the rules
every turn of the process goes by (``TurnRules``) and what the front end passes; it is never
patched afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from loopd.approvals.call import Asker
from loopd.config import EndpointSettings, Settings
from loopd.contextwindow.budget import BudgetRules, ServerBudget
from loopd.contextwindow.compaction import Compactor
from loopd.engine.client import InferenceClient
from loopd.engine.durable import Durability, decide_durable
from loopd.engine.guards import GuardLimits
from loopd.engine.limits import Limits
from loopd.engine.modelstate import ModelMemory
from loopd.engine.pinning import Pinning, decide_pinning
from loopd.engine.progress import StatusCallback
from loopd.engine.request import RequestSettings, Sampling
from loopd.engine.saverule import SaveFigures
from loopd.prewarm.plan import PrewarmPlan
from loopd.prewarm.prewarmer import Prewarmer
from loopd.scheduler import Scheduler
from loopd.selftest.expected import ServerAnswers
from loopd.selftest.template import TemplateAnswer
from loopd.sessionlog.store import SessionLog
from loopd.turn.loop import DEFAULT_MAX_ROUNDS, ToolRunner, Turn
from loopd.turn.saves import DurableSlots, SaveBook


@dataclass(frozen=True)
class Known:
    """What loopd goes by for one server: where its requests go (``loopd.engine.pinning``),
    whether it saves and restores sessions (``loopd.engine.durable``), and whether its template
    keeps past reasoning (the cache-loss rule's ``template_drops_reasoning``)."""

    pinning: Pinning
    durability: Durability
    keeps_past_reasoning: TemplateAnswer = TemplateAnswer.UNKNOWN

    @property
    def template_drops_reasoning(self) -> bool:
        return self.keeps_past_reasoning is TemplateAnswer.NO


def known(
    settings: Settings, *, selftest: ServerAnswers | None, recorded: ServerAnswers | None
) -> Known:
    """What is known of a server from the self-test's answers (``selftest``: None where it did
    not run in this process) and the recorded ones (``recorded``: None where nothing is
    recorded). The self-test's answer wins where it has one; the template's verdict comes from
    a self-test only."""
    pinning = decide_pinning(
        settings.pin_slots,
        selftest=None if selftest is None else selftest.idle_slots_cleared,
        recorded=None if recorded is None else recorded.idle_slots_cleared,
    )
    durability = decide_durable(
        settings.durable,
        selftest=None if selftest is None else selftest.durable_available,
        recorded=None if recorded is None else recorded.durable_available,
    )
    keeps = TemplateAnswer.UNKNOWN if selftest is None else selftest.keeps_past_reasoning
    return Known(pinning, durability, keeps)


@dataclass(frozen=True, eq=False)
class Server:
    """One endpoint's pieces. The client, slot queue, prewarm plan and prewarmer are the
    server's for the life of the process; the budget and the durable sessions are made from
    what is known of it (``knowing``)."""

    endpoint: EndpointSettings
    # The name each request's record carries (``extra.endpoint``); None for the shorthand's.
    recorded_as: str | None
    client: InferenceClient
    scheduler: Scheduler
    plan: PrewarmPlan
    prewarmer: Prewarmer
    book: SaveBook
    pool_requests: int  # LOOPD_POOL_REQUESTS: how many long requests share a unified pool
    known: Known
    budget: ServerBudget
    durable: DurableSlots | None = None
    # The slots a restore of loopd's is filling (``DurableSlots.claimed``), kept across
    # ``knowing`` so that a restore under way still holds its slot.
    restoring: set[int] = field(default_factory=set)
    # What the server told of its model without waking it, and when it forgot
    # (``loopd.engine.modelstate``: read by ``loopd serve``'s server watch, before a turn and
    # before a save), and what loopd measured of its saves and reads (``loopd.engine.saverule``):
    # the server's for the life of the process, kept across ``knowing`` likewise.
    memory: ModelMemory = field(default_factory=ModelMemory)
    figures: SaveFigures = field(default_factory=SaveFigures)
    # How long a reading of the model may wait for it to load (the turn's first-byte limit).
    load_wait_s: float = 900.0

    @classmethod
    def open(
        cls,
        endpoint: EndpointSettings,
        *,
        recorded_as: str | None,
        settings: Settings,
        session_log: SessionLog,
        known: Known,
        client_type: type[InferenceClient] = InferenceClient,
    ) -> Server:
        """``client_type``: the class of its client (tests tap the traffic with a subclass)."""
        client = client_type(endpoint.url, endpoint.model, connect_s=settings.connect_s)
        scheduler = Scheduler()
        prewarmer = Prewarmer(
            client, session_log, scheduler, enabled=settings.prewarm, endpoint=recorded_as
        )
        server = cls(
            endpoint,
            recorded_as,
            client,
            scheduler,
            PrewarmPlan(),
            prewarmer,
            SaveBook(settings.state_dir),
            settings.pool_requests,
            known,
            ServerBudget(client),
            load_wait_s=settings.first_byte_s,
        )
        return server.knowing(known)

    @property
    def name(self) -> str:
        return self.endpoint.name

    def knowing(self, known: Known) -> Server:
        """This server with ``known`` as what is known of it: its budget and its durable
        sessions made anew from it."""
        pinning = known.pinning
        budget = ServerBudget(self.client, shared=pinning.shared_pool, requests=self.pool_requests)
        durable = None
        if known.durability.on:
            durable = DurableSlots(
                self.client,
                self.book,
                self.prewarmer,
                endpoint=self.recorded_as,
                pinned=pinning.pinned,
                slots=self.endpoint.slots,
                memory=self.memory,
                figures=self.figures,
                load_wait_s=self.load_wait_s,
                claimed=self.restoring,
            )
        return replace(self, known=known, budget=budget, durable=durable)

    def describe(self) -> str:
        """What is known of it, in one line for the log."""
        pinning, known = self.known.pinning, self.known
        where = "" if self.recorded_as is None else f"endpoint {self.name}: "
        pool = (
            f"the KV pool is shared: a request plans with {self.pool_requests} requests' share "
            "of it"
            if pinning.shared_pool
            else "each slot has its own context"
        )
        sent = "pinned to each session's slot" if pinning.pinned else "placed by the server"
        return (
            f"{where}requests {sent} ({pinning.why}); {pool}; the template keeps past reasoning: "
            f"{known.keeps_past_reasoning.value}; durable sessions: "
            f"{'on' if self.durable is not None else 'off'} ({known.durability.why})"
        )

    def request_settings(self, slot: int, rules: TurnRules) -> RequestSettings:
        """What a request of a session on ``slot`` sends as its fixed fields: this server's
        model, and ``id_slot`` pinned or placed by the server as what is known decides."""
        return RequestSettings(
            model=self.endpoint.model,
            slot=self.known.pinning.id_slot(slot),
            max_tokens=rules.max_tokens,
            sampling=rules.sampling,
        )


@dataclass(frozen=True)
class TurnRules:
    """What every turn of the process goes by: the settings' limits and sizes, with what its
    front end changes (the terminal shows every status as it comes: ``status_interval_s`` 0)."""

    max_tokens: int
    sampling: Sampling
    limits: Limits
    guard_limits: GuardLimits
    budget: BudgetRules
    max_rounds: int = DEFAULT_MAX_ROUNDS

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        status_interval_s: float | None = None,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> TurnRules:
        """The rules of ``settings``; ``status_interval_s``: how often a status is passed on
        (None: the engine's default); ``max_rounds``: requests a turn may make."""
        limits = Limits(
            first_byte_s=settings.first_byte_s,
            silence_s=settings.silence_s,
            think_cap=settings.stream_think_cap,
            loop_window=settings.loop_window,
        )
        if status_interval_s is not None:
            limits = replace(limits, status_interval_s=status_interval_s)
        budget = BudgetRules(
            compact_at=settings.compact_at,
            max_tokens=settings.max_tokens,
            summary_max_tokens=settings.summary_max_tokens,
        )
        return cls(
            settings.max_tokens,
            settings.sampling,
            limits,
            settings.guard_limits,
            budget,
            max_rounds,
        )


def build_turn(
    server: Server,
    session: str,
    slot: int,
    *,
    session_log: SessionLog,
    rules: TurnRules,
    report: StatusCallback,
    tools: ToolRunner | None,
    asker: Asker | None = None,
    asked_at: float | None = None,
) -> Turn:
    """The turn of ``session`` on ``slot`` of ``server`` (its slot, or lane, there);
    ``asked_at``: when it asked for the slot (monotonic: the start of the wait a person sees)."""
    known = server.known
    return Turn(
        session=session,
        slot=slot,
        client=server.client,
        log=session_log,
        settings=server.request_settings(slot, rules),
        limits=rules.limits,
        tools=tools,
        max_rounds=rules.max_rounds,
        guard_limits=rules.guard_limits,
        report=report,
        gate=Compactor(server.budget, rules.budget),
        template_drops_reasoning=known.template_drops_reasoning,
        pinned=known.pinning.pinned,
        pool_clears_idle_slots=known.pinning.idle_slots_cleared is True,
        endpoint=server.recorded_as,
        durable=server.durable,
        asker=asker,
        asked_at=asked_at,
    )
