"""One streamed request (``run_request``) against the fake llama-server: every fault switch ends
in its Failure and a message naming the URL, the liveness limits hold, the thinking cap works."""

from __future__ import annotations

import itertools
from dataclasses import replace

import anyio
import httpx
import pytest
import respx

from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.outcome import Failure, RequestResult, retry_safe
from loopd.engine.progress import Phase, Status
from loopd.engine.stream import StatusThrottle, run_request, start_result, stream_into
from loopd.wire.assemble import StreamAssembler
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply, Trigger
from tests.engine.engine_support import FAST, MODEL, SLOT, Served, eventually, served, user_body

pytestmark = pytest.mark.anyio

# About one token a word: far past any cap used here, within the requests' 512 max_tokens.
THINKER = ScriptedReply(reasoning=" ".join(["hmm"] * 400), content="The answer.")


async def _slot_busy(server: Served) -> bool:
    return bool(server.fake.model().slots.slots[SLOT].is_processing)


async def _slot_idle(server: Served) -> bool:
    return not await _slot_busy(server)


async def test_a_plain_request_completes_with_statuses_in_order() -> None:
    seen: list[Status] = []
    async with served() as server:
        result = await run_request(
            server.client, user_body("hello there"), slot=SLOT, limits=FAST, report=seen.append
        )
    assert result.complete, result.detail
    assert result.assembler.content == "You said: hello there"
    assert result.first_byte_s is not None
    assert result.output_seen
    phases = [status.phase for status in seen]
    assert (
        phases.index(Phase.READING) < phases.index(Phase.THINKING) < phases.index(Phase.ANSWERING)
    )
    assert all(a != b for a, b in itertools.pairwise(seen)), "no status twice in a row"


async def test_the_status_callback_is_not_flooded() -> None:
    seen: list[Status] = []
    async with served() as server:
        server.fake.push(THINKER)
        result = await run_request(
            server.client,
            user_body("think"),
            slot=SLOT,
            # The watch off: THINKER's 400 "hmm"s are a loop it would end.
            limits=replace(
                FAST, status_interval_s=60, think_cap=10_000, slots_poll_s=60, loop_window=0
            ),
            report=seen.append,
        )
    assert result.complete, result.detail
    assert result.assembler.thinking_tokens > 400
    # One report per phase: 400 thinking tokens within the interval show as one status.
    assert [s.phase for s in seen] == [Phase.READING, Phase.THINKING, Phase.ANSWERING]


async def test_a_request_queued_behind_another_task_reports_queued_then_completes() -> None:
    seen: list[Status] = []
    async with served() as server, anyio.create_task_group() as tg:
        server.fake.faults.set(stall_before_first_byte=True)
        blocker: list[RequestResult] = []
        limits = replace(FAST, first_byte_s=10)

        async def block() -> None:
            blocker.append(
                await run_request(server.client, user_body("a"), slot=SLOT, limits=limits)
            )

        tg.start_soon(block)
        await eventually(lambda: _slot_busy(server))

        async def clear_when_queued() -> None:
            await eventually(lambda: Phase.QUEUED in {s.phase for s in seen})
            await eventually(lambda: server.fake.model().slots.queued == 1)
            server.fake.faults.set(stall_before_first_byte=False)

        tg.start_soon(clear_when_queued)
        queued = await run_request(
            server.client, user_body("b"), slot=SLOT, limits=limits, report=seen.append
        )
    assert blocker[0].complete
    assert queued.complete, queued.detail
    assert queued.wait.parts()["server_queue_ms"] > 0
    assert queued.first_byte_s is not None


async def test_stall_before_the_first_byte_gives_up_at_the_first_byte_limit() -> None:
    async with served() as server:
        server.fake.faults.set(stall_before_first_byte=True)
        result = await run_request(
            server.client, user_body("x"), slot=SLOT, limits=replace(FAST, first_byte_s=0.3)
        )
        await eventually(lambda: _slot_idle(server))  # hanging up freed the slot
    assert result.failure is Failure.FIRST_BYTE_TIMEOUT
    assert result.detail.startswith(f"no answer from {server.url} within 0.3 s (queued")
    assert result.first_byte_s is None
    assert server.fake.chat_records()[0].outcome == "disconnected"
    assert not retry_safe(result), "the first-byte limit is the bound: no second wait"


async def test_slots_hanging_while_health_answers_is_reported_as_stuck() -> None:
    seen: list[Status] = []
    async with served() as server:
        server.fake.faults.set(stall_before_first_byte=True, slots_hang=True)
        result = await run_request(
            server.client,
            user_body("x"),
            slot=SLOT,
            limits=replace(FAST, first_byte_s=0.5, probe_timeout_s=0.1),
            report=seen.append,
        )
        server.fake.faults.clear()
    assert Phase.STUCK in {s.phase for s in seen}
    assert result.failure is Failure.FIRST_BYTE_TIMEOUT
    assert "the server looks stuck: /slots did not answer while /health did" in result.detail


async def test_a_hung_server_is_gone_fast() -> None:
    async with served() as server:
        server.fake.faults.set(hang_all=True)
        with anyio.fail_after(3):
            result = await run_request(
                server.client, user_body("x"), slot=SLOT, limits=replace(FAST, probe_timeout_s=0.1)
            )
        server.fake.faults.clear()
    assert result.failure is Failure.SERVER_GONE
    assert result.detail == (
        f"llama-server at {server.url} is gone: "
        "/slots does not answer within 0.1 s and /health does not answer"
    )
    assert retry_safe(result)


async def test_a_server_that_dies_while_the_request_waits_is_gone_then_unreachable() -> None:
    async with served() as server:
        server.fake.faults.set(stall_before_first_byte=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _kill_when_busy(server))
            died = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
        after = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
    assert died.failure is Failure.SERVER_GONE
    # Whichever the reader sees first: the request's connection closing, or the /slots poll
    # that runs beside it finding nothing there (on a busy machine either wins).
    assert died.detail.startswith(
        (
            f"llama-server at {server.url} closed the connection before answering",
            f"llama-server at {server.url} is gone: /slots fails",
        )
    ), died.detail
    assert after.failure is Failure.UNREACHABLE
    assert after.detail.startswith(f"llama-server at unix:{server.socket} is unreachable")
    assert retry_safe(died)
    assert retry_safe(after)


async def _kill_when_busy(server: Served) -> None:
    await eventually(lambda: _slot_busy(server))
    server.running.kill()


async def test_stall_mid_stream_closes_the_connection_at_the_silence_limit() -> None:
    async with served() as server:
        server.fake.faults.set(stall_mid_stream=Trigger(after=6))
        result = await run_request(
            server.client, user_body("x"), slot=SLOT, limits=replace(FAST, silence_s=0.3)
        )
        await eventually(lambda: _slot_idle(server))  # closing cancelled the generation
        server.fake.faults.clear()
    assert result.failure is Failure.SILENCE
    assert result.detail == (
        f"llama-server at {server.url} went silent for 0.3 s mid-stream; the connection was closed"
    )
    assert server.fake.chat_records()[0].outcome == "disconnected"
    assert result.output_seen
    assert not retry_safe(result), "the model had begun: not retried"


async def test_progress_events_are_life_during_a_slow_prompt() -> None:
    # 300 prompt tokens at 1,000 tokens/s in batches of 32 make an event every 32 ms, each
    # well inside a 0.2 s silence limit, while the whole prefill takes 0.3 s.
    fake = FakeLlama(pace=Pace(prompt_tokens_per_second=1000, batch_size=32))
    async with served(fake) as server:
        result = await run_request(
            server.client, user_body("word " * 300), slot=SLOT, limits=replace(FAST, silence_s=0.2)
        )
    assert result.complete, result.detail
    assert result.assembler.timings is not None
    assert result.assembler.timings.prompt_ms > 200


@pytest.mark.parametrize(
    ("fault", "failure", "detail"),
    [
        (
            {"drop_mid_stream": Trigger(after=2)},
            Failure.TRUNCATED,
            "the connection to {url} broke mid-stream: ",
        ),
        (
            {"malformed_chunk": Trigger(after=1)},
            Failure.MALFORMED,
            "malformed stream from {url}: malformed chunk (not JSON: ",
        ),
        (
            {"error_mid_stream": Trigger(after=2)},
            Failure.SERVER_ERROR,
            "llama-server at {url} reported an error mid-stream: "
            "fake fault: error in the middle of the stream",
        ),
        (
            {"http_500": Trigger()},
            Failure.REJECTED,
            "llama-server at {url} answered 500: fake fault: internal server error",
        ),
    ],
)
async def test_a_broken_stream_ends_in_its_failure(
    fault: dict[str, Trigger], failure: Failure, detail: str
) -> None:
    async with served() as server:
        server.fake.faults.set(**fault)
        result = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
    assert result.failure is failure
    assert result.detail.startswith(detail.format(url=server.url)), result.detail
    assert not result.complete
    assert retry_safe(result), "nothing was generated yet: another attempt is safe"


async def test_a_500_is_rejected_with_its_status_not_gone() -> None:
    async with served() as server:
        server.fake.faults.set(http_500=Trigger(count=1))
        result = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
        again = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
    assert (result.failure, result.status_code, result.error_type) == (
        Failure.REJECTED,
        500,
        "server_error",
    )
    assert again.complete


async def test_exceeding_the_context_is_rejected_once_and_not_retried() -> None:
    fake = FakeLlama([ModelSpec(MODEL, n_ctx=64)])
    async with served(fake) as server:
        result = await run_request(server.client, user_body("word " * 100), slot=SLOT, limits=FAST)
    assert (result.failure, result.status_code) == (Failure.REJECTED, 400)
    assert result.error_type == "exceed_context_size_error"
    assert "exceeds the available context size" in result.detail
    assert len(server.fake.chat_records()) == 1
    assert not retry_safe(result)


async def test_a_503_while_loading_is_waited_out_then_the_request_completes() -> None:
    async with served() as server, anyio.create_task_group() as tg:
        server.fake.faults.set(loading=True)

        async def clear_after_two_refusals() -> None:
            await eventually(lambda: len(server.fake.chat_records()) >= 2)
            server.fake.faults.set(loading=False)

        tg.start_soon(clear_after_two_refusals)
        result = await run_request(server.client, user_body("x"), slot=SLOT, limits=FAST)
    statuses = [record.status for record in server.fake.chat_records()]
    assert result.complete, result.detail
    assert statuses[:2] == [503, 503]
    assert statuses[-1] == 200


async def test_a_503_past_the_loading_wait_is_rejected() -> None:
    async with served() as server:
        server.fake.faults.set(loading=True)
        result = await run_request(
            server.client, user_body("x"), slot=SLOT, limits=replace(FAST, loading_retry_s=0.1)
        )
    assert (result.failure, result.status_code) == (Failure.REJECTED, 503)
    assert "answered 503: Loading model" in result.detail
    assert len(server.fake.chat_records()) > 1
    assert not retry_safe(result), "the loading wait was the retry"


async def test_thinking_cap_ends_reasoning_with_the_control_call() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    fake.push(THINKER)
    async with served(fake) as server:
        result = await run_request(
            server.client, user_body("think"), slot=SLOT, limits=replace(FAST, think_cap=20)
        )
    assert result.complete, result.detail
    assert (result.capped, result.control_answer) == (True, "success")
    assert 20 <= result.assembler.thinking_tokens < 60, "reasoning ended soon after the cap"
    assert result.assembler.content == "The answer."


async def test_a_control_call_slower_than_the_grace_still_ends_the_thinking() -> None:
    """On a loaded machine the control call's round trip outlasts the grace: the server writes
    more thinking tokens before it is armed than the grace allows. Those are read while the call
    is in flight, and the grace counts from its answer, so the turn is answered, not closed."""
    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    fake.push(THINKER)
    limits = replace(FAST, think_cap=20, think_grace=15)
    async with served(fake) as server:
        server.fake.faults.set(control_round_trip=60)
        result = await run_request(server.client, user_body("think"), slot=SLOT, limits=limits)
    assert result.complete, result.detail
    assert result.control is not None
    assert result.control.answer == "success"
    assert result.control.answered_at >= 20 + 60 - 1, "read while the call was in flight"
    assert result.assembler.thinking_tokens > 20 + 15, "past where the cap alone would close it"
    assert result.assembler.content == "The answer."


async def test_a_stream_that_ends_while_its_control_call_is_in_flight_does_not_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str | None] = []

    async def never_answered(completion_id: str | None) -> str:
        sent.append(completion_id)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    fake.push(ScriptedReply(reasoning=" ".join(["hmm"] * 30), content="Done."))
    async with served(fake) as server:
        monkeypatch.setattr(server.client, "end_reasoning", never_answered)
        limits = replace(FAST, think_cap=5)
        result = await run_request(server.client, user_body("think"), slot=SLOT, limits=limits)
    assert sent, "the control call was sent"
    assert result.complete, result.detail
    assert result.capped
    assert result.control_answer is None, "the call was cancelled, its answer never came"
    assert result.assembler.content == "Done."


async def test_a_control_call_the_server_never_answers_ends_at_its_timeout_and_the_grace() -> None:
    """A hostile or stuck server that thinks on and never answers the control call: the call's
    own timeout (the client's ``connect_s``) is its answer, and the grace counts from there."""
    fake = FakeLlama([ModelSpec(MODEL, n_ctx=65536)], pace=Pace(tokens_per_second=1000))
    # Longer than the call's timeout at any speed the fake can have: at most 1000 tokens a
    # second, this thought outlasts the 2 s the served client waits for the call.
    fake.push(ScriptedReply(reasoning=" ".join(f"step{n}" for n in range(11_000))))
    limits = replace(FAST, think_cap=20, think_grace=15)
    async with served(fake) as server:
        server.fake.faults.set(control_round_trip=1_000_000)
        body = user_body("think", max_tokens=30_000)
        result = await run_request(server.client, body, slot=SLOT, limits=limits)
    assert result.failure is Failure.THINK_RUNAWAY, result.detail
    assert result.control is not None
    assert (result.control.answer or "").startswith("control call failed: "), result.control
    closed_at = result.control.answered_at + 15
    assert closed_at <= result.assembler.thinking_tokens < closed_at + 10
    assert "the server could not end it (control call failed: " in result.detail


async def test_thinking_past_cap_and_grace_is_closed_when_nothing_was_armed() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=1000))
    fake.push(THINKER)
    limits = replace(FAST, think_cap=20, think_grace=15)
    async with served(fake) as server:
        unarmed = user_body("think", reasoning_control=False)
        result = await run_request(server.client, unarmed, slot=SLOT, limits=limits)
        await eventually(lambda: _slot_idle(server))
    assert result.failure is Failure.THINK_RUNAWAY
    assert result.capped
    assert result.control_answer == "reasoning control not enabled for this completion"
    assert result.control is not None
    closed_at = max(20, result.control.answered_at) + 15
    assert closed_at <= result.assembler.thinking_tokens < closed_at + 10, "closed past the grace"
    assert result.detail == (
        "thinking passed the cap of 20 tokens and the server could not end it (reasoning "
        "control not enabled for this completion); the stream from "
        f"{server.url} was closed at {result.assembler.thinking_tokens} tokens"
    )
    assert server.fake.chat_records()[0].outcome == "disconnected"


async def test_cancelling_a_request_closes_the_connection_and_says_so() -> None:
    result = start_result()
    async with served() as server:
        server.fake.faults.set(stall_mid_stream=Trigger(after=6))
        with anyio.move_on_after(0.2) as scope:
            await stream_into(result, server.client, user_body("x"), slot=SLOT, limits=FAST)
        await eventually(lambda: _slot_idle(server))
        server.fake.faults.clear()
    assert scope.cancelled_caught, "the cancellation went on"
    assert result.failure is Failure.CANCELLED
    assert result.detail == f"cancelled; the connection to {server.url} was closed"
    assert server.fake.chat_records()[0].outcome == "disconnected"


URL = "http://llama.test"


def _sse(*lines: str) -> bytes:
    return "".join(f"{line}\n\n" for line in lines).encode()


async def test_a_routers_plain_text_line_ends_as_a_clear_message() -> None:
    chunk = '{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}'
    with respx.mock(base_url=URL, assert_all_called=False) as mock:
        mock.get("/slots").respond(200, json=[{"id": SLOT, "is_processing": False}])
        mock.get("/health").respond(200, json={"status": "ok"})
        mock.post("/v1/chat/completions").respond(
            200, content=_sse(f"data: {chunk}") + b"proxy error: child exited"
        )
        async with InferenceClient(URL, MODEL) as client:
            result = await run_request(client, b"{}", slot=SLOT, limits=FAST)
    assert result.failure is Failure.SERVER_ERROR
    assert result.detail == (
        f"llama-server at {URL} broke off the stream with: 'proxy error: child exited'"
    )
    assert not retry_safe(result), "the model had begun answering"


async def test_a_refused_slots_endpoint_is_asked_once_and_health_keeps_watch() -> None:
    health_polls = anyio.Event()
    with respx.mock(base_url=URL) as mock:

        async def answer_later(request: httpx.Request) -> httpx.Response:
            await health_polls.wait()
            return httpx.Response(200, content=_sse("data: [DONE]"))

        def health(request: httpx.Request) -> httpx.Response:
            if health_route.call_count >= 3:
                health_polls.set()
            return httpx.Response(200, json={"status": "ok"})

        mock.post("/v1/chat/completions").mock(side_effect=answer_later)
        slots_route = mock.get("/slots").respond(
            501, json={"error": {"code": 501, "message": "slots disabled", "type": "x"}}
        )
        health_route = mock.get("/health").mock(side_effect=health)
        async with InferenceClient(URL, MODEL) as client:
            await run_request(client, b"{}", slot=SLOT, limits=FAST)
    assert slots_route.call_count == 1
    assert health_route.call_count >= 3


def test_retry_safe_needs_a_failure_without_output_and_not_a_4xx() -> None:
    def result(failure: Failure, status: int | None = None, output: bool = False) -> RequestResult:
        return RequestResult(StreamAssembler(), failure, status_code=status, output_seen=output)

    assert retry_safe(result(Failure.TRUNCATED))
    assert not retry_safe(result(Failure.TRUNCATED, output=True))
    assert retry_safe(result(Failure.REJECTED, 500))
    assert not retry_safe(result(Failure.REJECTED, 400))
    assert not retry_safe(result(Failure.REJECTED, 503))
    for never in (Failure.FIRST_BYTE_TIMEOUT, Failure.THINK_RUNAWAY, Failure.CANCELLED):
        assert not retry_safe(result(never))
    # A full shared pool: nothing of the partial answer is kept, so it may go again.
    assert retry_safe(result(Failure.POOL_FULL, 500, output=True))


def test_status_throttle_passes_new_phases_at_once_and_figures_at_most_per_interval() -> None:
    now = [0.0]
    seen: list[Status] = []
    throttle = StatusThrottle(seen.append, 1.0, clock=lambda: now[0])
    for tokens in range(1, 100):
        throttle(Status(Phase.THINKING, tokens=tokens))
    now[0] = 1.5
    throttle(Status(Phase.THINKING, tokens=150))
    throttle(Status(Phase.TOOL_CALL, tool="read_file"))
    throttle(Status(Phase.TOOL_CALL, tool="read_file"))
    throttle(Status(Phase.TOOL_CALL, tool="write_file"))
    assert seen == [
        Status(Phase.THINKING, tokens=1),
        Status(Phase.THINKING, tokens=150),
        Status(Phase.TOOL_CALL, tool="read_file"),
        Status(Phase.TOOL_CALL, tool="write_file"),
    ]


def test_default_limits_match_the_issue() -> None:
    limits = Limits()
    assert (limits.first_byte_s, limits.silence_s, limits.think_cap) == (900, 60, 6144)
