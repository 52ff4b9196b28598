"""The tool broker itself: ``find_tool`` and ``call_tool`` over the catalogue, the audit log and
the executor. The decisions are the pure functions of ``ranking``, ``calls`` and ``wording``;
this class only reads and writes the audit log around them and runs what they allow.
"""

import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from brokerd import approval as approvals
from brokerd.approval import ApprovalBody, Decided, NotThisCall, approval_mode
from brokerd.config import check_approval_names
from brokerd.confine import (
    ConfinementError,
    check_declared,
    detect_host_view,
    hidden_paths,
)
from brokerd.tools import wording
from brokerd.tools.audit import AuditLog, AuditLogError, open_audit_log, prune_audit_log
from brokerd.tools.builtins import BUILTINS, BuiltinContext, BuiltinHandler, WebTransport
from brokerd.tools.calls import (
    CallRequest,
    Conflict,
    Interrupted,
    Ready,
    Rejected,
    Replay,
    Run,
    Wait,
    decide,
    plan_call,
)
from brokerd.tools.catalogue import Catalogue, CommandRun, McpRun, load_catalogue
from brokerd.tools.errors import CallConflictError
from brokerd.tools.execute import Confiner, execute, limits_for
from brokerd.tools.ranking import rank
from brokerd.tools.settings import BrokerSettings
from loopcommon.approvals import decided_result
from loopcommon.callstatus import CallStatus

if TYPE_CHECKING:
    from brokerd.mcp.config import McpServerConfig
    from brokerd.mcp.servers import McpServers

logger = logging.getLogger(__name__)

# The audit database and the files SQLite keeps beside it.
AUDIT_SUFFIXES = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True)
class FoundTools:
    result: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class CallAnswer:
    result: str
    status: CallStatus
    recorded_status: CallStatus | None = None
    approval_id: str | None = None  # for loopd only (status "needs_approval")
    description: str | None = None  # with an approval id: the tool's, for the person asked


class ToolBroker:
    def __init__(
        self,
        settings: BrokerSettings,
        catalogue: Catalogue,
        audit: AuditLog,
        builtins: Mapping[str, BuiltinHandler] = BUILTINS,
        transport: WebTransport | None = None,
        confiner: Confiner | None = None,
        mcp: "McpServers | None" = None,
    ) -> None:
        self.settings = settings
        self.files = catalogue
        self.mcp = mcp
        self._audit = audit
        self._builtins = builtins
        self._transport = transport
        self._confiner = confiner
        self._roots = tuple(
            Path(os.path.normpath(root.absolute())) for root in settings.host_path_roots
        )
        # Keys running in this process. Claimed and checked with no await in between, so two
        # identical requests arriving together run once: the second waits, then replays.
        self._running: dict[tuple[str, str], anyio.Event] = {}

    @classmethod
    def open(
        cls,
        settings: BrokerSettings,
        transport: WebTransport | None = None,
        hidden: Sequence[Path] = (),
        mcp: "Sequence[McpServerConfig]" = (),
    ) -> "ToolBroker":
        """Load the catalogue (raising ``CatalogueError`` naming a bad file, ``ConfigError``
        naming a tool of ``[broker.approval]`` that no tool can be) and the audit log.

        Command tools and stdio MCP servers run confined: ``ConfinementError`` when that is
        impossible here, or when one declares a path that holds one of brokerd's own
        (``hidden``, plus the audit log).
        """
        catalogue = load_catalogue(settings.catalogue_dir, BUILTINS.keys())
        check_approval_names(settings.approval, catalogue.tools, [m.name for m in mcp])
        audit = open_audit_log(settings)
        if settings.audit_retention_days is not None:
            pruned = prune_audit_log(audit, settings.audit_retention_days)
            logger.info(
                "audit log: pruned %d rows older than %g days",
                pruned,
                settings.audit_retention_days,
            )
        try:
            confiner = cls._confiner_for(catalogue, settings, hidden)
            servers = cls._mcp_servers(mcp, settings, hidden)
        except ConfinementError:
            audit.close()
            raise
        return cls(settings, catalogue, audit, transport=transport, confiner=confiner, mcp=servers)

    @staticmethod
    def _mcp_servers(
        configs: "Sequence[McpServerConfig]", settings: BrokerSettings, hidden: Sequence[Path]
    ) -> "McpServers | None":
        if not configs:
            return None
        from brokerd.mcp.servers import McpServers  # the MCP SDK, loaded only when configured

        audit_files = [
            settings.audit_db.with_name(settings.audit_db.name + s) for s in AUDIT_SUFFIXES
        ]
        return McpServers.build(configs, hidden_paths([*hidden, *audit_files]))

    @property
    def catalogue(self) -> Catalogue:
        """The catalogue files' tools, and the tools of the MCP servers as last listed."""
        return self.files.with_tools(self.mcp.tools()) if self.mcp else self.files

    @staticmethod
    def _confiner_for(
        catalogue: Catalogue, settings: BrokerSettings, hidden: Sequence[Path]
    ) -> Confiner | None:
        commands = [spec for spec in catalogue if isinstance(spec.run, CommandRun)]
        if not commands:
            return None
        audit = settings.audit_db
        audit_files = [audit.with_name(audit.name + suffix) for suffix in AUDIT_SUFFIXES]
        confiner = Confiner(detect_host_view(), hidden_paths([*hidden, *audit_files]))
        for spec in commands:
            try:
                check_declared(confiner.confinement(spec.confine, settings.host_path_roots))
            except ConfinementError as exc:
                raise ConfinementError(f"tool {spec.name}: {exc}") from None
        return confiner

    def close(self) -> None:
        self._audit.close()

    def find_tool(self, session: str, query: str) -> FoundTools:
        found = rank(query, self.catalogue, self.settings.find_tool_limit)
        result = wording.find_tool_result(query, found, list(self.catalogue.tools))
        names = tuple(ranked.spec.name for ranked in found)
        self._audit.record_find(session, query, names, result)
        return FoundTools(result, names)

    async def call_tool(
        self,
        session: str,
        call_id: str,
        name: str,
        arguments: str | object,
        approval: ApprovalBody | None = None,
    ) -> CallAnswer:
        """Answer one call; ``arguments`` is the model's text (or its already-parsed value);
        ``approval`` the person's decision, for a tool that asks (``brokerd.approval``)."""
        text = arguments if isinstance(arguments, str) else wording.compact_json(arguments)
        request = CallRequest(session, call_id, name, text)
        key = (session, call_id)
        while True:
            recorded = self._audit.recorded_call(session, call_id)
            decision = decide(recorded, request, key in self._running)
            if isinstance(decision, Wait):
                await self._running[key].wait()
            elif isinstance(decision, Replay):
                return CallAnswer(decision.result, "replayed", decision.recorded_status)
            elif isinstance(decision, Interrupted):
                self._audit.record_end(session, call_id, "interrupted", decision.result)
                return CallAnswer(decision.result, "interrupted")
            elif isinstance(decision, Conflict):
                raise CallConflictError(decision.message)
            else:
                assert isinstance(decision, Run)
                return await self._run_new(request, arguments, approval)

    def _gate(
        self, request: CallRequest, plan: Ready, body: ApprovalBody | None
    ) -> CallAnswer | Decided | None:
        """None when the call may run; a ``CallAnswer`` when it may not (yet); a ``Decided``
        when a person allowed or denied it (recorded here, once)."""
        if approval_mode(plan.spec, self.settings.approval) == "auto":
            return None
        asked = self._audit.approval_for(request.session, request.call_id)
        gated = approvals.gate(asked, request.session, request.call_id, request.sha256, body)
        if isinstance(gated, NotThisCall):
            logger.warning("call %s of %s: %s", request.call_id, request.session, gated.reason)
            text = approvals.not_this_call_result(request.name, gated.reason)
            return CallAnswer(text, "refused")
        if isinstance(gated, Decided):
            if gated.new:
                assert asked is not None
                self._audit.record_decided(asked.id, gated.verdict, gated.by)
            return gated
        approval_id = gated.approval_id
        if approval_id is None:
            approval_id = secrets.token_urlsafe(approvals.APPROVAL_ID_BYTES)
            self._audit.record_asked(approval_id, request)
        text = approvals.waiting_result(request.name)
        return CallAnswer(
            text, "needs_approval", approval_id=approval_id, description=plan.spec.description
        )

    async def _run_new(
        self, request: CallRequest, arguments: str | object, approval: ApprovalBody | None
    ) -> CallAnswer:
        key = (request.session, request.call_id)
        done = anyio.Event()
        self._running[key] = done
        try:
            shown = self._audit.shown_names(request.session)
            plan = plan_call(self.catalogue, shown, request.name, arguments, self._roots)
            gated = self._gate(request, plan, approval) if isinstance(plan, Ready) else None
            if isinstance(gated, CallAnswer):  # nothing recorded as the call: the key stays free
                return gated
            # Committed before anything runs: a crash from here on replays as "interrupted".
            self._audit.record_start(request)
            if isinstance(gated, Decided) and gated.verdict != "allow":
                status: CallStatus = "denied"
                result = decided_result(request.name, gated.verdict, gated.by)
            else:
                status, result = await self._answer(plan)
                if isinstance(gated, Decided):
                    result = decided_result(request.name, "allow", gated.by, result)
            self._audit.record_end(request.session, request.call_id, status, result)
            return CallAnswer(result, status)
        except anyio.get_cancelled_exc_class():
            # brokerd is stopping mid-call: record what is known (synchronous, so it cannot be
            # cancelled itself), then let the cancellation go on.
            result = wording.interrupted(request.name, request.call_id)
            try:
                self._audit.record_end(request.session, request.call_id, "interrupted", result)
            except AuditLogError:
                logger.exception("could not record call %s as interrupted", request.call_id)
            raise
        finally:
            del self._running[key]
            done.set()

    async def _answer(self, plan: Rejected | Ready) -> tuple[CallStatus, str]:
        if isinstance(plan, Rejected):
            return plan.status, plan.result
        limits = limits_for(plan.spec, self.settings)
        context = BuiltinContext(
            web_fetch_allowlist=self.settings.web_fetch_allowlist,
            web_fetch_max_redirects=self.settings.web_fetch_max_redirects,
            http_timeout_s=limits.timeout_s,
            transport=self._transport,
        )
        try:
            if isinstance(plan.spec.run, McpRun) and self.mcp is not None:
                outcome = await self.mcp.call(plan, limits)
            else:
                outcome = await execute(plan, limits, self._builtins, context, self._confiner)
        except Exception as exc:
            # A bug in a tool handler must still end the call in the audit log with words the
            # model can read, not leave it "started" forever.
            logger.exception("tool %s raised unexpectedly", plan.spec.name)
            return "error", f"{plan.spec.name} failed inside brokerd: {type(exc).__name__}: {exc}"
        return outcome.status, wording.outcome_result(plan.spec.name, outcome)
