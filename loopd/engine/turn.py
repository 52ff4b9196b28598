"""A turn: request, stream, record, run tools, repeat until the model answers.

Read as three short steps (``run`` -> ``round`` -> ``execute``). Each way out of a turn is an
exception that carries what the outcome records (``Answered``, ``RequestFailed``,
``RoundsExhausted``); ``run`` turns it into the ``TurnOutcome``. The session log is the truth: each
request is rebuilt from what is stored, and what happened is appended (in ``finally``, so that no
way out of a request skips it) before the next step begins, so a crash at any point leaves a state
the next start derives and resumes from.

A request that fails is recorded as broken (never replayed) and sent again only when that is safe
(``stream.retry_safe``: nothing the model made was lost, not a 4xx), a bounded number of times with
a growing wait. The next attempt is built from the log like the first, so it sends the same bytes.

Log calls are synchronous SQLite writes of well under a millisecond in WAL mode (``make bench``
measures them); they run on the event loop rather than in a thread so that their order is the
order of events, and so that a cancelled request is recorded before the cancellation goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import RetryCallState, retry_if_result

from loopcommon.backoff import Backoff
from loopcommon.jsonbytes import dumps
from loopcommon.retry import retrying
from loopd.engine import pool, repeats
from loopd.engine.client import InferenceClient
from loopd.engine.perf import (
    Circumstances,
    Loss,
    LossCause,
    PrevRequest,
    cache_loss,
    endpoint_changed,
)
from loopd.engine.request import RequestSettings, build_body
from loopd.engine.stream import (
    Failure,
    Limits,
    Phase,
    RequestResult,
    Status,
    StatusCallback,
    retry_safe,
    stream_into,
)
from loopd.observe.context import request_scope
from loopd.observe.metrics import METRICS
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Epoch, Perf, Request, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from loopd.wire.assemble import ToolCall

log = logging.getLogger(__name__)


class ToolRunner(Protocol):
    """Runs one tool call of a session and returns the result text for the log."""

    async def run(self, session: str, call: ToolCall) -> str: ...


@dataclass
class TurnOutcome:
    answer: str | None
    failure: str | None = None  # the last failed request's message, for the thread
    cause: Failure | None = None  # what ended the turn without an answer, when a request did
    requests: list[RequestRecord] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # one line each, for the thread
    cut_at: int | None = None  # the answer was cut at max_tokens: tokens generated (0: unknown)
    compacted: bool = False  # the turn started a new epoch (its session is worth a prewarm)


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


class Repeated(TurnExit):
    """The model made the same call again as often as the repeat guard allows
    (``loopd.engine.repeats``)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)

    def settle(self, outcome: TurnOutcome) -> None:
        outcome.failure = str(self)


class ContextGate(Protocol):
    """Keeps a session inside its slot's context (``loopd.engine.compaction``)."""

    async def before_request(self, turn: Turn, kind: RequestKind, outcome: TurnOutcome) -> None:
        """Compact the session first when the next request would not fit."""

    async def fit_input(self, text: str, what: str) -> str:
        """``text``, or its head with a visible note when one message cannot hold it."""


@dataclass(frozen=True)
class Attempt:
    """One request as sent and recorded."""

    record: RequestRecord
    result: RequestResult


def previous_request(request: Request | None) -> PrevRequest | None:
    """The cache-loss rule's view of the last request that reached the session's slot: the
    session's latest ``counted`` one (``SessionLog.latest_request``). Self-tests send their own
    prompts, and a request the server never streamed for (a 4xx, a refused connection), or one
    that broke before the server counted a prompt token, left the slot as it was: all are passed
    over by that query.
    """
    perf = None if request is None else request.record.perf
    if request is None or perf is None or perf.cache_n is None or perf.prompt_n is None:
        return None
    record = request.record
    return PrevRequest(
        epoch_id=record.epoch,
        slot=record.slot,
        cache_n=perf.cache_n,
        prompt_n=perf.prompt_n,
        predicted_n=perf.predicted_n or 0,
        complete=perf.outcome == "complete",
        capped=perf.capped,
        had_reasoning=bool(perf.extra.get("had_reasoning")),
        request_id=request.id,
        messages_sha256=record.messages_sha256,
        endpoint=perf.extra.get("endpoint"),
    )


def shared_head_bound(first: Request | None) -> int:
    """At most this many tokens begin every prompt of the epoch's sessions alike.

    Every session of the epoch begins with its system text and tools as the template renders
    them, the template's own text around the tools included (on the hybrid preset a 233-byte
    system text and tool came to 370 tokens: the bench's switching section), so the bytes of
    the texts do not bound it. The session's first prompt of the epoch does: that head and at
    least one token of its first message (``first``: the epoch's first ``counted`` request,
    ``SessionLog.latest_request``). 0 while no request of the epoch has timings.
    """
    if first is None:
        return 0
    perf = first.record.perf
    return max((perf.cache_n or 0) + (perf.prompt_n or 0) - 1, 0)


@dataclass
class Turn:
    """Everything a turn needs; it holds no conversation state of its own.

    ``slot`` is the session's slot, recorded with every request; ``settings.slot`` is what goes
    out as ``id_slot``: the same where sessions are pinned, else ``ANY_SLOT`` (the server places
    the request; ``loopd.engine.placement``). ``pinned`` and ``pool_clears_idle_slots`` tell the
    cache-loss rule which causes are possible.
    """

    session: str
    slot: int
    client: InferenceClient
    log: SessionLog
    settings: RequestSettings
    limits: Limits
    tools: ToolRunner | None = None
    max_rounds: int = 16
    repeat_limit: int = repeats.DEFAULT_LIMIT
    template_drops_reasoning: bool = False
    report: StatusCallback = field(default=lambda status: None)
    gate: ContextGate | None = None
    pinned: bool = True
    pool_clears_idle_slots: bool = False
    # Where loopd runs several servers: this one's name (recorded with each request).
    endpoint: str | None = None

    async def run(self) -> TurnOutcome:
        outcome = TurnOutcome(answer=None)
        kind = RequestKind.TURN
        # Each request of the turn extends the previous one's messages; the session's text is
        # let go when the turn ends.
        with self.log.holding_replay(self.session):
            try:
                for _ in range(self.max_rounds):
                    await self.round(kind, outcome)
                    kind = RequestKind.TOOL_FOLLOWUP
                raise RoundsExhausted(self.max_rounds)
            except TurnExit as way_out:
                way_out.settle(outcome)
        return outcome

    async def round(self, kind: RequestKind, outcome: TurnOutcome) -> None:
        """One request and the tool calls it made; raises the turn's exit when none were made."""
        if self.gate is not None:
            await self.gate.before_request(self, kind, outcome)
        result = (await self.request(kind, outcome)).result
        if not result.complete:
            raise RequestFailed(result.detail, result.failure)
        message = result.assembler.message()
        if not message.tool_calls:
            if result.assembler.finish_reason == "length":
                timings = result.assembler.timings
                outcome.cut_at = timings.predicted_n if timings is not None else 0
            raise Answered(message.content)
        await self.execute(message.tool_calls)

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
        """One request, built from the log, streamed, and recorded however it ended."""
        epoch = self.log.current_epoch(self.session)
        messages = self.log.replay_messages(self.session)
        body = build_body(self.settings, epoch.tools_text, messages)
        result = RequestResult.start()
        with request_scope(self.session):  # its id in the headers and the log lines
            try:
                await stream_into(
                    result,
                    self.client,
                    body,
                    slot=self.settings.slot,
                    limits=self.limits,
                    report=self.report,
                )
            finally:
                # Synchronous, so a cancellation going on cannot interrupt it.
                record = self._record(kind, epoch, messages, result)
        return Attempt(record, result)

    async def execute(self, calls: Sequence[ToolCall]) -> None:
        plan = repeats.plan(self.log.replay_messages(self.session), calls, self.repeat_limit)
        for call, answer in zip(calls, plan.answers, strict=True):
            if answer is not None:  # a repeat: loopd's own answer, the call is not run again
                text = answer
            elif self.tools is None:
                text = f"error: tool {call.name!r} is not available in this session"
            else:
                text = await self.tools.run(self.session, call)
                if self.gate is not None:
                    text = await self.gate.fit_input(text, "this tool result")
            self.log.append_tool_result(self.session, tool_call_id=call.id, content=text)
        METRICS.repeats_answered(plan.pointed, stopped=plan.stop is not None)
        if plan.stop is not None:
            self.log.append_note(self.session, plan.stop.line)
            raise Repeated(plan.stop.line)

    def _record(
        self, kind: RequestKind, epoch: Epoch, messages: list[str], result: RequestResult
    ) -> RequestRecord:
        """Append the assistant entry (or the broken one) with the request's record."""
        digest = messages_digest(messages)
        record = RequestRecord(
            kind=kind,
            slot=self.slot,
            epoch=epoch.number,
            message_count=len(messages),
            messages_sha256=digest,
            perf=request_perf(result, self._loss(epoch, digest, result), self.endpoint),
        )
        message = dumps(result.assembler.message().to_wire())
        if result.complete:
            self.log.append_assistant(self.session, message, request=record)
        else:
            self.log.append_broken(
                self.session, partial_text=message, reason=result.detail, request=record
            )
        _log_request(self.session, record)
        METRICS.request_recorded(record)
        return record

    def _loss(self, epoch: Epoch, digest: str, result: RequestResult) -> Loss:
        timings = result.assembler.timings
        if timings is None:
            return Loss(0, 0, LossCause.NONE)  # it broke before the server said anything
        prev = previous_request(self.log.latest_request(self.session, counted=True))
        return cache_loss(
            prev,
            epoch_id=epoch.number,
            slot=self.slot,
            cache_n=timings.cache_n,
            around=self._circumstances(prev, epoch, digest),
        )

    def _circumstances(self, prev: PrevRequest | None, epoch: Epoch, digest: str) -> Circumstances:
        """What the log knows about what ran since ``prev``, for the cache-loss rule."""
        if prev is None:
            return Circumstances(pinned=self.pinned)
        # Pinned: what ran on this slot; placed by the server: what ran anywhere (another
        # session's prompt may have been restored into the slot this one held).
        others = self.log.slot_used_since(
            self.slot if self.pinned else None, prev.request_id, besides=self.session
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
        )


def _last_attempt(state: RetryCallState) -> Attempt:
    """When attempts run out, the turn goes on with the last one (recorded as broken)."""
    assert state.outcome is not None
    attempt: Attempt = state.outcome.result()
    return attempt


def request_perf(result: RequestResult, loss: Loss, endpoint: str | None = None) -> Perf:
    """The request's perf record: the server's counters, the engine's times, the cache loss."""
    asm, t = result.assembler, result.assembler.timings
    return Perf(
        outcome="complete" if result.complete else "broken",
        cache_n=t.cache_n if t else None,
        prompt_n=t.prompt_n if t else None,
        predicted_n=t.predicted_n if t else None,
        ttfb_ms=None if result.first_byte_s is None else round(result.first_byte_s * 1000, 1),
        queue_wait_ms=round(result.queue_wait_s * 1000, 1),
        prompt_per_second=t.prompt_per_second if t else None,
        predicted_per_second=t.predicted_per_second if t else None,
        thinking_tokens=asm.thinking_tokens,
        capped=result.capped,
        cache_loss=loss.lost,
        cache_loss_cause=loss.label or None,
        extra=_perf_extra(result, loss) | ({"endpoint": endpoint} if endpoint else {}),
    )


def _perf_extra(result: RequestResult, loss: Loss) -> dict[str, Any]:
    asm, t = result.assembler, result.assembler.timings
    extra: dict[str, Any] = {
        "expected_reuse": loss.expected,
        "duration_ms": round(result.ended_s * 1000, 1),
        "finish_reason": asm.finish_reason,
        "completion_id": asm.completion_id,
        "had_reasoning": bool(asm.reasoning),
    }
    if t is not None:
        extra.update(prompt_ms=t.prompt_ms, predicted_ms=t.predicted_ms)
    if result.failure is not None:
        extra.update(failure=result.failure.value, detail=result.detail)
    if result.status_code is not None:
        extra["status_code"] = result.status_code
    if result.control_answer is not None:
        extra["control_answer"] = result.control_answer
    return extra


def _log_request(session: str, record: RequestRecord) -> None:
    perf = record.perf
    fields: dict[str, Any] = {
        "session": session,
        "slot": record.slot,
        "kind": record.kind.value,
        "outcome": perf.outcome,
        "cache_n": perf.cache_n,
        "prompt_n": perf.prompt_n,
        "predicted_n": perf.predicted_n,
        "ttfb_ms": perf.ttfb_ms,
        "cache_loss": perf.cache_loss,
    }
    if perf.cache_loss_cause:
        fields["loss_cause"] = perf.cache_loss_cause
    if perf.capped:
        fields["capped"] = True
    if perf.outcome == "complete":
        log.info("model request", extra={"fields": fields})
    else:
        detail = perf.extra.get("detail", "")
        log.warning("model request broke: %s", detail, extra={"fields": fields})
