"""One model request, streamed, with liveness limits and the runaway-thinking cap.

Two limits, because the server gives two kinds of silence (seed findings (i), (j)):

- Before the first byte a request pinned to a busy slot is simply queued: the server sends
  nothing at all, not even a status line. Meanwhile ``/slots`` is polled, each poll under its own
  short timeout: the slot busy means "queued", keep waiting up to ``first_byte_s``; ``/slots`` and
  ``/health`` both failing means the server is gone: fail fast. A ``/slots`` that hangs while
  ``/health`` answers is reported as a stuck server (a sleeping model reloading blocks ``/slots``
  too), and waiting goes on. Any answer from ``/health`` counts as alive: a router loading a
  model answers 503.
- After the first byte every event is life (progress events included); ``silence_s`` without any
  closes the connection, which cancels the generation on the server (finding (l)).

Thinking is counted from the per-token ``predicted_n``; at the cap the control call ends the
reasoning (finding (k)). A ``success: false`` answer means nothing was armed: the stream is then
closed once thinking passes the cap plus a grace (and so it is if thinking goes on regardless).

The result is data: the caller records it. Nothing here writes to the session log, and nothing
here retries a stream; ``retry_safe`` tells the caller when another attempt cannot do harm.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from loopd.engine.client import InferenceClient
from loopd.errors import InferenceError, ServerRejected, ServerUnreachable, StreamBroken
from loopd.wire.assemble import Outcome, StreamAssembler
from loopd.wire.events import (
    ContentDelta,
    Done,
    EventDecoder,
    Foreign,
    Malformed,
    Progress,
    ReasoningDelta,
    ServerError,
    StreamEvent,
    ToolCallDelta,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    first_byte_s: float = 900.0  # LOOPD_FIRST_BYTE_S: queued behind another task, at most this
    silence_s: float = 60.0  # LOOPD_SILENCE_S: once streaming, no event for this long is death
    slots_poll_s: float = 2.0  # how often /slots is polled while waiting for the first byte
    probe_timeout_s: float = 5.0  # each /slots or /health poll, on its own
    think_cap: int = 8192  # LOOPD_THINK_CAP: thinking tokens before the control call
    think_grace: int = 256  # tokens past the cap before a stream still thinking is closed
    loading_retry_s: float = 120.0  # how long a 503 "Loading model" is waited out
    loading_wait_s: float = 0.5  # the first wait after a 503; doubles up to 10 s
    attempts: int = 3  # attempts per request of a turn, when another one is safe
    retry_wait_s: float = 1.0  # the first wait between attempts; doubles up to 30 s
    status_interval_s: float = 0.5  # the least time between two reports of the same phase


class Phase(StrEnum):
    WAITING = "waiting"  # sent, no byte yet, slot not seen busy
    QUEUED = "queued"  # the slot is busy with another task
    STUCK = "stuck"  # /slots does not answer while /health does
    READING = "reading"  # prompt processing (progress events)
    THINKING = "thinking"
    ANSWERING = "answering"
    TOOL_CALL = "tool_call"


@dataclass(frozen=True)
class Status:
    """What the request is doing now, for the status line or post."""

    phase: Phase
    percent: int | None = None
    tokens: int | None = None
    tool: str | None = None
    text: str = ""  # ANSWERING: the answer written so far (a chat thread shows it as it grows)


StatusCallback = Callable[[Status], None]


def _ignore_status(status: Status) -> None:
    del status


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
    sent_at: float = 0.0
    first_byte_s: float | None = None
    queue_wait_s: float = 0.0
    ended_s: float = 0.0
    capped: bool = False
    control_answer: str | None = None
    events: int = 0
    output_seen: bool = False  # a reasoning, content or tool-call delta arrived
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls) -> RequestResult:
        return cls(assembler=StreamAssembler(), sent_at=time.monotonic())

    @property
    def complete(self) -> bool:
        return self.failure is None and self.assembler.outcome is Outcome.COMPLETE

    def fail(self, failure: Failure, detail: str) -> None:
        self.failure, self.detail = failure, detail


def retry_safe(result: RequestResult) -> bool:
    """True when sending the same request again can do no harm and may well succeed.

    Safe means nothing is committed yet: the model produced nothing (no delta arrived), and the
    request was not refused for what it is (4xx) or already waited out (a 503 past its wait).
    """
    if result.complete or result.output_seen:
        return False
    if result.failure is Failure.REJECTED:
        status = result.status_code or 0
        return status >= 500 and status != 503
    return result.failure in _TRANSIENT


class StatusThrottle:
    """Passes a status on when it says something new, without flooding the receiver.

    A new phase (or a new tool) goes through at once; a changed figure within the same phase (a
    percentage, a token count) at most once per ``interval_s``; a repeat never.
    """

    def __init__(
        self,
        report: StatusCallback,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report = report
        self._interval_s = interval_s
        self._clock = clock
        self._last: Status | None = None
        self._at = 0.0

    def __call__(self, status: Status) -> None:
        last, now = self._last, self._clock()
        if status == last:
            return
        same_kind = last is not None and (last.phase, last.tool) == (status.phase, status.tool)
        if same_kind and now - self._at < self._interval_s:
            return
        self._last, self._at = status, now
        self._report(status)


@dataclass(frozen=True)
class _SlotsAnswer:
    """One poll of /slots: the list, or what went wrong with it."""

    slots: list[dict[str, Any]] | None
    problem: str = ""
    hung: bool = False


class _SlotWatch:
    """Polls /slots (and /health when /slots fails) while the request waits for its first byte."""

    def __init__(
        self, client: InferenceClient, slot: int, limits: Limits, report: StatusCallback
    ) -> None:
        self.client = client
        self.slot = slot
        self.limits = limits
        self.report = report
        self.gone_reason: str | None = None
        self.stuck = False  # /slots was seen hanging while /health answered
        self.slots_refused = False  # /slots answered 4xx or 501: that will not change
        self.busy_since: float | None = None
        self.queued_s = 0.0
        self._done = False
        self._nap = anyio.CancelScope()

    async def run(self, give_up: anyio.CancelScope) -> None:
        while not self._done:
            # Sleep first: most requests get their first byte at once, and a slot seen busy
            # before that may well be busy with this very request.
            with anyio.CancelScope() as self._nap:
                await anyio.sleep(self.limits.slots_poll_s)
            if self._done:
                return
            phase = await self._probe()
            if phase is None:
                give_up.cancel()
                return
            self._track_queue(phase)
            self.report(Status(phase))

    def finish(self) -> None:
        """Stop polling, letting a poll in flight end by itself (it takes milliseconds).

        Cancelling a read on a Unix socket just as its answer arrives makes anyio's asyncio
        backend set a result on a cancelled future, which asyncio reports as an error.
        """
        self._done = True
        self._nap.cancel()

    def end_queue_wait(self) -> None:
        self._track_queue(None)

    def _track_queue(self, phase: Phase | None) -> None:
        now = time.monotonic()
        if phase is Phase.QUEUED:
            self.busy_since = self.busy_since or now
        elif self.busy_since is not None:
            self.queued_s += now - self.busy_since
            self.busy_since = None

    async def _probe(self) -> Phase | None:
        """The phase the server's answers show, or None when it is gone."""
        answer = await self._slots()
        if answer.slots is not None:
            return self._phase_of(answer.slots)
        if await self._health_answers():
            self.stuck = self.stuck or answer.hung
            return Phase.STUCK if answer.hung else Phase.WAITING
        self.gone_reason = f"/slots {answer.problem} and /health does not answer"
        return None

    async def _slots(self) -> _SlotsAnswer:
        if self.slots_refused:
            return _SlotsAnswer(None, "was refused before")
        timeout = self.limits.probe_timeout_s
        with anyio.move_on_after(timeout):
            try:
                return _SlotsAnswer(await self.client.slots(wait_s=timeout * 2))
            except ServerRejected as exc:
                # A 4xx (the model unknown) or a 501 (the endpoint disabled) will not change by
                # asking again; a 503 (a router loading the model) or a 500 may.
                self.slots_refused = exc.status == 501 or 400 <= exc.status < 500
                return _SlotsAnswer(None, f"answers {exc.status}")
            except InferenceError as exc:
                return _SlotsAnswer(None, f"fails ({exc})")
        return _SlotsAnswer(None, f"does not answer within {timeout:g} s", hung=True)

    def _phase_of(self, slots: list[dict[str, Any]]) -> Phase:
        for entry in slots:
            if entry.get("id") == self.slot:
                return Phase.QUEUED if entry.get("is_processing") else Phase.WAITING
        return Phase.WAITING

    async def _health_answers(self) -> bool:
        """Any answer from /health, a 503 included: the process is alive."""
        timeout = self.limits.probe_timeout_s
        with anyio.move_on_after(timeout):
            try:
                await self.client.health(wait_s=timeout * 2)
            except InferenceError:
                return False
            return True
        return False


async def run_request(
    client: InferenceClient,
    body: bytes,
    *,
    slot: int,
    limits: Limits,
    report: StatusCallback = _ignore_status,
) -> RequestResult:
    """Send one chat request and stream it to the end, or to a recorded failure."""
    result = RequestResult.start()
    await stream_into(result, client, body, slot=slot, limits=limits, report=report)
    return result


async def stream_into(
    result: RequestResult,
    client: InferenceClient,
    body: bytes,
    *,
    slot: int,
    limits: Limits,
    report: StatusCallback = _ignore_status,
) -> None:
    """``run_request`` into a result the caller holds, so that it can record what happened even
    when the request is cancelled: the result then says CANCELLED, the connection is closed
    (which stops the generation on the server) and the cancellation goes on."""
    throttled = StatusThrottle(report, limits.status_interval_s)
    try:
        async with AsyncExitStack() as stack:
            watch = _SlotWatch(client, slot, limits, throttled)
            response = await _open(client, body, limits, watch, result, stack)
            if response is not None:
                result.first_byte_s = time.monotonic() - result.sent_at
                await _Reader(client, response, limits, throttled, result).read()
    except ServerRejected as exc:
        result.fail(Failure.REJECTED, str(exc))
        result.status_code, result.error_type = exc.status, exc.error_type
    except ServerUnreachable as exc:
        result.fail(Failure.UNREACHABLE, str(exc))
    except StreamBroken as exc:
        result.fail(Failure.SERVER_GONE, str(exc))
    except httpx.TransportError as exc:  # the connection broke mid-stream
        reason = str(exc) or type(exc).__name__
        result.fail(Failure.TRUNCATED, f"the connection to {client.url} broke mid-stream: {reason}")
    except anyio.get_cancelled_exc_class():
        result.fail(Failure.CANCELLED, f"cancelled; the connection to {client.url} was closed")
        raise
    finally:
        result.ended_s = time.monotonic() - result.sent_at
        _classify_end(client, result)


async def _open(
    client: InferenceClient,
    body: bytes,
    limits: Limits,
    watch: _SlotWatch,
    result: RequestResult,
    stack: AsyncExitStack,
) -> httpx.Response | None:
    """Wait for the first byte (the status line) while watching the slot."""
    response: httpx.Response | None = None
    error: InferenceError | None = None
    with anyio.move_on_after(limits.first_byte_s) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run, tg.cancel_scope)
            try:
                response = await _send(client, body, limits, stack)
            except InferenceError as exc:
                error = exc  # raised outside the task group, so it is not wrapped in a group
            watch.finish()
    watch.end_queue_wait()
    result.queue_wait_s = watch.queued_s
    if error is not None:
        raise error
    if response is None:
        _no_first_byte(client, limits, watch, result, timed_out=deadline.cancelled_caught)
    return response


async def _send(
    client: InferenceClient, body: bytes, limits: Limits, stack: AsyncExitStack
) -> httpx.Response:
    # Only a router still loading the model (503) is retried here: nothing reached a slot, and
    # a 4xx or a dead server never improves by retrying at once.
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(_is_loading),
        wait=wait_exponential(multiplier=limits.loading_wait_s, max=10),
        stop=stop_after_delay(limits.loading_retry_s),
        reraise=True,
    ):
        with attempt:
            return await stack.enter_async_context(client.stream_chat(body))
    raise AssertionError("tenacity ended without a result or an error")  # pragma: no cover


def _is_loading(exc: BaseException) -> bool:
    return isinstance(exc, ServerRejected) and exc.status == 503


def _no_first_byte(
    client: InferenceClient,
    limits: Limits,
    watch: _SlotWatch,
    result: RequestResult,
    *,
    timed_out: bool,
) -> None:
    if watch.gone_reason is not None:
        result.fail(
            Failure.SERVER_GONE, f"llama-server at {client.url} is gone: {watch.gone_reason}"
        )
    elif timed_out:
        why = (
            f"queued {watch.queued_s:.0f} s behind another task"
            if watch.queued_s
            else "the slot was not seen busy"
        )
        if watch.stuck:
            why += "; the server looks stuck: /slots did not answer while /health did"
        result.fail(
            Failure.FIRST_BYTE_TIMEOUT,
            f"no answer from {client.url} within {limits.first_byte_s:g} s ({why})",
        )


class _Reader:
    """Reads a stream to its end: events into the assembler, statuses out, limits enforced."""

    def __init__(
        self,
        client: InferenceClient,
        response: httpx.Response,
        limits: Limits,
        report: StatusCallback,
        result: RequestResult,
    ) -> None:
        self.client = client
        self.response = response
        self.limits = limits
        self.report = report
        self.result = result
        self.answering = False  # content or a tool call has begun: thinking is over

    async def read(self) -> None:
        decoder = EventDecoder()
        chunks = self.response.aiter_raw()
        while True:
            chunk: bytes | None = None
            with anyio.move_on_after(self.limits.silence_s) as silence:
                chunk = await anext(chunks, None)
            if silence.cancelled_caught:
                self.result.fail(
                    Failure.SILENCE,
                    f"llama-server at {self.client.url} went silent for "
                    f"{self.limits.silence_s:g} s mid-stream; the connection was closed",
                )
                return
            ended = self._apply(decoder.flush() if chunk is None else decoder.feed(chunk))
            if chunk is None or ended or await self._past_cap():
                return

    def _apply(self, events: list[StreamEvent]) -> bool:
        """Fold the events in; True when the stream is over or can no longer be trusted."""
        ended = False
        asm = self.result.assembler
        for event in events:
            asm.apply(event)
            self.result.events += 1
            if isinstance(event, ReasoningDelta | ContentDelta | ToolCallDelta):
                self.result.output_seen = True
                self.answering = self.answering or not isinstance(event, ReasoningDelta)
            # Past [DONE] nothing more belongs to the completion; after an error, a broken chunk
            # or a line outside the protocol the message cannot be trusted, and reading on would
            # only keep the slot busy.
            ended = ended or isinstance(event, Done | ServerError | Malformed | Foreign)
            _report_event(event, asm, self.report)
        return ended

    async def _past_cap(self) -> bool:
        """Enforce the thinking cap; True when the stream must be closed."""
        asm, result, limits = self.result.assembler, self.result, self.limits
        if self.answering or asm.thinking_tokens < limits.think_cap:
            return False
        if not result.capped:
            result.capped = True
            result.control_answer = await _end_reasoning(self.client, asm)
            return False
        if asm.thinking_tokens < limits.think_cap + limits.think_grace:
            return False
        why = (
            "the server accepted the control call but thinking went on"
            if result.control_answer == "success"
            else f"the server could not end it ({result.control_answer})"
        )
        result.fail(
            Failure.THINK_RUNAWAY,
            f"thinking passed the cap of {limits.think_cap} tokens and {why}; the stream from "
            f"{self.client.url} was closed at {asm.thinking_tokens} tokens",
        )
        return True


async def _end_reasoning(client: InferenceClient, asm: StreamAssembler) -> str:
    if asm.completion_id is None:
        return "no completion id"
    try:
        answer = await client.control_reasoning_end(asm.completion_id)
    except (InferenceError, httpx.HTTPError, ValueError) as exc:
        return f"control call failed: {exc}"
    if answer.get("success") is True:
        return "success"
    return str(answer.get("message") or "success: false")


def _report_event(event: StreamEvent, asm: StreamAssembler, report: StatusCallback) -> None:
    match event:
        case Progress(total, cache, processed, _):
            fresh = max(total - cache, 1)
            report(Status(Phase.READING, percent=int(100 * (processed - cache) / fresh)))
        case ReasoningDelta():
            report(Status(Phase.THINKING, tokens=asm.thinking_tokens))
        case ContentDelta():
            report(Status(Phase.ANSWERING, text=asm.content))
        case ToolCallDelta(name=name) if name:
            report(Status(Phase.TOOL_CALL, tool=name))
        case _:
            pass


def _classify_end(client: InferenceClient, result: RequestResult) -> None:
    if result.failure is not None:
        return
    asm = result.assembler
    if asm.server_error is not None:
        result.fail(
            Failure.SERVER_ERROR,
            f"llama-server at {client.url} reported an error mid-stream: "
            f"{asm.server_error.message}",
        )
    elif asm.foreign_lines:
        result.fail(
            Failure.SERVER_ERROR,
            f"llama-server at {client.url} broke off the stream with: {asm.foreign_lines[0]!r}",
        )
    elif asm.problems:
        result.fail(Failure.MALFORMED, f"malformed stream from {client.url}: {asm.problems[0]}")
    elif not asm.done:
        result.fail(Failure.TRUNCATED, f"the stream from {client.url} ended without [DONE]")
    elif (bad := unreplayable_call(asm)) is not None:
        result.fail(Failure.BAD_TOOL_CALL, bad)


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
