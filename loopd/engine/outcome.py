"""How a request ended (``Failure``, ``RequestResult``), and what follows from it: whether another
attempt is safe (``retry_safe``), whether the message can be replayed (``unreplayable_call``), and
the perf record it leaves (``request_perf``); how a turn ended (``TurnOutcome``).

Data and rules only, no I/O: the stream fills a result in (``loopd.engine.stream``), the turn
records it and decides on another attempt (``loopd.turn.loop``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from loopd.engine.cacheloss import Loss
from loopd.engine.guards import Guard, Made
from loopd.engine.thinkcap import ControlCall
from loopd.engine.waits import WaitClock
from loopd.sessionlog.records import Perf, RequestRecord
from loopd.wire.assemble import StreamAssembler, StreamOutcome


class Failure(StrEnum):
    UNREACHABLE = "unreachable"  # nothing answers at the URL (connection refused, no socket)
    REJECTED = "rejected"  # an HTTP error before streaming (4xx, 500, 503 past the wait)
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    SERVER_GONE = "server_gone"  # /slots and /health both fail, or the connection closed unanswered
    SILENCE = "silence"
    SERVER_ERROR = "server_error"  # an error event, or a router's plain-text line, mid-stream
    MALFORMED = "malformed"
    TRUNCATED = "truncated"  # the connection broke mid-stream, or it ended without [DONE]
    THINK_RUNAWAY = "think_runaway"
    CANCELLED = "cancelled"
    BAD_TOOL_CALL = "bad_tool_call"  # a tool call whose arguments are not JSON (cut at max_tokens)
    POOL_FULL = "pool_full"  # a shared KV pool ran out (500 "Context size has been exceeded.")
    # Closed at the first progress event: the server had lost the session, and loopd restores
    # its saved state before sending again (``loopd.engine.durable``).
    LOST_BY_SERVER = "lost_by_server"


# The server's message when a shared KV pool is full (build 11434, ``server-context.cpp``; sent to
# every request that was running, as a 500 before streaming or as an error event mid-stream:
# ``loopd.contextwindow.pool``).
POOL_FULL_MESSAGE: Final = "Context size has been exceeded"


def is_pool_full(message: str) -> bool:
    """The server's error says the shared pool ran out (not that this prompt is too long: that
    is a 400 ``exceed_context_size_error``)."""
    return POOL_FULL_MESSAGE.lower() in message.lower()


class Loop(StrEnum):
    """What the repetition watch found going round in circles (``loopd.engine.loops``)."""

    REASONING = "reasoning"  # ended by the control call, before the thinking cap
    ANSWER = "answer"  # the request closed, the answer kept as written


# Failures after which nothing the model made was lost, and another attempt may well succeed.
# A first-byte timeout is not among them: that limit is itself the bound on waiting; nor is a
# runaway (it would run away again), a 4xx (the request itself is wrong) or a cancellation.
_TRANSIENT = frozenset(
    {
        Failure.UNREACHABLE,
        Failure.SERVER_GONE,
        Failure.SILENCE,
        Failure.SERVER_ERROR,
        Failure.MALFORMED,
        Failure.TRUNCATED,
    }
)


@dataclass
class RequestResult:
    assembler: StreamAssembler
    failure: Failure | None = None
    detail: str = ""
    status_code: int | None = None
    error_type: str = ""
    first_byte_s: float | None = None
    ended_s: float = 0.0
    control: ControlCall | None = None  # sent at the thinking cap (or at a looping thought)
    looped: list[Loop] = field(default_factory=list)  # what the repetition watch ended
    events: int = 0
    output_seen: bool = False  # a reasoning, content or tool-call delta arrived
    notes: list[str] = field(default_factory=list)
    wait: WaitClock = field(default_factory=lambda: WaitClock(sent=0.0))

    @property
    def sent_at(self) -> float:
        return self.wait.sent

    @property
    def capped(self) -> bool:
        return self.control is not None

    @property
    def control_answer(self) -> str | None:
        return self.control.answer if self.control is not None else None

    @property
    def complete(self) -> bool:
        """Streamed to its end, or closed by loopd on an answer that went round in circles
        (kept as written: nothing of it is cut but what the loop would have added)."""
        if self.failure is not None:
            return False
        outcome = self.assembler.outcome
        closed_kept = Loop.ANSWER in self.looped and outcome is StreamOutcome.TRUNCATED
        return outcome is StreamOutcome.COMPLETE or closed_kept

    def fail(self, failure: Failure, detail: str) -> None:
        self.failure, self.detail = failure, detail


@dataclass
class TurnOutcome:
    answer: str | None
    failure: str | None = None  # the last failed request's message, for the thread
    cause: Failure | None = None  # what ended the turn without an answer, when a request did
    requests: list[RequestRecord] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # one line each, for the thread
    cut_at: int | None = None  # the answer was cut at max_tokens: tokens generated (0: unknown)
    compacted: bool = False  # the turn started a new epoch (its session is worth a prewarm)
    # The tool calls of this turn as they went (run or answered by a guard), their tool time,
    # and the guard that ended the turn, if one did (``loopd.engine.guards``).
    calls: list[Made] = field(default_factory=list)
    tool_s: float = 0.0
    guard: Guard | None = None


def retry_safe(result: RequestResult) -> bool:
    """True when sending the same request again can do no harm and may well succeed.

    Safe means nothing is committed yet: the model produced nothing (no delta arrived), and the
    request was not refused for what it is (4xx) or already waited out (a 503 past its wait).
    """
    if result.complete:
        return False
    if result.failure is Failure.POOL_FULL:
        # Not the session's doing: the requests running at once outgrew the shared pool. What
        # streamed before is recorded as broken (never replayed) and no tool call ran, so the
        # same request can go again once the pool has room (``loopd.contextwindow.pool``).
        return True
    if result.output_seen:
        return False
    if result.failure is Failure.REJECTED:
        status = result.status_code or 0
        return status >= 500 and status != 503
    return result.failure in _TRANSIENT


def unreplayable_call(asm: StreamAssembler) -> str | None:
    """Why the message cannot be replayed, or None.

    A tool call whose arguments are not JSON (in practice: cut by ``max_tokens``) must never be
    replayed: a template that takes object arguments re-parses them, and the server then answers
    every later request of the session with a 500. So the message is recorded as broken.
    """
    for call in asm.tool_calls.values():
        try:
            json.loads(call.arguments)
        except ValueError:
            cut = " (cut at max_tokens)" if asm.finish_reason == "length" else ""
            return (
                f"the model's call of {call.name!r} has arguments that are not JSON{cut}; "
                "it was not kept, as the server could not read it back"
            )
    return None


def request_perf(
    result: RequestResult, loss: Loss, endpoint: str | None = None, request_id: str | None = None
) -> Perf:
    """The request's perf record: the server's counters, the engine's times (the parts of the
    wait a person saw, ``loopd.engine.waits``, the server's queue also as ``queue_wait_ms``), the
    cache loss, and ``request_id``, the id its lines in loopd's and brokerd's logs carry."""
    asm, t = result.assembler, result.assembler.timings
    wait = result.wait.parts()
    return Perf(
        outcome="complete" if result.complete else "broken",
        cache_n=t.cache_n if t else None,
        prompt_n=t.prompt_n if t else None,
        predicted_n=t.predicted_n if t else None,
        ttfb_ms=None if result.first_byte_s is None else round(result.first_byte_s * 1000, 1),
        queue_wait_ms=wait.get("server_queue_ms"),
        prompt_per_second=t.prompt_per_second if t else None,
        predicted_per_second=t.predicted_per_second if t else None,
        thinking_tokens=asm.thinking_tokens,
        capped=result.capped,
        cache_loss=loss.lost,
        cache_loss_cause=loss.label or None,
        extra=_perf_extra(result, loss, wait)
        | ({"endpoint": endpoint} if endpoint else {})
        | ({"request_id": request_id} if request_id else {}),
    )


def _perf_extra(result: RequestResult, loss: Loss, wait: dict[str, float]) -> dict[str, Any]:
    asm, t = result.assembler, result.assembler.timings
    extra: dict[str, Any] = {
        "expected_reuse": loss.expected,
        "duration_ms": round(result.ended_s * 1000, 1),
        "finish_reason": asm.finish_reason,
        "completion_id": asm.completion_id,
        "had_reasoning": bool(asm.reasoning),
        **wait,
    }
    if t is not None:
        extra.update(prompt_ms=t.prompt_ms, predicted_ms=t.predicted_ms)
    if result.failure is not None:
        extra.update(failure=result.failure.value, detail=result.detail)
    if result.status_code is not None:
        extra["status_code"] = result.status_code
    if result.control is not None and result.control.answer is not None:
        extra["control_answer"] = result.control.answer
        extra["thinking_at_control_answer"] = result.control.answered_at
    if result.looped:
        extra["looped"] = [loop.value for loop in result.looped]
    return extra
