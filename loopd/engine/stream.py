"""One model request, streamed: a thin loop that asks the policies what to do.

Before the first byte the request waits while a watch polls ``/slots`` (and ``/health``), each
poll under its own short timeout; ``loopd.engine.liveness`` judges each poll (queued, stuck, gone)
and the end of the wait. After the first byte every event is life (progress events included),
but not a keep-alive ping, nor bytes that complete no event; ``silence_s`` without any event
closes the connection, which cancels the generation on the server.
Both are measured in tests/contract/test_contract_stream.py:
``test_i_progress_events_break_the_prefill_silence`` and
``test_l_closing_the_stream_frees_the_slot_within_a_second``. After each chunk's events
``loopd.engine.thinkcap`` decides whether to read on, send the control call, or close a runaway;
the control call runs beside the reading, which goes on (and the silence limit with it).

The result is data: the caller records it. Nothing here writes to the session log, and nothing
here retries a stream; ``retry_safe`` tells the caller when another attempt cannot do harm. The
client (``loopd.engine.client``) raises loopd's own errors only; each becomes a ``Failure`` here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
from anyio.abc import TaskGroup
from tenacity import retry_if_exception

from loopcommon.backoff import Backoff
from loopcommon.retry import retrying
from loopd.engine.client import ChatStream, EventStream, InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.liveness import (
    FirstByteWait,
    Gone,
    LivenessVerdict,
    Queued,
    SlotsAnswer,
    SlotsFailed,
    SlotsHung,
    SlotsListed,
    SlotsNotAsked,
    SlotsRefused,
    Stuck,
    TimedOut,
    Waiting,
    health_verdict,
    no_first_byte,
    slots_verdict,
    worth_waiting_out,
)
from loopd.engine.loops import RepetitionWatch
from loopd.engine.outcome import Failure, Loop, RequestResult, is_pool_full, unreplayable_call
from loopd.engine.progress import Phase, Status, StatusCallback
from loopd.engine.request import ANY_SLOT
from loopd.engine.thinkcap import Close, ControlCall, SendControl, ThinkCap
from loopd.engine.waits import WaitClock
from loopd.errors import (
    InferenceError,
    ServerRejected,
    ServerUnreachable,
    StreamBroken,
    StreamCut,
)
from loopd.wire.assemble import StreamAssembler
from loopd.wire.events import (
    ContentDelta,
    Done,
    Foreign,
    KeepAlive,
    Malformed,
    Progress,
    ReasoningDelta,
    ServerError,
    StreamEvent,
    ToolCallDelta,
)

log = logging.getLogger(__name__)


def _ignore_status(status: Status) -> None:
    del status


class StatusThrottle:
    """Passes a status on when it says something new, without flooding the receiver.

    A new phase (or a new tool) goes through at once; a changed figure within the same phase (a
    percentage, a token count) at most once per ``interval_s``; a repeat never. ``offer``
    builds the status only when one of its kind is due: the answer's text so far is joined
    once per interval, not once per token.
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
        self.offer(status.phase, status.tool, lambda: status)

    def offer(self, phase: Phase, tool: str | None, make: Callable[[], Status]) -> None:
        """A status of ``phase`` (and ``tool``), built by ``make`` if it is to be sent."""
        last, now = self._last, self._clock()
        same_kind = last is not None and (last.phase, last.tool) == (phase, tool)
        if same_kind and now - self._at < self._interval_s:
            return
        status = make()
        if status == last:
            return
        self._last, self._at = status, now
        self._report(status)


class _SlotWatch:
    """Polls /slots (and /health when /slots tells nothing) while the request waits for its
    first byte; ``liveness`` judges each poll."""

    def __init__(
        self, client: InferenceClient, slot: int, limits: Limits, report: StatusCallback
    ) -> None:
        self.client = client
        self.slot = slot
        self.limits = limits
        self.report = report
        self.wait = FirstByteWait()
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
            answer = await self._slots()
            verdict = await self._verdict(answer)
            self.wait = self.wait.polled(answer, verdict, time.monotonic())
            if isinstance(verdict, Gone):
                give_up.cancel()
                return
            self.report(Status(_WAIT_PHASES[type(verdict)]))

    def finish(self) -> None:
        """Stop polling, letting a poll in flight end by itself (it takes milliseconds).

        Cancelling a read on a Unix socket just as its answer arrives makes anyio's asyncio
        backend set a result on a cancelled future, which asyncio reports as an error.
        """
        self._done = True
        self._nap.cancel()

    def end_wait(self) -> None:
        """The first byte came, or the wait ended otherwise: close the queued stretch."""
        self.wait = self.wait.ended(time.monotonic())

    async def _verdict(self, answer: SlotsAnswer) -> LivenessVerdict:
        if isinstance(answer, SlotsListed):
            # A request the server places waits only while every slot is busy.
            return slots_verdict(answer.slots, None if self.slot == ANY_SLOT else self.slot)
        return health_verdict(answer, await self._health_answers())

    async def _slots(self) -> SlotsAnswer:
        if self.wait.slots_refused:
            return SlotsNotAsked()
        timeout = self.limits.probe_timeout_s
        with anyio.move_on_after(timeout):
            try:
                return SlotsListed(await self.client.slots(wait_s=timeout * 2))
            except ServerRejected as exc:
                return SlotsRefused(exc.status)
            except InferenceError as exc:
                return SlotsFailed(str(exc))
        return SlotsHung(timeout)

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


_WAIT_PHASES: dict[type[LivenessVerdict], Phase] = {
    Waiting: Phase.WAITING,
    Queued: Phase.QUEUED,
    Stuck: Phase.STUCK,
}


def start_result() -> RequestResult:
    """The result of a request sent now."""
    return RequestResult(assembler=StreamAssembler(), wait=WaitClock(sent=time.monotonic()))


async def run_request(
    client: InferenceClient,
    body: bytes,
    *,
    slot: int,
    limits: Limits,
    report: StatusCallback = _ignore_status,
) -> RequestResult:
    """Send one chat request and stream it to the end, or to a recorded failure."""
    result = start_result()
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
    lost: Callable[[int], bool] | None = None,
) -> None:
    """``run_request`` into a result the caller holds, so that it can record what happened even
    when the request is cancelled: the result then says CANCELLED, the connection is closed
    (which stops the generation on the server) and the cancellation goes on.

    ``lost`` is asked the first progress event's ``cache`` count (what the server kept, told
    before any prefill work); True closes the request then, as ``LOST_BY_SERVER``."""
    throttled = StatusThrottle(report, limits.status_interval_s)
    try:
        async with AsyncExitStack() as stack:
            watch = _SlotWatch(client, slot, limits, throttled)
            answer = await _open(client, body, limits, watch, result, stack)
            if answer is not None:
                arrived = time.monotonic()
                result.first_byte_s = arrived - result.sent_at
                result.wait.byte(arrived)
                reader = _Reader(client, EventStream(answer), limits, throttled, result, lost)
                await reader.read()
    except ServerRejected as exc:
        failure = Failure.POOL_FULL if is_pool_full(exc.message) else Failure.REJECTED
        result.fail(failure, str(exc))
        result.status_code, result.error_type = exc.status, exc.error_type
    except ServerUnreachable as exc:
        result.fail(Failure.UNREACHABLE, str(exc))
    except StreamCut as exc:  # the connection broke mid-stream
        result.fail(Failure.TRUNCATED, str(exc))
    except StreamBroken as exc:
        result.fail(Failure.SERVER_GONE, str(exc))
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
) -> ChatStream | None:
    """Wait for the first byte (the status line) while watching the slot."""
    answer: ChatStream | None = None
    error: InferenceError | None = None
    with anyio.move_on_after(limits.first_byte_s) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run, tg.cancel_scope)
            try:
                answer = await _send(client, body, limits, stack)
            except InferenceError as exc:
                error = exc  # raised outside the task group, so it is not wrapped in a group
            watch.finish()
    watch.end_wait()
    if error is not None:
        raise error
    if answer is None:
        match no_first_byte(watch.wait, timed_out=deadline.cancelled_caught):
            case Gone(reason):
                result.fail(Failure.SERVER_GONE, f"llama-server at {client.url} is gone: {reason}")
            case TimedOut(why):
                result.fail(
                    Failure.FIRST_BYTE_TIMEOUT,
                    f"no answer from {client.url} within {limits.first_byte_s:g} s ({why})",
                )
    return answer


async def _send(
    client: InferenceClient, body: bytes, limits: Limits, stack: AsyncExitStack
) -> ChatStream:
    async for attempt in retrying(
        Backoff(first_s=limits.loading_wait_s, cap_s=10.0),
        retry_if_exception(worth_waiting_out),
        within_s=limits.loading_retry_s,
    ):
        with attempt:
            return await stack.enter_async_context(client.stream_chat(body))
    raise AssertionError("tenacity ended without a result or an error")  # pragma: no cover


# Past [DONE] nothing more belongs to the completion; after an error, a broken chunk or a line
# outside the protocol the message cannot be trusted, and reading on would only keep the slot busy.
_LAST_EVENTS = (Done, ServerError, Malformed, Foreign)

# How late the silence limit may fire: the most its deadline lags the last chunk's arrival.
SILENCE_SLACK_S = 1.0


class _Reader:
    """Reads a stream to its end: events into the assembler, statuses out, limits enforced."""

    def __init__(
        self,
        client: InferenceClient,
        events: EventStream,
        limits: Limits,
        report: StatusThrottle,
        result: RequestResult,
        lost: Callable[[int], bool] | None = None,
    ) -> None:
        self.client = client
        self.events = events
        self.limits = limits
        self.report = report
        self.result = result
        self.lost = lost  # asked once, at the first progress event
        self.cap = ThinkCap(limits.think_cap, limits.think_grace)
        self.thought = RepetitionWatch(limits.loop_window)
        self.answer = RepetitionWatch(limits.loop_window)

    async def read(self) -> None:
        # The control call runs beside the reading and raises nothing (``end_reasoning`` answers
        # its failures); what the reading raises is raised as itself, not in a group.
        error: Exception | None = None
        async with anyio.create_task_group() as calls:
            try:
                await self._read(calls)
            except Exception as exc:
                error = exc
            # A control call still in flight when the stream ends has nothing left to end.
            calls.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _read(self, calls: TaskGroup) -> None:
        # One deadline for the whole stream, moved on by the chunks that complete an event (a
        # scope per read costs more than the read itself on a fast model), and moved at most
        # once per ``slack`` (each move reschedules the event loop's timer): the limit fires
        # between silence_s and silence_s + slack after the last event, never before. Bytes
        # that complete no event, and keep-alive pings (the server's own "nothing to say"), are
        # not life: a drip of them must not hold the slot.
        silence_s = self.limits.silence_s
        slack = min(SILENCE_SLACK_S, silence_s / 10)
        with anyio.CancelScope(deadline=anyio.current_time() + silence_s + slack) as silence:
            while True:
                events = await self.events.receive()
                if self._apply(events) or self.events.at_end or self._answer_loops():
                    return
                if not self._follow_cap(calls):
                    return
                if not _alive(events):
                    continue
                now = anyio.current_time()
                if silence.deadline < now + silence_s:
                    silence.deadline = now + silence_s + slack
        if silence.cancelled_caught:
            self.result.fail(
                Failure.SILENCE,
                f"llama-server at {self.client.url} went silent for "
                f"{silence_s:g} s mid-stream; the connection was closed",
            )

    def _apply(self, events: list[StreamEvent]) -> bool:
        """Fold the events in; True when the stream is over or can no longer be trusted."""
        ended = False
        asm, wait = self.result.assembler, self.result.wait
        for event in events:
            asm.apply(event)
            self.result.events += 1
            if isinstance(event, ReasoningDelta | ContentDelta | ToolCallDelta):
                if not self.result.output_seen:
                    wait.token(time.monotonic())
                self.result.output_seen = True
            if isinstance(event, ReasoningDelta):
                self.thought.feed(event.text)
            elif isinstance(event, ContentDelta):
                self.answer.feed(event.text)
            ended = ended or isinstance(event, _LAST_EVENTS)
            _report_event(event, asm, self.report)
            if isinstance(event, Progress):
                wait.progress(event.processed, event.total, time.monotonic())
                if self._lost_at(event.cache):
                    return True
        return ended

    def _lost_at(self, cache: int) -> bool:
        lost, self.lost = self.lost, None
        if lost is None or not lost(cache):
            return False
        self.result.fail(
            Failure.LOST_BY_SERVER,
            f"llama-server at {self.client.url} kept {cache} tokens of the session; "
            "the request was closed to restore its saved state",
        )
        return True

    def _answer_loops(self) -> bool:
        """True when the answer goes round in circles (and no tool call has begun, which
        closing would cut): the stream is then closed and the answer kept as written."""
        if not self.answer.looping or self.result.assembler.tool_calls:
            return False
        self.result.looped.append(Loop.ANSWER)
        timings = self.result.assembler.timings
        tokens = timings.predicted_n if timings is not None else self.answer.tokens
        self.result.notes.append(
            f"the answer went round in circles; loopd closed it after {tokens} tokens and "
            "kept it as written"
        )
        return True

    def _follow_cap(self, calls: TaskGroup) -> bool:
        """Do what the thinking cap decides; False when the stream must be closed."""
        asm, result = self.result.assembler, self.result
        decision = self.cap.decide(
            asm.thinking_tokens,
            answering=asm.answer_started,
            control=result.control,
            looping=self.thought.looping,
        )
        match decision:
            case SendControl():
                if asm.thinking_tokens < self.cap.cap:
                    result.looped.append(Loop.REASONING)
                    result.notes.append(
                        "the model's thinking went round in circles; loopd ended it after "
                        f"{asm.thinking_tokens} tokens"
                    )
                result.control = ControlCall()
                calls.start_soon(self._send_control, asm.completion_id)
            case Close(why):
                result.fail(
                    Failure.THINK_RUNAWAY,
                    f"thinking passed the cap of {self.cap.cap} tokens and {why}; the stream "
                    f"from {self.client.url} was closed at {asm.thinking_tokens} tokens",
                )
                return False
        return True

    async def _send_control(self, completion_id: str | None) -> None:
        """The control call, beside the reading: the tokens the server writes until the call
        reaches it are read meanwhile, so the grace counts from where its answer arrived."""
        answer = await self.client.end_reasoning(completion_id)
        self.result.control = ControlCall(answer, self.result.assembler.thinking_tokens)


def _alive(events: list[StreamEvent]) -> bool:
    """Whether a chunk's events say the request is alive: any event but a keep-alive ping."""
    # The first event decides on the hot path (a token's chunk); a ping comes alone.
    return bool(events) and (
        type(events[0]) is not KeepAlive or any(type(e) is not KeepAlive for e in events)
    )


def _report_event(event: StreamEvent, asm: StreamAssembler, report: StatusThrottle) -> None:
    # The text so far is joined only when the throttle sends a status (``offer``).
    match event:
        case Progress(total, cache, processed, _):
            fresh = max(total - cache, 1)
            percent = int(100 * (processed - cache) / fresh)
            report(Status(Phase.READING, percent=percent))
        case ReasoningDelta():
            report.offer(
                Phase.THINKING,
                None,
                lambda: Status(Phase.THINKING, tokens=asm.thinking_tokens, text=asm.reasoning),
            )
        case ContentDelta():
            report.offer(Phase.ANSWERING, None, lambda: Status(Phase.ANSWERING, text=asm.content))
        case ToolCallDelta(name=name) if name:
            report(Status(Phase.TOOL_CALL, tool=name))
        case _:
            pass


def _classify_end(client: InferenceClient, result: RequestResult) -> None:
    if result.failure is not None:
        return
    asm = result.assembler
    if asm.server_error is not None:
        pool_full = is_pool_full(asm.server_error.message)
        result.fail(
            Failure.POOL_FULL if pool_full else Failure.SERVER_ERROR,
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
    elif Loop.ANSWER in result.looped:
        pass  # closed by loopd, kept as written
    elif not asm.done:
        result.fail(Failure.TRUNCATED, f"the stream from {client.url} ended without [DONE]")
    elif (bad := unreplayable_call(asm)) is not None:
        result.fail(Failure.BAD_TOOL_CALL, bad)
