"""The pieces a session needs, built once from the settings: log, server client, tools.

Both front ends (the terminal thread and the Mattermost adapter) go through here, so a session
behaves the same whichever way its messages arrive.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from loopcommon.errors import ConfigError, DaemonError
from loopd.approvals.call import ASKER, AskedCall, Stepped, core_approval_id
from loopd.approvals.wait import settle_core_call, settle_with_broker, was_allowed
from loopd.approvals.words import canonical_arguments
from loopd.config import ApprovalSettings, Settings
from loopd.contextwindow.budget import BudgetRules, ServerBudget, cut_notice
from loopd.contextwindow.compaction import Compactor
from loopd.endpoints.serving import Endpoints
from loopd.endpoints.start import reachability_checker
from loopd.endpoints.warm import keep_warm
from loopd.engine.client import InferenceClient
from loopd.engine.durable import enabled as durable_enabled
from loopd.engine.limits import Limits
from loopd.engine.outcome import TurnOutcome
from loopd.engine.pinning import Pinning, choose_slot, decide_pinning
from loopd.engine.progress import StatusCallback
from loopd.engine.request import RequestSettings
from loopd.engine.saves import DurableSlots, SaveBook
from loopd.engine.turn import Turn
from loopd.errors import InferenceError, ServerRejected
from loopd.observe.context import request_scope
from loopd.observe.live import LiveTurn, LiveTurns
from loopd.observe.metrics import METRICS
from loopd.observe.toolcalls import tool_call
from loopd.prewarm.plan import PrewarmPlan, restart_wants
from loopd.prewarm.prewarmer import Prewarmer, PrewarmOutcome, PrewarmResult
from loopd.scheduler import PositionCallback, Scheduler
from loopd.selftest.endpoints import endpoint_checker
from loopd.selftest.expected import DEFAULT_DIR, ExpectationsError, load_expectation
from loopd.selftest.template import TemplateAnswer
from loopd.serverchange import ServerChange
from loopd.sessionlog.records import Appended, Session
from loopd.sessionlog.store import SessionLog
from loopd.tools.broker_client import BrokerClient
from loopd.tools.command import Sandbox, detect_sandbox
from loopd.tools.core import (
    BROKER_TOOL_NAMES,
    ToolContext,
    ToolResult,
    is_broker_tool,
    make_tool_context,
    parse_arguments,
    run_core_tool,
)
from loopd.tools.errors import ToolFailure
from loopd.tools.files import write_file
from loopd.tools.limits import ToolLimits
from loopd.tools.quota import RESERVE_FILE, ReserveFile
from loopd.tools.spec import ToolsSpec, load_tools_spec
from loopd.tools.workspace import Workspace, migrate_legacy_workspaces, session_workspace
from loopd.turnstop import record_end
from loopd.wire.assemble import ToolCall

log = logging.getLogger(__name__)

INTERRUPTED = (
    "error: loopd stopped while this tool call ran; it may or may not have taken effect. "
    "Check before repeating it."
)


@dataclass
class SessionTools:
    """Runs a session's tool calls: core tools in its workspace, the meta-tools via brokerd."""

    workspaces: Path
    spec: ToolsSpec
    broker: BrokerClient
    contexts: dict[str, ToolContext]
    protected: tuple[Path, ...]
    sandbox: Sandbox | None = None  # probed once, on the first core tool call
    unsandboxed_commands: bool = False  # LOOPD_UNSANDBOXED_COMMANDS
    limits: ToolLimits = field(default_factory=ToolLimits)  # with the workspace quota
    reserve: ReserveFile | None = None  # room for the session log when a tool fills the disk
    # Where a call that waits for a person records the question and the decision.
    log: SessionLog | None = None
    approval: ApprovalSettings = field(default_factory=ApprovalSettings)  # [approval]

    @classmethod
    def open(cls, settings: Settings, spec: ToolsSpec, session_log: SessionLog) -> SessionTools:
        """The tools of ``settings`` (no server needed: ``loopd tools call`` runs them alone)."""
        reserve = ReserveFile(settings.state_dir / RESERVE_FILE)
        reserve.after_tool()  # made at start, where the disk has room for it
        return cls(
            workspaces=settings.workspaces,
            spec=spec,
            broker=BrokerClient(settings.broker_url),
            contexts={},
            protected=(settings.state_dir, settings.tools_file.parent / "loopd.toml"),
            unsandboxed_commands=settings.unsandboxed_commands,
            limits=ToolLimits(
                workspace_max_bytes=settings.workspace_max_bytes,
                disk_reserve_bytes=settings.disk_reserve_bytes,
            ),
            reserve=reserve,
            log=session_log,
            approval=settings.approval,
        )

    async def keep_file(self, session: str, path: str, text: str) -> str | None:
        """Write ``text`` whole to ``path`` in the session's workspace, within its quota, as
        write_file would (of any size the quota allows); None once written, else why not."""
        try:
            ctx = await self.context(session)
            limits = replace(ctx.limits, write_max_bytes=max(len(text.encode()), 1))
            await anyio.to_thread.run_sync(write_file, Workspace(ctx.workspace), path, text, limits)
        except ToolFailure as exc:
            return str(exc)
        return None

    async def context(self, session: str) -> ToolContext:
        ctx = self.contexts.get(session)
        if ctx is None:
            workspace = session_workspace(self.workspaces, session)
            if self.sandbox is None:
                self.sandbox = await detect_sandbox(allow_unsandboxed=self.unsandboxed_commands)
                if self.sandbox.warning:
                    log.warning(self.sandbox.warning)
            ctx = make_tool_context(
                workspace, self.spec, self.sandbox, protected=self.protected, limits=self.limits
            )
            self.contexts[session] = ctx
        return ctx

    async def run(self, session: str, call: ToolCall) -> ToolResult:
        with tool_call(session, call, {*self.spec.names, *BROKER_TOOL_NAMES}) as seen:
            if is_broker_tool(call.name):
                text = seen.result(await self._broker(session, call))
            elif self.approval.asks(call.name) and self.log is not None:
                text = seen.result(await self._core_asked(session, call, self.log))
            else:
                text = seen.result(await self.run_core(session, call.name, call.arguments))
            return ToolResult(text, ok=seen.outcome == "ok")

    def reruns(self, session: str, call: ToolCall) -> bool:
        """Whether a call a restart cut short is sent again, not answered as interrupted: a
        brokerd call (brokerd answers a known call from its record), or a core call that waits
        for a person and was not allowed (it never ran)."""
        if is_broker_tool(call.name):
            return True
        if not self.approval.asks(call.name) or self.log is None:
            return False
        approval_id = core_approval_id(session, call.id, call.name, call.arguments)
        return not was_allowed(self.log, session, approval_id)

    async def _core_asked(
        self, session: str, call: ToolCall, session_log: SessionLog
    ) -> ToolResult:
        """A core tool call that waits for a person's approval ([approval])."""
        try:
            parse_arguments(call.name, call.arguments, self.spec.schemas[call.name])
        except (ToolFailure, KeyError):  # it fails before it acts: nothing to ask about
            return await self.run_core(session, call.name, call.arguments)
        asked = AskedCall(
            session,
            call.id,
            call.name,
            canonical_arguments(call.arguments),
            core_approval_id(session, call.id, call.name, call.arguments),
            time.time(),
            description=self.spec.descriptions.get(call.name, ""),
        )
        return await settle_core_call(
            session_log,
            ASKER.get(),
            asked,
            self.approval.timeout_s,
            lambda: self.run_core(session, call.name, call.arguments),
        )

    async def run_core(self, session: str, name: str, arguments: str) -> ToolResult:
        """A core tool call in the session's workspace (``loopd tools call`` runs this too)."""
        try:
            ctx = await self.context(session)
        except ToolFailure as exc:  # a session name that cannot have a workspace
            return ToolResult(str(exc), ok=False)
        result = await run_core_tool(name, arguments, ctx)
        if self.reserve is not None:  # before the result is appended to the session log
            await anyio.to_thread.run_sync(self.reserve.after_tool)
        return result

    async def _broker(self, session: str, call: ToolCall) -> str:
        try:
            args = json.loads(call.arguments)
        except ValueError as exc:
            return f"error: the arguments of {call.name} are not JSON ({exc}); send an object"
        if not isinstance(args, dict):
            return f"error: the arguments of {call.name} must be a JSON object"
        if call.name == "find_tool":
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return 'error: find_tool needs {"query": "<what the tool should do>"}'
            return await self.broker.find_tool(session, query)
        name = args.get("name")
        if not isinstance(name, str) or not name:
            return 'error: call_tool needs {"name": "<tool>", "arguments": {...}}'
        # The inner arguments travel to brokerd as text; they are validated there, not replayed.
        # Canonical: a person asked to approve the call reads exactly this text.
        inner_text = canonical_arguments(args.get("arguments", {}))
        answer = await self.broker.call_tool_answer(session, call.id, name, inner_text)
        if answer.approval_id is None or self.log is None:
            return answer.text
        asked = AskedCall(
            session,
            call.id,
            name,
            inner_text,
            answer.approval_id,
            time.time(),
            description=answer.description,
        )
        return await settle_with_broker(
            self.log, self.broker, ASKER.get(), asked, self.approval.timeout_s
        )


@dataclass(frozen=True)
class Taken:
    """A user message in the log, and what to tell its author of it (None: nothing)."""

    appended: Appended
    notice: str | None = None


def kept_message_path(external_key: str) -> str:
    """Where, in its session's workspace, a message too long for the context is kept whole: one
    file per message, named by its intake key (a post id, or the terminal's fresh key)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", external_key).strip(".-") or "message"
    return f"messages/{name}.txt"


def slots_refusal(missing: list[int], total: int, url: str) -> str:
    """The one line for LOOPD_SLOTS naming slots the server at ``url`` does not have."""
    named = ", ".join(str(slot) for slot in missing)
    has = {1: "1 slot (0)", 2: "2 slots (0 and 1)"}.get(total, f"{total} slots (0 to {total - 1})")
    verb = "is" if len(missing) == 1 else "are"
    return f"LOOPD_SLOTS: the server at {url} has {has}; {named} {verb} not among them"


@dataclass(frozen=True)
class ServerView:
    """What the engine was told about the server: where requests go, and whether its template
    drops past reasoning (the cache-loss rule's ``template_drops_reasoning``)."""

    pinning: Pinning
    keeps_past_reasoning: TemplateAnswer = TemplateAnswer.UNKNOWN
    durable_available: bool | None = None  # the self-test's save-and-restore probe

    @property
    def template_drops_reasoning(self) -> bool:
        return self.keeps_past_reasoning is TemplateAnswer.NO


def recorded_pool_answer(model: str, expected_dir: Path = DEFAULT_DIR) -> bool | None:
    """``idle_slots_cleared`` as the model's expectations file records it; None when there is
    no file, it records nothing, or it cannot be read (the self-test reports that itself)."""
    try:
        expected = load_expectation(model, expected_dir)
    except ExpectationsError:
        return None
    return expected.idle_slots_cleared if expected is not None else None


@dataclass
class Runtime:
    settings: Settings
    log: SessionLog
    client: InferenceClient
    spec: ToolsSpec
    tools: SessionTools
    # One per process: every front end's turns share the slots through it.
    scheduler: Scheduler = field(default_factory=Scheduler)
    budget: ServerBudget = field(init=False)
    prewarmer: Prewarmer = field(init=False)
    prewarm_plan: PrewarmPlan = field(default_factory=PrewarmPlan)
    live: LiveTurns = field(default_factory=LiveTurns)  # the turns under way (loopd.observe)
    endpoints: Endpoints | None = None  # the servers of [[endpoint]] tables (loopd.endpoints)
    _idle_slots: set[int] = field(default_factory=set)
    _idle_wake: anyio.Event | None = None
    # Set by ``know_server`` (``loopd serve`` passes the self-test's answers); until then the
    # recorded expectations decide where requests go (``loopd.engine.pinning``).
    server: ServerView | None = None
    # Set while the server differs from the recorded expectations (``loopd serve``): the front
    # end then tells each thread so instead of running its turn (``loopd.serverchange``).
    server_change: ServerChange | None = None
    # Durable sessions as ``know_server`` decided (one for every turn: a restore's claim on an
    # idle slot holds against the other lanes' restores).
    durable: DurableSlots | None = None

    def __post_init__(self) -> None:
        self.budget = ServerBudget(self.client)
        self.prewarmer = Prewarmer(
            self.client, self.log, self.scheduler, enabled=self.settings.prewarm
        )
        self.scheduler.on_idle(self._slot_idle)

    @classmethod
    def open(cls, settings: Settings) -> Runtime:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        spec = load_tools_spec(settings.tools_file)
        session_log = SessionLog.open(settings.db_path)
        migrate_legacy_workspaces(settings.workspaces, [s.name for s in session_log.sessions()])
        one = settings.for_endpoint(settings.endpoints()[0])  # the shorthand, or the first table
        client = InferenceClient(one.infer_url, one.model, connect_s=settings.connect_s)
        tools = SessionTools.open(settings, spec, session_log)
        endpoints = None
        if settings.has_endpoint_tables:
            checker = endpoint_checker(settings, spec.text)
            endpoints = Endpoints.open(settings, session_log, checker)
        return cls(settings, session_log, client, spec, tools, endpoints=endpoints)

    async def start_terminal(self) -> None:
        """The check a terminal's chat or one-shot turn starts with: its one server's
        ``/health`` (``ServerRejected`` when it is not ok); with ``[[endpoint]]`` tables every
        endpoint's, at once, the ones down marked down and re-checked so, as ``loopd serve``
        starts (``loopd.endpoints.start``; ``NoEndpointUp`` when none answers)."""
        if self.endpoints is not None:
            await self.endpoints.start_checked(reachability_checker(self.endpoints.clients()))
        elif not await self.client.health():
            raise ServerRejected(self.client.url, 503, "/health is not ok")
        else:
            await self._check_slots()

    async def _check_slots(self) -> None:
        """``ConfigError`` when LOOPD_SLOTS names a slot the server does not have (its id would
        wrap around to another slot). Asked of ``/props`` without loading a model: a model not
        loaded yet is not checked (``loopd serve``'s self-test checks it)."""
        try:
            total = (await self.client.props(autoload=False)).get("total_slots")
        except InferenceError as exc:
            log.info("the server's slots are not checked (%s)", exc)
            return
        if not isinstance(total, int) or total <= 0:
            return
        if missing := [slot for slot in self.settings.slots if slot >= total]:
            raise ConfigError(slots_refusal(missing, total, self.client.url))

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.endpoints is not None:
            await self.endpoints.aclose()
        await self.tools.broker.aclose()
        self.log.close()

    def ensure_session(self, name: str) -> Session:
        """The session, created on its first use with a slot and a first epoch; a new epoch
        when the tools file or the system text changed since (recorded with the reason)."""
        existing = {s.name: s for s in self.log.sessions()}
        session = existing.get(name)
        if session is None:
            slot = choose_slot(self.settings.slots, [s.slot for s in existing.values()])
            session = self.log.ensure_session(name, slot)
        epochs = self.log.epochs(name)
        reason = None
        if not epochs:
            reason = "new session"
        elif epochs[-1].tools_sha256 != self.spec.sha256:
            reason = "tool set changed"
        elif epochs[-1].system_text != self.settings.system_text:
            reason = "system text changed"
        if reason is not None:
            self.log.start_epoch(
                name,
                reason=reason,
                tools_text=self.spec.text,
                system_text=self.settings.system_text,
                carry_over=bool(epochs),
            )
        return session

    def new_session_head(self) -> tuple[str, str]:
        """What a new session's epoch begins with: its tools (their sha256) and system text."""
        return self.spec.sha256, self.settings.system_text

    # -- what the server is -----------------------------------------------------------------------

    def know_server(
        self,
        *,
        idle_slots_cleared: bool | None,
        keeps_past_reasoning: TemplateAnswer = TemplateAnswer.UNKNOWN,
        expected_dir: Path = DEFAULT_DIR,
        durable_available: bool | None = None,
    ) -> ServerView:
        """Take the self-test's answers (None / UNKNOWN where it did not run or could not tell):
        pinning (``loopd.engine.pinning``), the shared pool's budget, the template's verdict."""
        pinning = decide_pinning(
            self.settings.pin_slots,
            selftest=idle_slots_cleared,
            recorded=recorded_pool_answer(self.client.model, expected_dir),  # the server's model
        )
        view = ServerView(pinning, keeps_past_reasoning, durable_available)
        self.server = view
        self.durable = self._durable(view)
        self.prewarmer.restorer = self.durable  # a prewarm restores a saved session
        self.budget.shared = pinning.shared_pool
        self.budget.requests = self.settings.pool_requests
        log.info(
            "requests %s (%s); %s; the template keeps past reasoning: %s",
            "pinned to each session's slot" if pinning.pinned else "placed by the server",
            pinning.why,
            f"the KV pool is shared: a request plans with {self.settings.pool_requests} "
            "requests' share of it"
            if pinning.shared_pool
            else "each slot has its own context",
            keeps_past_reasoning.value,
        )
        log.info(
            "durable sessions: %s (LOOPD_DURABLE %s; the self-test's probe: %s)",
            "on" if self.durable is not None else "off",
            self.settings.durable.value,
            {True: "available", False: "not available", None: "not run"}[durable_available],
        )
        return view

    def _durable(self, view: ServerView) -> DurableSlots | None:
        """Saves and restores, where the setting and the self-test allow."""
        if not durable_enabled(self.settings.durable, view.durable_available):
            return None
        return DurableSlots(
            self.client,
            SaveBook(self.settings.state_dir),
            self.prewarmer,
            pinned=view.pinning.pinned,
            slots=self.settings.slots,
        )

    def _view(self) -> ServerView:
        """The server as told, or, without a self-test (``loopd chat``, ``--skip-selftest``),
        as the recorded expectations say (the template's verdict then unknown)."""
        if self.server is None:
            return self.know_server(idle_slots_cleared=None)
        return self.server

    def turn(self, session: Session, report: StatusCallback) -> Turn:
        s = self.settings
        view = self._view()
        return Turn(
            session=session.name,
            slot=session.slot,
            client=self.client,
            log=self.log,
            settings=RequestSettings(
                model=s.model,
                slot=view.pinning.id_slot(session.slot),
                max_tokens=s.max_tokens,
                sampling=s.sampling,
            ),
            limits=Limits(
                first_byte_s=s.first_byte_s,
                silence_s=s.silence_s,
                think_cap=s.stream_think_cap,
                loop_window=s.loop_window,
            ),
            tools=self.tools,
            guard_limits=s.guard_limits,
            report=report,
            gate=Compactor(self.budget, self.budget_rules()),
            template_drops_reasoning=view.template_drops_reasoning,
            pinned=view.pinning.pinned,
            pool_clears_idle_slots=view.pinning.idle_slots_cleared is True,
            durable=self.durable,
        )

    def budget_rules(self) -> BudgetRules:
        return BudgetRules(
            compact_at=self.settings.compact_at,
            max_tokens=self.settings.max_tokens,
            summary_max_tokens=self.settings.summary_max_tokens,
        )

    async def append_user(self, session: str, text: str, *, external_key: str) -> Taken:
        """Append a user message. One longer than one message may be in the context is never
        cut silently: the whole text is kept in the session's workspace (``kept_message_path``),
        the model reads its head with a note naming that file, and ``Taken.notice`` is the line
        the person is told, where they wrote it."""
        compactor = Compactor(self.budget, self.budget_rules())
        kept_in = kept_message_path(external_key)
        cut = await compactor.fit(text, "this message", kept_in)
        notice = None
        if cut.was_cut:
            refusal = await self.tools.keep_file(session, kept_in, text)
            if refusal is not None:  # the note must not name a file that is not there
                log.warning("message %s of %s not kept whole: %s", external_key, session, refusal)
                cut = await compactor.fit(text, "this message")
            notice = cut_notice(cut, kept_in, refusal)
        appended = self.log.append_user(session, cut.text, external_key=external_key)
        return Taken(appended, notice)

    async def prewarm(self, session: Session) -> PrewarmResult:
        """Read the session's prompt into its idle slot (LOOPD_PREWARM); see ``loopd.prewarm``."""
        settings = self.turn(session, lambda status: None).settings
        with request_scope(session.name):
            result = await self.prewarmer.prewarm(session, settings)
        METRICS.prewarm_ended(result)
        return result

    async def run_turn(
        self,
        session: Session,
        report: StatusCallback,
        on_position: PositionCallback = lambda ahead: None,
    ) -> TurnOutcome:
        """A turn, once the session's slot is free (FIFO behind other sessions on it). A turn
        that ends without an answer is recorded as ended, with the line it ended on: a restart
        does not run it again (``loopd.turnstop.record_end``)."""
        outcome = await self._placed_turn(session, report, on_position)
        if outcome.failure is not None:
            record_end(self.log, session.name, outcome.failure)
        return outcome

    async def _placed_turn(
        self, session: Session, report: StatusCallback, on_position: PositionCallback
    ) -> TurnOutcome:
        if self.endpoints is not None:
            return await self.endpoints.run_turn(self, session, report, on_position)
        # Real work: every prewarm gives way (one beside a turn slows both; ``loopd.prewarm``).
        self.prewarmer.preempt_all()
        self.prewarm_plan.drop(session.name)
        view = self._view()
        with self.live.turn(session.name, session.slot, report, on_position) as live:
            asked_at = time.monotonic()  # the wait a person sees starts (loopd.engine.waits)
            async with self.scheduler.slot(session.name, session.slot, live.on_position):
                # The plan learns what the slot holds before the slot is released (and seen idle).
                asker = ASKER.get()
                token = None
                if asker is not None:  # a wait for a person's approval frees the slot meanwhile
                    token = ASKER.set(Stepped(asker, self._stepped_aside(session, live)))
                turn = self.turn(session, live.report)
                turn.asked_at = asked_at
                try:
                    outcome = await turn.run()
                finally:
                    if token is not None:
                        ASKER.reset(token)
                    self.prewarm_plan.used(session.name, session.slot)
                # Placed by the server, the compacted epoch waits in its host cache: no read.
                if outcome.compacted and view.pinning.pinned:
                    self.prewarm_plan.want(session.name, session.slot)
                return live.finished(outcome)

    def _stepped_aside(
        self, session: Session, live: LiveTurn
    ) -> Callable[[], AbstractAsyncContextManager[None]]:
        return lambda: self.scheduler.stepped_aside(session.name, session.slot, live.on_position)

    # -- prewarm on idle slots -------------------------------------------------------------------

    async def keep_warm(self, restarted: Collection[str] = ()) -> None:
        """Prewarm wanted sessions whenever their slot falls idle, until cancelled; returns at
        once when LOOPD_PREWARM is off. ``restarted``: the front end's sessions, of which each
        slot's most recently active one is read back first (see loopd.prewarm.plan).
        With several endpoints, this re-checks the down ones instead, and prewarms the front
        end's sessions (``restarted``) moved off one (loopd.endpoints.warm)."""
        if self.endpoints is not None:
            await keep_warm(self.endpoints, self, restarted)
            return
        if not self.prewarmer.enabled:
            return
        self._want_after_restart(restarted)
        self._idle_slots.update(self.settings.slots)
        while True:
            self._idle_wake = anyio.Event()
            while self._idle_slots:
                slot = min(self._idle_slots)
                self._idle_slots.discard(slot)
                try:
                    await self._prewarm_slot(slot)
                except DaemonError:
                    # Optional work: a log or server error here must not end the front end.
                    log.exception("prewarm on slot %d failed; prewarm goes on", slot)
            await self._idle_wake.wait()

    def _slot_idle(self, slot: int) -> None:
        # A prewarm waits for the whole engine to be idle; then every slot's may run.
        if self._idle_wake is not None and self.scheduler.idle():
            self._idle_slots.update(self.settings.slots)
            self._idle_wake.set()

    def _want_after_restart(self, names: Collection[str]) -> None:
        if not names:
            return
        slots = {s.name: s.slot for s in self.log.sessions() if s.name in names}
        busy = [
            name
            for name in slots
            if (state := self.log.state(name)).pending_turn or state.interrupted_calls
        ]
        for name, slot in restart_wants(slots, self.log.last_answered(), busy):
            self.prewarm_plan.want(name, slot)

    async def _prewarm_slot(self, slot: int) -> None:
        name = self.prewarm_plan.next_for(slot)
        if name is None or self.scheduler.holder(slot) is not None:
            return
        # Dropped while it runs, so that a prewarm that raises is not tried again and again
        # (its own release of the slot would bring this loop straight back to it).
        self.prewarm_plan.drop(name)
        result = await self.prewarm(self.log.get_session(name))
        if result.outcome is PrewarmOutcome.DONE:
            self.prewarm_plan.warmed(name, slot)
        elif result.outcome is PrewarmOutcome.FAILED:
            log.warning(
                "prewarm of %s failed (%s); its next turn reads its prompt", name, result.detail
            )
        elif self.log.state(name).idle:
            # Cancelled by another session's work, or skipped while the slot was busy: the next
            # idle moment tries again. (A session whose own turn is coming needs no prewarm.)
            self.prewarm_plan.want(name, slot)

    async def resume(self, session: Session, report: StatusCallback) -> TurnOutcome | None:
        """Finish what a crash left: interrupted tool calls get a result (brokerd's are asked
        again: it answers a known call id from its record without running it twice), then a
        pending turn runs. None when there was nothing to do."""
        state = self.log.state(session.name)
        for interrupted in state.interrupted_calls:
            call = interrupted.call  # as stored: the argument text the model streamed
            if self.tools.reruns(session.name, call):
                text = (await self.tools.run(session.name, call)).text
            else:
                text = INTERRUPTED
            self.log.append_tool_result(session.name, tool_call_id=call.id, content=text)
        if state.interrupted_calls or state.pending_turn:
            return await self.run_turn(session, report)
        return None
