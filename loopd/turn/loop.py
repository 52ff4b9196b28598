"""A turn: request, stream, record, run tools, repeat until the model answers.

Read as three short steps (``run`` -> ``round`` -> ``execute``). Each way out of a turn is an
exception that carries what the outcome records (``Answered``, ``RequestFailed``,
``RoundsExhausted``); ``run`` turns it into the ``TurnOutcome``. The session log is the truth: each
request is rebuilt from what is stored, and what happened is appended (in ``finally``, so that no
way out of a request skips it) before the next step begins, so a crash at any point leaves a state
the next start derives and resumes from.

A request that fails is recorded as broken (never replayed) and sent again only when that is safe
(``outcome.retry_safe``: nothing the model made was lost, not a 4xx), a bounded number of times with
a growing wait. The next attempt is built from the log like the first, so it sends the same bytes.

Log calls are synchronous SQLite writes of well under a millisecond in WAL mode (``make bench``
measures them); they run on the event loop rather than in a thread so that their order is the
order of events, and so that a cancelled request is recorded before the cancellation goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tenacity import RetryCallState, retry_if_result

from loopcommon.backoff import Backoff
from loopcommon.jsonbytes import dumps
from loopcommon.retry import retrying
from loopd.approvals.call import Asker
from loopd.contextwindow import pool
from loopd.contextwindow.budget import ServerBudget
from loopd.engine import guards
from loopd.engine.cacheloss import (
    Circumstances,
    Loss,
    LossCause,
    PrevRequest,
    cache_loss,
    endpoint_changed,
    previous_request,
    shared_head_bound,
)
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.outcome import (
    Failure,
    Loop,
    RequestResult,
    TurnOutcome,
    request_perf,
    retry_safe,
)
from loopd.engine.progress import Phase, Status, StatusCallback
from loopd.engine.request import RequestSettings, build_body
from loopd.engine.saverule import SaveDecision
from loopd.engine.stream import start_result, stream_into
from loopd.errors import InferenceError
from loopd.observe import recorder
from loopd.observe.metrics import METRICS
from loopd.observe.recorder import Reply, Sent
from loopd.requestscope import request_scope
from loopd.sessionlog.records import Epoch, NoteReason, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from loopd.tools.core import ToolResult
from loopd.turn.saves import DurableSlots, Probe, Restore
from loopd.wire.assemble import ToolCall

log = logging.getLogger(__name__)

# Requests a turn may make: an answer, or tool calls and their follow-ups, then it stops.
DEFAULT_MAX_ROUNDS = 16


class ToolRunner(Protocol):
    """Runs one tool call of a session: the result text for the log, and whether it failed;
    ``asker``: who is asked about a call that waits for a person's approval (None: nobody, and
    such a call is denied)."""

    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult: ...


class TurnExit(Exception):
    """A way out of a turn, carrying what its outcome records."""

    def settle(self, outcome: TurnOutcome) -> None:
        raise NotImplementedError


class Answered(TurnExit):
    """The model answered without calling a tool."""

    def __init__(self, answer: str) -> None:
        super().__init__("answered")
        self.answer = answer

    def settle(self, outcome: TurnOutcome) -> None:
        outcome.answer = self.answer


class RequestFailed(TurnExit):
    """A request failed and another attempt was not safe, or none was left."""

    def __init__(self, detail: str, cause: Failure | None) -> None:
        super().__init__(detail)
        self.detail, self.cause = detail, cause

    def settle(self, outcome: TurnOutcome) -> None:
        outcome.failure, outcome.cause = self.detail, self.cause


class RoundsExhausted(TurnExit):
    """The model kept calling tools for ``max_rounds`` requests."""

    def __init__(self, rounds: int) -> None:
        super().__init__(f"stopped after {rounds} tool rounds without an answer")

    def settle(self, outcome: TurnOutcome) -> None:
        outcome.failure = str(self)


class Guarded(TurnExit):
    """A loop guard ended the turn (``loopd.engine.guards``): the same call again, a cycle, a
    run of failures, too many calls or too much tool time."""

    def __init__(self, stop: guards.Stop) -> None:
        super().__init__(stop.line)
        self.guard = stop.guard

    def settle(self, outcome: TurnOutcome) -> None:
        outcome.failure, outcome.guard = str(self), self.guard


class ContextGate(Protocol):
    """Keeps a session inside its slot's context (``loopd.contextwindow.compaction``)."""

    async def before_request(self, turn: Turn, kind: RequestKind, outcome: TurnOutcome) -> None:
        """Compact the session first when the next request would not fit."""

    async def fit_input(self, text: str, what: str) -> str:
        """``text``, or its head with a visible note when one message cannot hold it."""


@dataclass(frozen=True)
class Attempt:
    """One request as sent and recorded."""

    record: RequestRecord
    result: RequestResult


@dataclass
class PersonWait:
    """Since when the person has waited for the turn's first token (monotonic); None once a
    request of the turn got one (``loopd.engine.waits``)."""

    since: float | None = None


@dataclass
class SaveChoice:
    """The save rule's decision on the state the turn's answer leaves (``Turn._measured``), for
    ``Turn.save_slot``; None until an answer was measured."""

    decision: SaveDecision | None = None


@dataclass(frozen=True)
class Turn:
    """Everything a turn needs, built once (``loopd.endpoints.server.build_turn``) and never
    changed; it holds no conversation state of its own.

    ``slot`` is the session's slot, recorded with every request; ``settings.slot`` is what goes
    out as ``id_slot``: the same where sessions are pinned, else ``ANY_SLOT`` (the server places
    the request; ``loopd.engine.pinning``). ``pinned`` and ``pool_clears_idle_slots`` tell the
    cache-loss rule which causes are possible.
    """

    session: str
    slot: int
    client: InferenceClient
    log: SessionLog
    settings: RequestSettings
    limits: Limits
    tools: ToolRunner | None = None
    max_rounds: int = DEFAULT_MAX_ROUNDS
    guard_limits: guards.GuardLimits = field(default_factory=guards.GuardLimits)
    template_drops_reasoning: bool = False
    report: StatusCallback = field(default=lambda status: None)
    gate: ContextGate | None = None
    pinned: bool = True
    pool_clears_idle_slots: bool = False
    # Where loopd runs several servers: this one's name (recorded with each request).
    endpoint: str | None = None
    # Durable sessions (``loopd.engine.durable``): a request sent after a restore names the slot
    # the restore filled, pinned or not.
    durable: DurableSlots | None = None
    # Who is asked about a tool call that waits for a person's approval (the front end's, its
    # wait stepping aside from the slot); None: nobody can be asked, and such a call is denied.
    asker: Asker | None = None
    # When the turn asked for its slot (monotonic; default: when it runs): the start of the wait
    # a person sees, which ends at the turn's first token (``loopd.engine.waits``).
    asked_at: float | None = None
    # The person's wait while it lasts: run state, set as the turn runs (the turn itself is
    # never changed once built).
    _wait: PersonWait = field(default_factory=PersonWait, init=False, repr=False)
    # The save rule's decision on the answer's state: run state too.
    _save: SaveChoice = field(default_factory=SaveChoice, init=False, repr=False)

    async def run(self) -> TurnOutcome:
        self._wait.since = self.asked_at if self.asked_at is not None else time.monotonic()
        outcome = TurnOutcome(answer=None)
        kind = RequestKind.TURN
        # Each request of the turn extends the previous one's messages; the session's text is
        # let go when the turn ends.
        with self.log.holding_replay(self.session):
            try:
                if self.durable is not None:
                    await self.durable.before_turn(self.session)
                for _ in range(self.max_rounds):
                    await self.round(kind, outcome)
                    kind = RequestKind.TOOL_FOLLOWUP
                raise RoundsExhausted(self.max_rounds)
            except TurnExit as way_out:
                way_out.settle(outcome)
                if isinstance(way_out, Answered):
                    await self.save_slot(outcome)
        return outcome

    def summariser(self, report: StatusCallback, *, max_tokens: int, think_cap: int) -> Turn:
        """This turn as the request that asks for a compaction's summary (``Compactor``): its
        own report, answer length and thinking cap, no tools and no context gate."""
        return replace(
            self,
            report=report,
            settings=replace(self.settings, max_tokens=max_tokens),
            limits=replace(self.limits, think_cap=think_cap),
            tools=None,
            gate=None,
        )

    async def save_slot(self, outcome: TurnOutcome) -> None:
        """At the end of an answered turn, while the session still holds its slot: save what
        the slot holds, the prefix the session's next request extends, where the save rule
        found it pays (its decision is in the answer's perf record)."""
        if self.durable is None or not outcome.requests:
            return
        self.durable.held(self.session)
        if outcome.requests[-1].perf.outcome != "complete":
            return
        decision = self._save.decision
        if decision is None or not decision.save:
            return
        await self.durable.save(
            replace(self.log.get_session(self.session), slot=self.slot),  # its slot here
            self.settings,
            self.log.current_epoch(self.session).tools_text,
            self.log.replay_messages(self.session),
        )

    async def round(self, kind: RequestKind, outcome: TurnOutcome) -> None:
        """One request and the tool calls it made; raises the turn's exit when none were made."""
        if self.gate is not None:
            await self.gate.before_request(self, kind, outcome)
        result = (await self.request(kind, outcome)).result
        for loop in result.looped:  # the repetition watch ended a thought or an answer
            METRICS.guard_fired(*_LOOP_FIRINGS[loop])
        outcome.notices.extend(result.notes)
        if not result.complete:
            raise RequestFailed(result.detail, result.failure)
        message = result.assembler.message()
        if not message.tool_calls:
            if result.assembler.finish_reason == "length":
                timings = result.assembler.timings
                outcome.cut_at = timings.predicted_n if timings is not None else 0
            raise Answered(message.content)
        await self.execute(message.tool_calls, outcome)

    async def request(self, kind: RequestKind, outcome: TurnOutcome) -> Attempt:
        """``step`` until it completes or another attempt would not be safe; every attempt is
        recorded (in ``outcome.requests`` too)."""

        last: list[Attempt] = []

        async def step() -> Attempt:
            if last and last[-1].result.failure is Failure.POOL_FULL:
                await self.wait_for_idle_pool()
            attempt = await self.step(kind)
            outcome.requests.append(attempt.record)
            last.append(attempt)
            return attempt

        attempts = retrying(
            Backoff(first_s=self.limits.retry_wait_s, cap_s=30.0),
            retry_if_result(lambda attempt: retry_safe(attempt.result)),
            attempts=self.limits.attempts,
            retry_error_callback=_last_attempt,
            before_sleep=lambda state: METRICS.retried("inference"),
            reraise=False,
        )
        attempt: Attempt = await attempts(step)
        return attempt

    async def wait_for_idle_pool(self) -> None:
        """After a pool-full failure: wait (shown as queued) until no slot runs a request, so
        that the same request does not meet the same full pool; at most the first-byte limit."""
        ready = await pool.wait_for(
            self.client,
            pool.all_idle,
            limit_s=self.limits.first_byte_s,
            poll_s=self.limits.slots_poll_s,
            on_wait=lambda: self.report(Status(Phase.QUEUED)),
        )
        if not ready:
            log.warning("%s: the pool stayed busy; sending again anyway", self.session)

    async def step(self, kind: RequestKind) -> Attempt:
        """One request, built from the log, streamed, and recorded however it ended. Where the
        model forgot the session since its save (loopd read it asleep, unloaded or restarted),
        the save is restored first and the request sent once; where the request's first
        progress event shows the server lost it, the request is closed there, the save
        restored, and the request sent again. A restore goes only into the weights that wrote
        the save: the model is read again first."""
        probe = self._probe()
        if probe is not None and probe.restore_first:
            probe = await self._read_again(probe)
            if probe.restore_first:
                return await self._restored(kind, probe)
        attempt = await self._send(kind, probe)
        if attempt.result.failure is Failure.LOST_BY_SERVER and probe is not None:
            probe = await self._read_again(probe)
            if probe.saved is not None:
                return await self._restored(kind, probe)
            attempt = await self._send(kind, None)  # its save is not for these weights
        return attempt

    async def _read_again(self, probe: Probe) -> Probe:
        """The probe again, on a fresh reading of the model (its fingerprint now)."""
        assert self.durable is not None
        await self.durable.look()
        again = self._probe()
        assert again is not None
        again.held = probe.held
        return again

    async def _restored(self, kind: RequestKind, probe: Probe) -> Attempt:
        """The probe's save restored, then the request sent (naming the slot restored into)."""
        assert self.durable is not None
        restore = await self.durable.restore(probe)
        try:
            return await self._send(kind, None, restore)
        finally:
            self.durable.release(restore)

    def _probe(self) -> Probe | None:
        if self.durable is None:
            return None
        return self.durable.probe(
            self.session,
            self.log.current_epoch(self.session).tools_text,
            self.log.replay_messages(self.session),
            self.slot,
            displaced=self._displaced(),
        )

    def _displaced(self) -> bool:
        """Pinned, another session's request ran on the session's slot since its own latest:
        the slot holds that prompt now (a pinned request is not restored from the server's host
        cache), as the log says without asking the server."""
        if not self.pinned:
            return False
        prev = previous_request(self.log.latest_request(self.session, counted=True))
        if prev is None:
            return False
        return self.log.slot_used_since(
            self.slot, prev.request_row, besides=self.session, endpoint=self.endpoint
        )

    async def _send(
        self, kind: RequestKind, probe: Probe | None, restore: Restore | None = None
    ) -> Attempt:
        epoch = self.log.current_epoch(self.session)
        messages = self.log.replay_messages(self.session)
        settings = self.settings
        if restore is not None and restore.slot is not None:
            # Where the server places requests, it must read on from the slot just restored.
            settings = replace(settings, slot=restore.slot)
        body = build_body(settings, epoch.tools_text, messages)
        result = start_result()
        result.wait.asked = self._wait.since
        reply_short = 0
        with request_scope(self.session) as scope:  # its id in the headers and the log lines
            try:
                await stream_into(
                    result,
                    self.client,
                    body,
                    slot=settings.slot,
                    limits=self.limits,
                    report=self.report,
                    lost=None if probe is None else probe.lost,
                )
                reply_short = await self._reply_short(result)
            finally:
                if result.wait.first_token is not None:
                    self._wait.since = None  # the person's wait ended on this request
                # Synchronous, so a cancellation going on cannot interrupt it.
                record = self._record(
                    kind, epoch, messages, result, restore, scope.request_id, reply_short
                )
        return Attempt(record, result)

    async def _reply_short(self, result: RequestResult) -> int:
        """For a reply cut at ``max_tokens``: how many of the tokens generated its text lacks
        when read back (the server's ``/tokenize`` of it against ``predicted_n``), which the
        next request's cache-loss rule names (``LossCause.REPLY_TRIMMED``). Counted where the
        reply is one text (all reasoning, or all answer): where it holds both, the template's
        markers between them are generated tokens no text holds. 0 when not counted."""
        asm, timings = result.assembler, result.assembler.timings
        if not result.complete or asm.finish_reason != "length" or timings is None:
            return 0
        message = asm.message()
        texts = [t for t in (message.reasoning_content, message.content) if t]
        if len(texts) != 1 or message.tool_calls:
            return 0
        try:
            read_back = await ServerBudget(self.client).count_text(texts[0])
        except InferenceError as exc:
            log.info("%s: the cut reply could not be counted: %s", self.session, exc)
            return 0
        return max(timings.predicted_n - read_back, 0)

    async def execute(self, calls: Sequence[ToolCall], outcome: TurnOutcome) -> None:
        """Answer the calls of the model's latest message, each as the loop guards judge it
        (``loopd.engine.guards``): run, answered with a pointer to an earlier result, or not run
        because a guard ended the turn (then every later call of the message is not run either,
        and the turn ends with the guard's line, noted in the log)."""
        seen = {made.call.id: made for made in outcome.calls}
        made = guards.made_of_turn(self.log.replay_messages(self.session), seen)
        del made[len(made) - len(calls) :]  # the latest message's calls are judged one by one
        stop: guards.Stop | None = None
        for index, call in enumerate(calls, start=1):
            verdict = stop or guards.judge(
                self.guard_limits, made, call, in_message=index, tool_s=outcome.tool_s
            )
            done = guards.Made(call, ran=False, failed=None)
            match verdict:
                case guards.Run():
                    result = await self._run_tool(call, outcome)
                    text = result.text
                    done = guards.Made(call, ran=True, failed=not result.ok, result=text)
                case guards.Point(guard, text):
                    METRICS.guard_fired(guard, "pointed")
                case guards.Stop(_, line):
                    stop, text = verdict, f"not run: {line}"
            self.log.append_tool_result(self.session, tool_call_id=call.id, content=text)
            made.append(done)
            outcome.calls.append(done)
        if stop is None:
            after = guards.judge(self.guard_limits, made, None, tool_s=outcome.tool_s)
            stop = after if isinstance(after, guards.Stop) else None
        if stop is not None:
            METRICS.guard_fired(stop.guard, "stopped")
            # The turn ends here, for good (``loopd.turnstop``): a restart does not run it again.
            self.log.append_note(self.session, stop.line, reason=NoteReason.TURN_ENDED)
            log.warning(
                "%s: %s", self.session, stop.line, extra={"fields": {"guard": stop.guard.value}}
            )
            raise Guarded(stop)

    async def _run_tool(self, call: ToolCall, outcome: TurnOutcome) -> ToolResult:
        """Run one call (its time counted in the turn's tool time); a result too long for the
        context is cut with a visible note."""
        if self.tools is None:
            return ToolResult(f"error: tool {call.name!r} is not available in this session", False)
        started = time.monotonic()
        try:
            result = await self.tools.run(self.session, call, self.asker)
        finally:
            outcome.tool_s += time.monotonic() - started
        if self.gate is not None:
            result = ToolResult(
                await self.gate.fit_input(result.text, "this tool result"), result.ok
            )
        return result

    def _record(
        self,
        kind: RequestKind,
        epoch: Epoch,
        messages: list[str],
        result: RequestResult,
        restore: Restore | None = None,
        request_id: str | None = None,
        reply_short: int = 0,
    ) -> RequestRecord:
        """Record the request with the assistant entry (or the broken one); its record keeps
        ``request_id`` (the id its log lines carry) so both can be joined."""
        sent = Sent.of(kind, self.slot, epoch.number, messages)
        loss = self._loss(epoch, sent.digest, result, restore)
        perf = request_perf(result, loss, self.endpoint, request_id)
        if reply_short:
            perf = replace(perf, extra={**perf.extra, "reply_short": reply_short})
        save = self._measured(kind, result, loss, restore)
        if save is not None:
            perf = replace(perf, extra={**perf.extra, "save": save.extra()})
        timings = result.assembler.timings
        if result.failure is Failure.LOST_BY_SERVER:
            # Closed before the server read anything: not a request the slot holds
            # (``SessionLog.latest_request(counted=True)`` passes it over).
            perf = replace(perf, cache_n=None, prompt_n=None, predicted_n=None)
        elif restore is not None and timings is not None:
            perf = replace(perf, extra={**perf.extra, "restore": restore.extra(timings.cache_n)})
        message = dumps(result.assembler.message().to_wire())
        reply = Reply(message, result.complete, result.detail)
        return recorder.record(self.log, self.session, sent, perf, reply)

    def _measured(
        self, kind: RequestKind, result: RequestResult, loss: Loss, restore: Restore | None
    ) -> SaveDecision | None:
        """What durable sessions learn from a request (its read, and for a turn's first
        request, whether the server kept the session); for the answer, the save rule's
        decision on the state it leaves (``loopd.engine.saverule``)."""
        timings = result.assembler.timings
        if self.durable is None or timings is None:
            return None
        figures = self.durable.figures
        figures.read(timings.prompt_n, timings.prompt_ms)
        if kind is RequestKind.TURN and result.failure is None:
            # A request sent after a restore returned to a server that had lost the session.
            lost = loss.expected if restore is not None else loss.lost
            figures.returned(loss.expected, lost)
        if not result.complete or result.assembler.message().tool_calls:
            return None
        decision = self.durable.decide(timings.cache_n + timings.prompt_n + timings.predicted_n)
        self._save.decision = decision
        return decision

    def _loss(
        self, epoch: Epoch, digest: str, result: RequestResult, restore: Restore | None
    ) -> Loss:
        timings = result.assembler.timings
        if timings is None or result.failure is Failure.LOST_BY_SERVER:
            # It broke before the server said anything, or was closed before the server read
            # anything: the request sent again after the restore carries the loss.
            return Loss(0, 0, LossCause.NONE)
        prev = previous_request(self.log.latest_request(self.session, counted=True))
        around = self._circumstances(prev, epoch, digest)
        if self.durable is not None:
            verdict = None
            if restore is not None:
                verdict = self.durable.settle(self.session, restore, timings.cache_n)
            around = replace(around, durable=True, restore=verdict)
        return cache_loss(
            prev,
            epoch_id=epoch.number,
            slot=self.slot,
            cache_n=timings.cache_n,
            around=around,
        )

    def _circumstances(self, prev: PrevRequest | None, epoch: Epoch, digest: str) -> Circumstances:
        """What the log knows about what ran since ``prev``, for the cache-loss rule."""
        if prev is None:
            return Circumstances(pinned=self.pinned)
        # Pinned: what ran on this slot; placed by the server: what ran anywhere on this server
        # (another session's prompt may have been restored into the slot this one held).
        others = self.log.slot_used_since(
            self.slot if self.pinned else None,
            prev.request_row,
            besides=self.session,
            endpoint=self.endpoint,
        )
        return Circumstances(
            pinned=self.pinned,
            pool_clears_idle_slots=self.pool_clears_idle_slots,
            slot_shared=others and self.pinned,
            other_session_ran=others and not self.pinned,
            shared_head=shared_head_bound(
                self.log.latest_request(self.session, epoch=epoch.number, counted=True, first=True)
            ),
            template_drops_reasoning=self.template_drops_reasoning,
            resend=digest == prev.messages_sha256,
            endpoint_changed=endpoint_changed(prev.endpoint, self.endpoint),
            taken_back=self.log.taken_back_since(self.session, prev.recorded_at),
        )


# How the metrics count what the repetition watch ended (``loopd_guard_firings``).
_LOOP_FIRINGS = {
    Loop.REASONING: ("thinking_loop", "ended"),
    Loop.ANSWER: ("answer_loop", "closed"),
}


def _last_attempt(state: RetryCallState) -> Attempt:
    """When attempts run out, the turn goes on with the last one (recorded as broken)."""
    assert state.outcome is not None
    attempt: Attempt = state.outcome.result()
    return attempt
