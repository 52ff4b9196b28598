"""The pieces a session needs, built once from the settings: log, server client, tools.

Both front ends (the terminal thread and the Mattermost adapter) go through here, so a session
behaves the same whichever way its messages arrive.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio

from loopcommon.errors import ConfigError
from loopd.approvals.call import AskedCall, Asker, core_approval_id
from loopd.approvals.wait import settle_core_call, settle_with_broker, was_allowed
from loopd.approvals.words import canonical_arguments
from loopd.config import ApprovalSettings, Settings
from loopd.contextwindow.budget import cut_notice
from loopd.contextwindow.compaction import Compactor
from loopd.endpoints.server import Server, TurnRules
from loopd.endpoints.serving import Endpoints, FrontEnd
from loopd.endpoints.start import reachability_checker
from loopd.endpoints.warm import keep_warm
from loopd.engine.client import InferenceClient
from loopd.engine.outcome import TurnOutcome
from loopd.engine.pinning import choose_slot
from loopd.engine.progress import StatusCallback
from loopd.engine.quiet import Purpose
from loopd.errors import InferenceError
from loopd.observe.live import LiveTurns
from loopd.observe.toolcalls import tool_call
from loopd.prewarm.prewarmer import PrewarmResult
from loopd.scheduler import PositionCallback
from loopd.selftest.expected import DEFAULT_DIR, ServerAnswers
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
from loopd.turn.loop import ToolRunner, Turn
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
        """The tools of ``settings`` (no server needed: ``loopd tools call`` runs them alone).
        The workspaces an earlier naming made are moved first, whoever opens the tools."""
        migrate_legacy_workspaces(settings.workspaces, [s.name for s in session_log.sessions()])
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

    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        """``asker``: who is asked about a call that waits for a person's approval (None:
        nobody, and such a call is denied)."""
        with tool_call(session, call, {*self.spec.names, *BROKER_TOOL_NAMES}) as seen:
            if is_broker_tool(call.name):
                text = seen.result(await self._broker(session, call, asker))
            elif self.approval.asks(call.name) and self.log is not None:
                text = seen.result(await self._core_asked(session, call, self.log, asker))
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
        self, session: str, call: ToolCall, session_log: SessionLog, asker: Asker | None
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
            asker,
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

    async def _broker(self, session: str, call: ToolCall, asker: Asker | None) -> str:
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
            self.log, self.broker, asker, asked, self.approval.timeout_s
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


def slots_refusal(missing: list[int], total: int, url: str, setting: str = "LOOPD_SLOTS") -> str:
    """The one line for ``setting`` (LOOPD_SLOTS, or an ``[[endpoint]]``'s ``slots``) naming
    slots the server at ``url`` does not have."""
    named = ", ".join(str(slot) for slot in missing)
    has = {1: "1 slot (0)", 2: "2 slots (0 and 1)"}.get(total, f"{total} slots (0 to {total - 1})")
    verb = "is" if len(missing) == 1 else "are"
    return f"{setting}: the server at {url} has {has}; {named} {verb} not among them"


@dataclass
class Runtime:
    """The pieces every front end's turns share, built once from the settings (and from what the
    self-test found, where it ran): the session log, the tools, the servers and the turns under
    way. Every turn runs through ``endpoints`` (``loopd.endpoints.serving``), one server or
    several."""

    settings: Settings
    log: SessionLog
    spec: ToolsSpec
    tools: SessionTools
    endpoints: Endpoints  # the servers: the [[endpoint]] tables, or the shorthand's one
    live: LiveTurns  # the turns under way (loopd.observe)
    # Set while the server differs from the recorded expectations (``loopd serve``): the front
    # end then tells each thread so instead of running its turn (``loopd.serverchange``).
    server_change: ServerChange | None = None

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        selftest: Mapping[str, ServerAnswers] = {},
        expected_dir: Path = DEFAULT_DIR,
        client_type: type[InferenceClient] = InferenceClient,
        rules: TurnRules | None = None,
    ) -> Runtime:
        """``selftest``: what the self-test found of each server (by endpoint name) where it ran
        in this process; every other server is known by what ``loopd selftest --record``
        stored in ``expected_dir``. ``client_type``: the class of each server's client (tests
        tap the traffic). ``rules``: what every turn goes by (default: the settings'; the
        terminal's passes every status on at once)."""
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        spec = load_tools_spec(settings.tools_file)
        session_log = SessionLog.open(settings.db_path)
        tools = SessionTools.open(settings, spec, session_log)
        live = LiveTurns()
        endpoints = Endpoints.open(
            settings,
            session_log,
            rules=rules or TurnRules.of(settings),
            live=live,
            head=(spec.sha256, settings.system_text),
            tools_text=spec.text,
            selftest=selftest,
            expected_dir=expected_dir,
            client_type=client_type,
        )
        return cls(settings, session_log, spec, tools, endpoints, live)

    async def start_terminal(self) -> None:
        """The check a terminal's chat or one-shot turn starts with: every server's ``/health``,
        at once, the ones down marked down and re-checked, as ``loopd serve`` starts
        (``loopd.endpoints.start``; ``NoEndpointUp`` when none answers); then the slots each
        one's turns name (``_check_slots``). The self-test's live probes are not run: they take
        a slot, and would evict the caches of the very sessions a script is about to serve."""
        await self.endpoints.start_checked(reachability_checker(self.endpoints.clients()))
        for server in self.endpoints.servers.values():
            if self.endpoints.fleet.health.is_up(server.name):
                await self._check_slots(server)
        self.endpoints.log_known()

    async def _check_slots(self, server: Server) -> None:
        """``ConfigError`` when the server's slots (LOOPD_SLOTS, or its table's ``slots``) name
        a slot it does not have (its id would wrap around to another slot). Asked of ``/props``
        without loading a model: a model not loaded yet is not checked (``loopd serve``'s
        self-test checks it)."""
        client = server.client
        try:
            total = (await client.props(purpose=Purpose.CHECK)).get("total_slots")
        except InferenceError as exc:
            log.info("the server's slots are not checked (%s)", exc)
            return
        if not isinstance(total, int) or total <= 0:
            return
        if missing := [slot for slot in server.endpoint.slots if slot >= total]:
            named = server.recorded_as
            setting = "LOOPD_SLOTS" if named is None else f"endpoint {named}'s slots"
            raise ConfigError(slots_refusal(missing, total, client.url, setting))

    async def aclose(self) -> None:
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
        return self.endpoints.head

    def front_end(
        self,
        report: StatusCallback,
        on_position: PositionCallback = lambda ahead: None,
        asker: Asker | None = None,
        tools: ToolRunner | None = None,
    ) -> FrontEnd:
        """What a front end passes to a turn; ``tools``: the runner of its tool calls (default:
        the session tools)."""
        return FrontEnd(report, tools or self.tools, on_position, asker)

    def turn(self, session: Session, report: StatusCallback, asker: Asker | None = None) -> Turn:
        """The session's next turn, as ``run_turn`` builds it, on its server (placed there now
        if it has none) and its slot there, without waiting for the slot."""
        server, slot = self.endpoints.seat(session)
        return self.endpoints.turn_on(server, session, slot, self.front_end(report, asker=asker))

    async def append_user(self, session: str, text: str, *, external_key: str) -> Taken:
        """Append a user message. One longer than one message may be in the context (of the
        session's server) is never cut silently: the whole text is kept in the session's
        workspace (``kept_message_path``), the model reads its head with a note naming that
        file, and ``Taken.notice`` is the line the person is told, where they wrote it."""
        server = self.endpoints.server_of(session)
        compactor = Compactor(server.budget, self.endpoints.rules.budget)
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
        """Read the session's prompt into its idle slot on its server (LOOPD_PREWARM); see
        ``loopd.prewarm``."""
        server, slot = self.endpoints.seat(session)
        return await self.endpoints.prewarm(server, session, slot)

    async def run_turn(
        self,
        session: Session,
        report: StatusCallback,
        on_position: PositionCallback = lambda ahead: None,
        *,
        asker: Asker | None = None,
        tools: ToolRunner | None = None,
    ) -> TurnOutcome:
        """A turn, once the session's slot is free (FIFO behind other sessions on it), on its
        server (``loopd.endpoints.serving``). ``asker``: who is asked about a tool call that
        waits for a person's approval (the front end's person; None: nobody, and such a call
        is denied); ``tools``: the runner of its tool calls (default: the session tools). A turn
        that ends without an answer is recorded as ended, with the line it ended on: a restart
        does not run it again (``loopd.turnstop.record_end``)."""
        front = self.front_end(report, on_position, asker, tools)
        outcome = await self.endpoints.run_turn(session, front)
        if outcome.failure is not None:
            record_end(self.log, session.name, outcome.failure)
        return outcome

    async def keep_warm(self, restarted: Collection[str] = ()) -> None:
        """Prewarm wanted sessions whenever their server is idle, and re-check down endpoints,
        until cancelled (``loopd.endpoints.warm``). ``restarted``: the front end's sessions,
        of which each slot's most recently active one is read back first."""
        await keep_warm(self.endpoints, restarted)

    async def resume(
        self,
        session: Session,
        report: StatusCallback,
        *,
        asker: Asker | None = None,
        tools: ToolRunner | None = None,
    ) -> TurnOutcome | None:
        """Finish what a crash left: interrupted tool calls get a result (brokerd's are asked
        again: it answers a known call id from its record without running it twice), then a
        pending turn runs. None when there was nothing to do."""
        state = self.log.state(session.name)
        runner = tools or self.tools
        for interrupted in state.interrupted_calls:
            call = interrupted.call  # as stored: the argument text the model streamed
            if self.tools.reruns(session.name, call):
                text = (await runner.run(session.name, call, asker)).text
            else:
                text = INTERRUPTED
            self.log.append_tool_result(session.name, tool_call_id=call.id, content=text)
        if state.interrupted_calls or state.pending_turn:
            return await self.run_turn(session, report, asker=asker, tools=tools)
        return None
