"""``POST /v1/chat/completions``: validation, the silent queue, the slot, and the stream.

Nothing is written until a slot has taken the task: a queued request gets no status line and no
headers. Errors found before that are plain JSON answers. A client that hangs up cancels the
request at once, queued or running, and the slot keeps what it evaluated.
"""

from typing import Any

import anyio
from anyio.abc import ObjectSendStream

from .asgi import BEGIN, Receive, Scope, Send, SseWriter, StreamEnd, read_body, send_json
from .chunks import (
    DONE,
    PING,
    ROLE_DELTA,
    Identity,
    Timings,
    chunk,
    completion_json,
    delta_choice,
    message_json,
    progress_json,
    sse_event,
    usage_json,
)
from .engine import CompletionJob, Progress, run_completion
from .errors import ApiError, exceed_context, server_error
from .messages import ChatRequest, parse_chat_request, parse_json_body
from .model import FinishReason, Generation, Step
from .render import render_prompt
from .slots import Slot
from .state import FakeLlama, LiveCompletion, ModelInstance, RequestRecord
from .tokenize import tokenize


class _StreamSink:
    """Turns engine events into SSE frames for the writer."""

    def __init__(
        self,
        frames: ObjectSendStream[bytes],
        identity: Identity,
        request: ChatRequest,
        prompt_tokens: int,
    ) -> None:
        self._frames = frames
        self._identity = identity
        self._request = request
        self._prompt_tokens = prompt_tokens
        self._begun = False

    async def progress(self, progress: Progress, timings: Timings) -> None:
        if not self._begun:
            self._begun = True
            await self._frames.send(BEGIN)
        if not self._request.return_progress:
            return
        extra: dict[str, Any] = {}
        if self._request.timings_per_token:
            extra["timings"] = timings.to_json()
        extra["prompt_progress"] = progress_json(
            progress.total, progress.cache, progress.processed, progress.time_ms
        )
        await self._send(chunk(self._identity, delta_choice(dict(ROLE_DELTA)), **extra))

    async def token(self, step: Step, first: bool, timings: Timings) -> None:
        events = []
        if first:
            events.append(chunk(self._identity, delta_choice(dict(ROLE_DELTA))))
        delta = step.delta()
        if delta:
            events.append(chunk(self._identity, delta_choice(delta)))
        if events and self._request.timings_per_token:
            events[-1]["timings"] = timings.to_json()
        for event in events:
            await self._send(event)

    async def finished(self, finish_reason: FinishReason, timings: Timings) -> None:
        events = [chunk(self._identity, delta_choice({}, finish_reason))]
        if self._request.include_usage:
            usage = usage_json(self._prompt_tokens, timings.predicted_n, timings.cache_n)
            events.append(chunk(self._identity, [], usage=usage))
        events[-1]["timings"] = timings.to_json()
        for event in events:
            await self._send(event)
        await self._frames.send(DONE)

    async def _send(self, event: dict[str, Any]) -> None:
        await self._frames.send(sse_event(event))


class _SilentSink:
    """A non-stream request shows nothing until the end."""

    async def progress(self, progress: Progress, timings: Timings) -> None:
        return None

    async def token(self, step: Step, first: bool, timings: Timings) -> None:
        return None

    async def finished(self, finish_reason: FinishReason, timings: Timings) -> None:
        return None


class ChatCompletions:
    """The ASGI endpoint; one :class:`_ChatRequestRun` per request."""

    def __init__(self, fake: FakeLlama) -> None:
        self._fake = fake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record: RequestRecord = scope["fake_record"]
        try:
            body = parse_json_body(await read_body(receive))
            request = parse_chat_request(body)
            instance = self._fake.select(request.model)
            record.model = instance.name
            if self._fake.faults.take_http_500():
                raise server_error("fake fault: internal server error")
            prompt = tokenize(
                render_prompt(request.messages, request.tools, instance.spec.template)
            )
        except ApiError as exc:
            record.outcome = "error"
            await send_json(send, exc.status, exc.envelope())
            return
        run = _ChatRequestRun(self._fake, instance, request, prompt, record, send)
        await run.run(receive)


class _ChatRequestRun:
    def __init__(
        self,
        fake: FakeLlama,
        instance: ModelInstance,
        request: ChatRequest,
        prompt: list[str],
        record: RequestRecord,
        send: Send,
    ) -> None:
        self._fake = fake
        self._instance = instance
        self._request = request
        self._prompt = prompt
        self._record = record
        self._send = send
        self._has_slot = False
        self._completed = False
        self._identity = Identity(fake.new_completion_id(), instance.name, fake.build_info)
        record.completion_id = self._identity.completion_id
        interval = request.sse_ping_interval
        ping = fake.sse_ping_interval if interval is None or interval == -1 else interval
        self._writer = SseWriter(send, fake.faults, fake.faults.arm_stream(), ping)

    async def run(self, receive: Receive) -> None:
        # A dropped stream simply returns mid-response: the server then closes the connection.
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
            await self._serve()
            self._completed = True
            tg.cancel_scope.cancel()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not (self._completed or self._writer.finished):
            self._record.outcome = "disconnected" if self._has_slot else "gone-while-queued"
            scope.cancel()

    async def _serve(self) -> StreamEnd:
        faults = self._fake.faults
        if self._request.stream and faults.faults.byte_while_queued:
            await self._writer.begin()
            await self._writer.write(PING)
        await faults.wait_until(lambda f: not f.sleeping)
        pin = self._instance.slots.resolve_pin(self._request.id_slot)
        slot = await self._instance.slots.acquire(pin, self._prompt)
        self._has_slot = True
        try:
            return await self._on_slot(slot)
        finally:
            live = self._instance.live.pop(self._identity.completion_id, None)
            if live is not None:
                live.generation.end()
            self._instance.slots.release(slot)

    async def _on_slot(self, slot: Slot) -> StreamEnd:
        self._record.slot = slot.id
        if len(self._prompt) >= slot.n_ctx:
            return await self._fail(exceed_context(len(self._prompt), slot.n_ctx))
        await self._fake.faults.wait_until(lambda f: not f.stall_before_first_byte)
        reply = self._instance.script.next_reply(self._request.messages)
        call_ids = self._fake.new_call_ids(len(reply.tool_calls))
        generation = Generation(
            reply,
            call_ids,
            self._request.reasoning_budget_message,
            ignore_eos=self._request.ignore_eos,
        )
        self._instance.live[self._identity.completion_id] = LiveCompletion(
            generation, armed=self._request.reasoning_control
        )
        job = CompletionJob(
            slot=slot,
            prompt=self._prompt,
            generation=generation,
            pace=self._fake.pace,
            id_task=self._fake.next_task_id(),
            cache_prompt=self._request.cache_prompt,
            n_predict=self._request.n_predict,
            params=_slot_params(self._request),
        )
        try:
            if self._request.stream:
                return await self._stream(job)
            return await self._respond(job)
        finally:
            self._note(job)

    async def _fail(self, error: ApiError) -> StreamEnd:
        self._record.outcome = "error"
        self._completed = True
        if self._writer.headers_sent:
            await self._writer.write(sse_event(error.envelope()))
            await self._writer.end()
        else:
            await send_json(self._send, error.status, error.envelope())
        return StreamEnd.ERROR_EVENT

    async def _stream(self, job: CompletionJob) -> StreamEnd:
        send_frames, receive_frames = anyio.create_memory_object_stream[bytes](0)
        sink = _StreamSink(send_frames, self._identity, self._request, len(self._prompt))

        async def produce() -> None:
            async with send_frames:
                self._record.finish_reason = await run_completion(job, sink)

        async with anyio.create_task_group() as tg, receive_frames:
            tg.start_soon(produce)
            end = await self._writer.pump(receive_frames)
            tg.cancel_scope.cancel()
        self._record.outcome = end.value
        return end

    async def _respond(self, job: CompletionJob) -> StreamEnd:
        finish = await run_completion(job, _SilentSink())
        self._record.finish_reason = finish
        generation, timings = job.generation, job.timings
        message = message_json(generation.reasoning, generation.content, generation.tool_calls)
        usage = usage_json(len(self._prompt), timings.predicted_n, timings.cache_n)
        body = completion_json(self._identity, finish, message, usage, timings)
        self._completed = True
        await send_json(self._send, 200, body)
        self._record.outcome = "ok"
        return StreamEnd.DONE

    def _note(self, job: CompletionJob) -> None:
        self._record.cache_n = job.timings.cache_n
        self._record.prompt_n = job.timings.prompt_n
        self._record.predicted_n = job.timings.predicted_n


def _slot_params(request: ChatRequest) -> dict[str, Any]:
    """The ``params`` subset ``/slots`` and ``/props`` show."""
    params: dict[str, Any] = {
        "seed": 4294967295,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
    }
    params.update(request.params)
    params.update(
        {
            "max_tokens": request.n_predict,
            "n_predict": request.n_predict,
            "stream": request.stream,
            "chat_format": "peg-native",
            "reasoning_format": "auto",
            "reasoning_in_content": False,
            "generation_prompt": "<|im_start|>assistant\n",
            "samplers": ["penalties", "dry", "top_k", "top_p", "min_p", "temperature"],
            "timings_per_token": request.timings_per_token,
        }
    )
    return params
