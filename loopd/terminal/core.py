"""The event-loop side of ``loopd chat`` and ``loopd run``: one session's turns, each of which the
terminal watches as it goes and may stop.

The engine reports a turn through its status callback (throttled for a thread's post; here every
status passes, so the answer appears as the server streams it) and runs tool calls through a
``ToolRunner``: both reach the ``Watcher`` of the turn (its calls through ``WatchedTools``). A
stop cancels the turn (the engine then closes the stream, which frees the slot on the server,
and records the request as broken) and writes the stop record that a thread's ``stop`` writes
(``loopd.turnstop``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import anyio

from loopd.approvals.call import Asker
from loopd.chat.status import InLine
from loopd.config import Settings
from loopd.endpoints.server import TurnRules
from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Status
from loopd.errors import LoopdError
from loopd.observe.perfsummary import format_summary, perf_records, summarize
from loopd.selftest.expected import DEFAULT_DIR
from loopd.sessionlog.records import Session, fresh_external_key
from loopd.sessions import Runtime
from loopd.terminal.approve import TerminalAsker
from loopd.terminal.inuse import SessionLocks
from loopd.tools.core import ToolResult
from loopd.turn.loop import ToolRunner
from loopd.turnstop import record_stop, retry_target, take_back
from loopd.wire.assemble import ToolCall

log = logging.getLogger(__name__)


class Watcher(Protocol):
    """Told what a turn does, on the event loop, as it happens."""

    def status(self, status: Status) -> None: ...

    def in_line(self, in_line: InLine) -> None: ...

    def tool_started(self, call: ToolCall) -> None: ...

    def tool_finished(self, call: ToolCall, result: str) -> None: ...


@dataclass(frozen=True)
class Stopped:
    """The turn was stopped (Ctrl-C); ``seq`` is the stop record's entry. ``notices``: what the
    person is told besides (their message was too long for the context)."""

    seq: int
    notices: tuple[str, ...] = ()


TurnEnd = TurnOutcome | Stopped


@dataclass
class WatchedTools:
    """The session's tools, with the watcher told of each call and its result."""

    inner: ToolRunner
    watcher: Watcher

    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        self.watcher.tool_started(call)
        result = await self.inner.run(session, call, asker)
        self.watcher.tool_finished(call, result.text)
        return result


class ChatCore:
    """One terminal's session on the runtime; every method runs on the event loop."""

    def __init__(self, runtime: Runtime, session: Session, who: str, locks: SessionLocks) -> None:
        self.runtime = runtime
        self.session = session
        self.who = who  # who a stop is recorded for: the local user
        self.locks = locks  # the session is this terminal's alone (``loopd.terminal.inuse``)
        # Asks y/n when a tool call waits for approval (loopd.approvals); piped input has
        # nobody to ask, and such a call is denied.
        self.asker: Asker | None = TerminalAsker(who) if sys.stdin.isatty() else None
        self._scope: anyio.CancelScope | None = None
        self._stopping = False
        self._closing = anyio.Event()

    @classmethod
    async def open(
        cls, settings: Settings, session_name: str, who: str, expected_dir: Path = DEFAULT_DIR
    ) -> ChatCore:
        """The session's runtime; ``SessionInUse`` when another terminal has the session.
        ``expected_dir``: where ``loopd selftest --record`` stored what each server does
        (durable sessions and pinning go by it: ``loopd.endpoints.server``)."""
        locks = SessionLocks(settings.state_dir)
        locks.take(session_name)
        # Every status goes through: each is one small write to the terminal, and the answer
        # should appear as it is written, not in half-second jumps.
        rules = TurnRules.of(settings, status_interval_s=0.0)
        try:
            runtime = Runtime.open(settings, expected_dir=expected_dir, rules=rules)
        except BaseException:
            locks.release()
            raise
        try:
            await runtime.start_terminal()
            session = runtime.ensure_session(session_name)
        except BaseException:
            await runtime.aclose()
            locks.release()
            raise
        return cls(runtime, session, who, locks)

    async def serve(self) -> None:
        """Until ``close``: while the user types, a session's prompt is read back into its slot
        after a restart or a compaction (LOOPD_PREWARM); a turn cancels a prewarm at once."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.runtime.keep_warm, [self.session.name])
                await self._closing.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.runtime.aclose()
            self.locks.release()

    def close(self) -> None:
        self._closing.set()

    # -- turns -----------------------------------------------------------------------------------

    async def say(self, text: str, watcher: Watcher) -> TurnEnd:
        """Store the user's message and run the turn that answers it; a message too long for
        the context is said so among the end's notices."""
        self._stopping = False
        name = self.session.name
        taken = await self.runtime.append_user(name, text, external_key=fresh_external_key())
        end = await self._watched(watcher, lambda: self._run_turn(watcher))
        assert end is not None  # a turn that ran has an outcome, or was stopped
        if taken.notice is None:
            return end
        if isinstance(end, Stopped):
            return replace(end, notices=(taken.notice, *end.notices))
        end.notices.insert(0, taken.notice)
        return end

    def check_retry(self) -> None:
        """``NothingToRetry`` (one line) when ``retry`` has nothing to run again."""
        retry_target(self.runtime.log.state(self.session.name))

    async def retry(self, watcher: Watcher) -> TurnEnd | None:
        """Run the session's latest turn again (``/retry``): its answer generated again from
        the same messages, or a turn that ended without one run again (``loopd.turnstop``);
        ``NothingToRetry`` when there is neither."""
        take_back(self.runtime.log, self.session.name, self.who)
        log.info("the latest turn of %s runs again, asked by @%s", self.session.name, self.who)
        return await self.resume(watcher)

    async def resume(self, watcher: Watcher) -> TurnEnd | None:
        """The turn a previous run left pending, unless a person stopped it; None when there is
        none to run."""
        self._stopping = False
        if self.runtime.log.state(self.session.name).idle:  # a stopped turn has ended too
            return None
        log.info("resuming the pending turn of %s", self.session.name)

        async def resume() -> TurnOutcome | None:
            return await self.runtime.resume(
                self.session, watcher.status, asker=self.asker, tools=self._tools(watcher)
            )

        return await self._watched(watcher, resume)

    def stop(self) -> None:
        """Stop the turn under way (or the one about to start)."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def _run_turn(self, watcher: Watcher) -> TurnOutcome:
        slot = self.session.slot

        def on_position(ahead: int) -> None:
            watcher.in_line(InLine(slot, ahead))

        return await self.runtime.run_turn(
            self.session, watcher.status, on_position, asker=self.asker, tools=self._tools(watcher)
        )

    def _tools(self, watcher: Watcher) -> ToolRunner:
        """The session tools, with ``watcher`` told of each call and its result."""
        return WatchedTools(self.runtime.tools, watcher)

    async def _watched(
        self, watcher: Watcher, run: Callable[[], Awaitable[TurnOutcome | None]]
    ) -> TurnEnd | None:
        outcome: TurnOutcome | None = None
        scope = self._scope = anyio.CancelScope()
        try:
            with scope:
                if self._stopping:
                    scope.cancel()
                outcome = await run()
        finally:
            self._scope = None
        if scope.cancelled_caught:
            entry = record_stop(self.runtime.log, self.session.name, self.who)
            log.info("turn of %s stopped by @%s", self.session.name, self.who)
            return Stopped(entry.seq)
        return outcome

    # -- the / commands --------------------------------------------------------------------------

    def new_session(self, name: str) -> Session:
        if name in self.session_names():
            raise SessionExists(name)
        self.locks.take(name)
        self.session = self.runtime.ensure_session(name)
        return self.session

    def switch_to(self, name: str) -> Session:
        """Go on with the existing session ``name`` (its turns, its slot); ``SessionInUse``
        when another terminal has it."""
        if name not in self.session_names():
            raise NoSuchSession(name)
        self.locks.take(name)
        self.session = self.runtime.ensure_session(name)
        return self.session

    def session_names(self) -> list[str]:
        return [session.name for session in self.runtime.log.sessions()]

    def perf_text(self) -> str:
        requests = self.runtime.log.requests(self.session.name)
        return format_summary(f"session {self.session.name}", summarize(requests))

    def last_request_row(self) -> int:
        """The row of the session's latest request in the log (0 before its first)."""
        requests = self.runtime.log.requests(self.session.name)
        return requests[-1].id if requests else 0

    def perf_since(self, request_row: int) -> list[dict[str, Any]]:
        """The perf records of the session's requests after the row ``request_row``."""
        requests = [r for r in self.runtime.log.requests(self.session.name) if r.id > request_row]
        return perf_records(self.session.name, requests)


class SessionExists(LoopdError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"a session {name!r} exists already: /resume {name} goes on with it "
            "(on the line below: Enter sends it), or /new takes a name not used yet"
        )


class NoSuchSession(LoopdError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no session {name!r}; /sessions lists them, /new {name} starts it")
