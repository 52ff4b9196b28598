"""The wait a person saw, recorded in parts that add up (``loopd.engine.waits``): one test per
part, each against the fake llama-server delaying that part alone.

The fake spends its delays as sleeps (``Pace``), which a busy machine only lengthens, so each
test asserts that its part holds at least the delay the fake is known to have spent in it after
the moment the test can see; and that the parts add up to a wait no longer than the one the test
measured from outside, around the whole turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import pytest

from loopd.config import load_settings
from loopd.engine.outcome import RequestResult
from loopd.engine.progress import Phase, Status
from loopd.engine.stream import run_request
from loopd.engine.waits import WAIT_PARTS, WaitClock, person_wait_ms
from loopd.observe.perfsummary import perf_record
from loopd.sessionlog.records import Request, fresh_external_key
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply, serve_fake_llama
from tests.engine.engine_support import (
    FAST,
    MODEL,
    SLOT,
    Served,
    eventually,
    make_turn,
    open_log,
    records,
    say,
    served,
    user_body,
)

pytestmark = pytest.mark.anyio

# Words of the fake's tokenizer: one token each.
WORDS = " ".join(f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(40))


def wait_of(request: Request) -> dict[str, float]:
    extra = request.record.perf.extra
    return {name: extra[name] for name in WAIT_PARTS if name in extra}


@dataclass
class FirstOutput:
    """A status callback that notes when the turn's first generated token shows: the end of
    the wait, on the test's own clock."""

    at: float | None = None

    def __call__(self, status: Status) -> None:
        if self.at is None and status.phase in (Phase.THINKING, Phase.ANSWERING, Phase.TOOL_CALL):
            self.at = time.monotonic()

    def since(self, start: float) -> float:
        """Milliseconds from ``start`` to the first token shown, plus the 0.2 ms by which the
        recorded parts, each rounded to 0.1 ms, may exceed their sum."""
        assert self.at is not None, "no token was shown"
        return (self.at - start) * 1000 + 0.2


def test_the_parts_end_where_the_next_begins_and_add_up() -> None:
    clock = WaitClock(sent=10.0, asked=9.0)
    clock.byte(10.5)
    clock.progress(processed=100, total=900, now=10.5)
    clock.progress(processed=500, total=900, now=11.0)
    clock.progress(processed=900, total=900, now=12.25)
    clock.token(12.5)
    clock.token(13.0)  # only the first counts
    parts = clock.parts()
    assert parts == {
        "loopd_queue_ms": 1000.0,
        "server_queue_ms": 500.0,
        "prompt_read_ms": 1750.0,
        "first_token_ms": 250.0,
    }
    assert person_wait_ms(parts) == 3500.0


def test_a_request_that_got_no_token_or_did_not_end_the_wait_has_fewer_parts() -> None:
    no_token = WaitClock(sent=1.0, asked=0.5)
    no_token.progress(processed=0, total=10, now=1.25)
    assert no_token.parts() == {"server_queue_ms": 250.0, "prompt_read_ms": 0.0}
    assert person_wait_ms(no_token.parts()) is None
    later = WaitClock(sent=1.0)  # a tool follow-up: the person's wait ended before it
    later.byte(1.5)  # no progress events: the first byte starts the server's work
    later.token(2.0)
    assert later.parts() == {
        "server_queue_ms": 500.0,
        "prompt_read_ms": 0.0,
        "first_token_ms": 500.0,
    }
    assert person_wait_ms(later.parts()) is None
    assert WaitClock(sent=1.0).parts() == {}  # nothing came back


async def test_a_turn_behind_another_in_loopd_waits_in_loopds_queue(tmp_path: Path) -> None:
    tokens_per_s, blocker_tokens = 50.0, 40
    fake = FakeLlama(models=(ModelSpec(name=MODEL),), pace=Pace(tokens_per_second=tokens_per_s))
    fake.push(ScriptedReply(content=WORDS), ScriptedReply(content="ok"))
    assert len(WORDS.split()) == blocker_tokens
    with anyio.fail_after(60):
        async with serve_fake_llama(fake, uds=tmp_path / "llama.sock") as running:
            assert running.uds is not None
            runtime = Runtime.open(
                load_settings(
                    infer_url=f"unix:{running.uds}",
                    model=MODEL,
                    broker_url=f"unix:{tmp_path / 'no-broker.sock'}",
                    state_dir=tmp_path / "state",
                    slots=[SLOT],  # one lane: the second turn waits behind the first in loopd
                    think_cap=0,
                )
            )
            try:
                first, second = runtime.ensure_session("first"), runtime.ensure_session("second")
                for name in ("first", "second"):
                    runtime.log.append_user(name, "hi", external_key=fresh_external_key())
                first_shown, second_shown = FirstOutput(), FirstOutput()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(runtime.run_turn, first, first_shown)
                    await eventually(lambda: first_shown.at is not None, seconds=30)
                    asked = time.monotonic()  # the first turn has 39 tokens to go
                    await runtime.run_turn(second, second_shown)
                (request,) = runtime.log.requests("second")
            finally:
                await runtime.aclose()
    parts = wait_of(request)
    assert list(parts) == list(WAIT_PARTS)
    # Behind the first turn's last 38 tokens at least (its second one may have been under way).
    assert parts["loopd_queue_ms"] >= (blocker_tokens - 2) / tokens_per_s * 1000
    wait = person_wait_ms(parts)
    assert wait is not None
    assert wait <= second_shown.since(asked)
    assert perf_record("second", request)["loopd_queue_ms"] == parts["loopd_queue_ms"]


async def test_a_request_behind_another_client_on_the_server_waits_in_its_queue(
    tmp_path: Path,
) -> None:
    tokens_per_s, other_tokens = 50.0, 40
    async with served() as server:
        server.fake.pace = Pace(tokens_per_second=tokens_per_s)
        server.fake.push(ScriptedReply(content=WORDS), ScriptedReply(content="ok"))
        log = open_log(tmp_path)
        say(log, "hi")
        other_shown, shown = FirstOutput(), FirstOutput()
        limits = replace(FAST, first_byte_s=30, slots_poll_s=0.05)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                other: list[RequestResult] = []

                async def another_client() -> None:
                    other.append(
                        await run_request(
                            server.client,
                            user_body("another client's request"),
                            slot=SLOT,
                            limits=limits,
                            report=other_shown,
                        )
                    )

                tg.start_soon(another_client)
                await eventually(lambda: other_shown.at is not None, seconds=30)
                asked = time.monotonic()  # the other request has 39 tokens to go on the slot
                await make_turn(server, log, limits=limits, report=shown).run()
        assert other[0].complete
        (request,) = records(log)
    parts = wait_of(request)
    assert list(parts) == list(WAIT_PARTS)
    assert parts["server_queue_ms"] >= (other_tokens - 2) / tokens_per_s * 1000
    assert request.record.perf.queue_wait_ms == parts["server_queue_ms"]
    wait = person_wait_ms(parts)
    assert wait is not None
    assert wait <= shown.since(asked)


async def _one_turn(server: Served, tmp_path: Path, text: str) -> tuple[Request, float]:
    """One turn on the fake: its recorded parts and the wait measured around it."""
    log = open_log(tmp_path)
    say(log, text)
    shown = FirstOutput()
    with anyio.fail_after(60):
        started = time.monotonic()
        await make_turn(server, log, report=shown, limits=replace(FAST, first_byte_s=30)).run()
    (request,) = records(log)
    return request, shown.since(started)


async def test_a_long_prompt_s_read_is_recorded_as_the_prompt_read(tmp_path: Path) -> None:
    prompt_per_s = 1000.0
    async with served() as server:
        server.fake.pace = Pace(prompt_tokens_per_second=prompt_per_s, batch_size=64)
        server.fake.push(ScriptedReply(content="ok"))
        request, outside = await _one_turn(server, tmp_path, " ".join([WORDS] * 15))
    parts, prompt_n = wait_of(request), request.record.perf.prompt_n
    assert prompt_n is not None
    assert prompt_n > 600
    # Every batch is read after the first progress event ("0 %"): all of the fake's sleeps.
    # Their arrival may be late by a busy moment of the client's: 100 ms of slack.
    assert parts["prompt_read_ms"] >= prompt_n / prompt_per_s * 1000 - 100
    assert list(parts) == list(WAIT_PARTS)
    wait = person_wait_ms(parts)
    assert wait is not None
    assert wait <= outside


async def test_a_slow_first_token_is_recorded_as_the_first_token(tmp_path: Path) -> None:
    tokens_per_s = 4.0
    async with served() as server:
        server.fake.pace = Pace(tokens_per_second=tokens_per_s)
        server.fake.push(ScriptedReply(content="ok"))
        request, outside = await _one_turn(server, tmp_path, "hi")
    parts = wait_of(request)
    # The fake sleeps a token's time before it sends the token, after the prompt's last
    # progress event; 50 ms of slack for a busy moment of the client's.
    assert parts["first_token_ms"] >= 1000 / tokens_per_s - 50
    assert list(parts) == list(WAIT_PARTS)
    wait = person_wait_ms(parts)
    assert wait is not None
    assert wait <= outside
