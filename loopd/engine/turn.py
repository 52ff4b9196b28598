"""A turn: request, stream, record, run tools, repeat until the model answers.

Read as three short steps (``run`` -> ``step`` -> ``execute``). The session log is the truth:
each step rebuilds the request from what is stored, and what happened is appended before the next
step begins, so a crash at any point leaves a state the next start derives and resumes from.

Log calls are synchronous SQLite writes of well under a millisecond in WAL mode (``make bench``
measures them); they run on the event loop rather than in a thread so that their order is the
order of events.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loopd.engine.client import InferenceClient
from loopd.engine.perf import Loss, LossCause, PrevRequest, cache_loss
from loopd.engine.request import RequestSettings, build_body
from loopd.engine.stream import Limits, RequestResult, StatusCallback, run_request
from loopd.jsonbytes import dumps
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, Request, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from loopd.wire.assemble import ToolCall

log = logging.getLogger("loopd.turn")


class ToolRunner(Protocol):
    """Runs one tool call of a session and returns the result text for the log."""

    async def run(self, session: str, call: ToolCall) -> str: ...


@dataclass
class TurnOutcome:
    answer: str | None
    failure: str | None = None
    requests: list[RequestRecord] = field(default_factory=list)


def previous_request(requests: Sequence[Request]) -> PrevRequest | None:
    """The cache-loss rule's view of the session's last replaying request."""
    for request in reversed(requests):
        record = request.record
        if record.kind is RequestKind.SELFTEST:
            continue
        perf = record.perf
        if perf.cache_n is None or perf.prompt_n is None:
            return None  # it broke before the server said anything: expectation unknown
        return PrevRequest(
            epoch_id=record.epoch,
            slot=record.slot,
            cache_n=perf.cache_n,
            prompt_n=perf.prompt_n,
            predicted_n=perf.predicted_n or 0,
            complete=perf.outcome == "complete",
            capped=perf.capped,
            had_reasoning=bool(perf.extra.get("had_reasoning")),
        )
    return None


@dataclass
class Turn:
    """Everything a turn needs; it holds no conversation state of its own."""

    session: str
    slot: int
    client: InferenceClient
    log: SessionLog
    settings: RequestSettings
    limits: Limits
    tools: ToolRunner | None = None
    max_rounds: int = 16
    template_drops_reasoning: bool = False
    report: StatusCallback = field(default=lambda status: None)

    async def run(self) -> TurnOutcome:
        outcome = TurnOutcome(answer=None)
        kind = RequestKind.TURN
        for _ in range(self.max_rounds):
            record, calls, answer = await self.step(kind)
            outcome.requests.append(record)
            if record.perf.outcome != "complete":
                outcome.failure = str(record.perf.extra.get("detail", "the request failed"))
                return outcome
            if not calls:
                outcome.answer = answer
                return outcome
            await self.execute(calls)
            kind = RequestKind.TOOL_FOLLOWUP
        outcome.failure = f"stopped after {self.max_rounds} tool rounds without an answer"
        return outcome

    async def step(self, kind: RequestKind) -> tuple[RequestRecord, Sequence[ToolCall], str]:
        epoch = self.log.current_epoch(self.session)
        messages = self.log.replay_messages(self.session)
        body = build_body(self.settings, epoch.tools_text, messages)
        result = await run_request(
            self.client, body, slot=self.slot, limits=self.limits, report=self.report
        )
        record = self._record(kind, epoch.number, messages, result)
        message = result.assembler.message()
        if result.complete:
            self.log.append_assistant(self.session, dumps(message.to_wire()), request=record)
        else:
            self.log.append_broken(
                self.session,
                partial_text=dumps(message.to_wire()),
                reason=result.detail,
                request=record,
            )
        _log_request(self.session, record)
        return record, message.tool_calls if result.complete else (), message.content

    async def execute(self, calls: Sequence[ToolCall]) -> None:
        for call in calls:
            if self.tools is None:
                text = f"error: tool {call.name!r} is not available in this session"
            else:
                text = await self.tools.run(self.session, call)
            self.log.append_tool_result(self.session, tool_call_id=call.id, content=text)

    def _record(
        self, kind: RequestKind, epoch: int, messages: list[str], result: RequestResult
    ) -> RequestRecord:
        asm = result.assembler
        t = asm.timings
        loss = Loss(0, 0, LossCause.NONE)  # no timings: it broke before the server said anything
        if t is not None:
            loss = cache_loss(
                previous_request(self.log.requests(self.session)),
                epoch_id=epoch,
                slot=self.slot,
                cache_n=t.cache_n,
                template_drops_reasoning=self.template_drops_reasoning,
            )
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
        if result.control_answer is not None:
            extra["control_answer"] = result.control_answer
        perf = Perf(
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
            cache_loss_cause=loss.cause.value or None,
            extra=extra,
        )
        return RequestRecord(
            kind=kind,
            slot=self.slot,
            epoch=epoch,
            message_count=len(messages),
            messages_sha256=messages_digest(messages),
            perf=perf,
        )


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
