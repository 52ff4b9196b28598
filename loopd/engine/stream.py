"""One model request, streamed, with liveness limits and the runaway-thinking cap.

Two limits, because the server gives two kinds of silence (seed findings (i), (j)):

- Before the first byte a request pinned to a busy slot is simply queued: the server sends
  nothing at all, not even a status line. Meanwhile ``/slots`` is polled: the slot busy means
  "queued", keep waiting up to ``first_byte_s``; ``/slots`` and ``/health`` both failing means the
  server is gone: fail fast. A ``/slots`` that hangs while ``/health`` answers is reported as a
  stuck server (a sleeping model reloading blocks ``/slots`` too), and waiting goes on.
- After the first byte every event is life (progress events included); ``silence_s`` without any
  closes the connection, which cancels the generation on the server (finding (l)).

Thinking is counted from the per-token ``predicted_n``; at the cap the control call ends the
reasoning (finding (k)). A ``success: false`` answer means nothing was armed: the stream is then
closed once thinking passes the cap plus a grace.

The result is data: the caller records it. Nothing here writes to the session log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from enum import StrEnum

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from loopd.engine.client import InferenceClient
from loopd.errors import InferenceError, ServerRejected, ServerUnreachable
from loopd.wire.assemble import Outcome, StreamAssembler
from loopd.wire.events import (
    ContentDelta,
    EventDecoder,
    Progress,
    ReasoningDelta,
    StreamEvent,
    ToolCallDelta,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    first_byte_s: float = 900.0
    silence_s: float = 60.0
    slots_poll_s: float = 2.0
    think_cap: int = 8192
    think_grace: int = 256
    loading_retry_s: float = 120.0


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


StatusCallback = Callable[[Status], None]


class Failure(StrEnum):
    UNREACHABLE = "unreachable"
    REJECTED = "rejected"
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    SERVER_GONE = "server_gone"
    SILENCE = "silence"
    SERVER_ERROR = "server_error"
    MALFORMED = "malformed"
    TRUNCATED = "truncated"
    THINK_RUNAWAY = "think_runaway"
    CANCELLED = "cancelled"


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
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.failure is None and self.assembler.outcome is Outcome.COMPLETE


def _is_loading(exc: BaseException) -> bool:
    return isinstance(exc, ServerRejected) and exc.status == 503


class _SlotWatch:
    """Polls /slots while the request waits for its first byte."""

    def __init__(
        self, client: InferenceClient, slot: int, limits: Limits, report: StatusCallback
    ) -> None:
        self.client = client
        self.slot = slot
        self.limits = limits
        self.report = report
        self.gone_reason: str | None = None
        self.busy_since: float | None = None
        self.queued_s = 0.0

    async def run(self, give_up: anyio.CancelScope) -> None:
        while True:
            phase = await self._probe()
            if phase is None:
                give_up.cancel()
                return
            now = time.monotonic()
            if phase is Phase.QUEUED:
                self.busy_since = self.busy_since or now
            elif self.busy_since is not None:
                self.queued_s += now - self.busy_since
                self.busy_since = None
            self.report(Status(phase))
            await anyio.sleep(self.limits.slots_poll_s)

    def stop(self) -> None:
        if self.busy_since is not None:
            self.queued_s += time.monotonic() - self.busy_since
            self.busy_since = None

    async def _probe(self) -> Phase | None:
        timeout = self.client.connect_s
        try:
            slots = await self.client.slots(wait_s=timeout)
        except httpx.TimeoutException:
            slots = None
        except InferenceError as exc:
            if await self._health_ok():
                return Phase.WAITING  # /slots refused (e.g. disabled) but the server is up
            self.gone_reason = f"/slots and /health both fail ({exc})"
            return None
        if slots is None:
            if await self._health_ok():
                return Phase.STUCK
            self.gone_reason = "/slots hangs and /health fails"
            return None
        for entry in slots:
            if entry.get("id") == self.slot:
                return Phase.QUEUED if entry.get("is_processing") else Phase.WAITING
        return Phase.WAITING

    async def _health_ok(self) -> bool:
        try:
            return await self.client.health(wait_s=self.client.connect_s)
        except (InferenceError, httpx.TimeoutException):
            return False


async def run_request(
    client: InferenceClient,
    body: bytes,
    *,
    slot: int,
    limits: Limits,
    report: StatusCallback = lambda status: None,
) -> RequestResult:
    """Send one chat request and stream it to the end, or to a recorded failure."""
    result = RequestResult(assembler=StreamAssembler(), sent_at=time.monotonic())
    try:
        async with AsyncExitStack() as stack:
            response = await _open(client, body, slot, limits, report, result, stack)
            if response is None:
                return result
            result.first_byte_s = time.monotonic() - result.sent_at
            await _read(client, response, limits, report, result)
    except ServerRejected as exc:
        result.failure, result.detail = Failure.REJECTED, str(exc)
        result.status_code, result.error_type = exc.status, exc.error_type
    except ServerUnreachable as exc:
        result.failure, result.detail = Failure.UNREACHABLE, str(exc)
    except httpx.TransportError as exc:  # the connection broke mid-stream
        result.failure = Failure.TRUNCATED
        result.detail = (
            f"the connection to {client.url} broke mid-stream: {exc or type(exc).__name__}"
        )
    finally:
        result.ended_s = time.monotonic() - result.sent_at
    _classify_end(client, result)
    return result


async def _open(
    client: InferenceClient,
    body: bytes,
    slot: int,
    limits: Limits,
    report: StatusCallback,
    result: RequestResult,
    stack: AsyncExitStack,
) -> httpx.Response | None:
    """Wait for the first byte (the status line) while watching the slot."""
    watch = _SlotWatch(client, slot, limits, report)
    response: httpx.Response | None = None
    error: InferenceError | None = None
    with anyio.move_on_after(limits.first_byte_s) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run, tg.cancel_scope)
            try:
                # Only a router still loading the model (503) is retried: nothing was sent that
                # could have taken effect, and a 4xx or a dead server never improves by retrying.
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception(_is_loading),
                    wait=wait_exponential(multiplier=0.5, max=10),
                    stop=stop_after_delay(limits.loading_retry_s),
                    reraise=True,
                ):
                    with attempt:
                        response = await stack.enter_async_context(client.stream_chat(body))
            except InferenceError as exc:
                error = exc  # raised outside the task group, so it is not wrapped in a group
            tg.cancel_scope.cancel()
    watch.stop()
    if error is not None:
        raise error
    result.queue_wait_s = watch.queued_s
    if response is not None:
        return response
    if watch.gone_reason is not None:
        result.failure = Failure.SERVER_GONE
        result.detail = f"llama-server at {client.url} is gone: {watch.gone_reason}"
    elif deadline.cancelled_caught:
        result.failure = Failure.FIRST_BYTE_TIMEOUT
        result.detail = (
            f"no answer from {client.url} within {limits.first_byte_s:g} s "
            f"(queued {watch.queued_s:.0f} s behind another task)"
        )
    return None


async def _read(
    client: InferenceClient,
    response: httpx.Response,
    limits: Limits,
    report: StatusCallback,
    result: RequestResult,
) -> None:
    decoder = EventDecoder()
    asm = result.assembler
    chunks = response.aiter_raw()
    control_sent = False
    while True:
        chunk: bytes | None = None
        with anyio.move_on_after(limits.silence_s) as silence:
            chunk = await anext(chunks, None)
        if silence.cancelled_caught:
            result.failure = Failure.SILENCE
            result.detail = (
                f"llama-server at {client.url} went silent for {limits.silence_s:g} s mid-stream"
            )
            return
        events = decoder.flush() if chunk is None else decoder.feed(chunk)
        for event in events:
            asm.apply(event)
            result.events += 1
            _report_event(event, asm, report)
        if chunk is None or asm.done or asm.server_error is not None:
            return
        if asm.thinking_tokens >= limits.think_cap and not asm.content and not asm.tool_calls:
            if not control_sent:
                control_sent = True
                result.capped = True
                result.control_answer = await _end_reasoning(client, asm)
            elif (
                result.control_answer != "success"
                and asm.thinking_tokens >= limits.think_cap + limits.think_grace
            ):
                result.failure = Failure.THINK_RUNAWAY
                result.detail = (
                    f"thinking passed {limits.think_cap} tokens and the server could not end it "
                    f"({result.control_answer}); the stream was closed"
                )
                return


async def _end_reasoning(client: InferenceClient, asm: StreamAssembler) -> str:
    if asm.completion_id is None:
        return "no completion id"
    try:
        answer = await client.control_reasoning_end(asm.completion_id)
    except (InferenceError, httpx.HTTPError) as exc:
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
            report(Status(Phase.ANSWERING))
        case ToolCallDelta(name=name) if name:
            report(Status(Phase.TOOL_CALL, tool=name))
        case _:
            pass


def _classify_end(client: InferenceClient, result: RequestResult) -> None:
    if result.failure is not None:
        return
    asm = result.assembler
    if asm.server_error is not None:
        result.failure = Failure.SERVER_ERROR
        result.detail = (
            f"llama-server at {client.url} reported an error: {asm.server_error.message}"
        )
    elif asm.problems:
        result.failure = Failure.MALFORMED
        result.detail = f"malformed stream from {client.url}: {asm.problems[0]}"
    elif not asm.done:
        extra = f" ({asm.foreign_lines[-1]})" if asm.foreign_lines else ""
        result.failure = Failure.TRUNCATED
        result.detail = f"the stream from {client.url} ended without [DONE]{extra}"
