"""llama-server faults on the fake (the real server's own faults are in test_server_real.py):
each injects one fault into a terminal turn, then runs the four checks."""

from __future__ import annotations

import anyio
import pytest

from loopd_dev.fakes.llama import ScriptedReply, Trigger
from tests.reliability.conftest import Observe
from tests.reliability.harness import box, check_invariants, fake_llama, limits, runtime, say
from tests.reliability.write_table import scenario

pytestmark = pytest.mark.anyio

LONG = ScriptedReply(content="a fairly long answer that streams in many tokens " * 4)


@scenario(
    "Server",
    "stuck before the first byte, slot busy",
    fault="the request's slot is held and no byte comes (queued behind another client)",
    expected="after the first-byte limit: one clear message naming the queue; not retried",
)
async def test_stuck_before_first_byte_with_the_slot_busy(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.faults.set(stall_before_first_byte=True)
        shown, _outcome = await say(rt, "are you there?", limits=limits(first_byte_s=1.0))
        assert len(env.chat_requests()) == 1, "a first-byte timeout is not retried"
        env.fake.faults.clear()
        after, _ = await say(rt, "and now?")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["are you there?", "and now?"], shown, shows="no answer"
        )
        assert "queued" in shown
        assert after.startswith("You said: and now?")
        observe(checked.summary())


@scenario(
    "Server",
    "stuck with the server gone",
    fault="every route accepts the connection and never answers (a hung process)",
    expected="/slots and /health both silent: fails fast as 'gone', well before the limit",
)
async def test_stuck_with_the_server_gone(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.faults.set(hang_all=True)
        with anyio.fail_after(8):  # the first-byte limit is 60 s: this must not wait it out
            shown, outcome = await say(rt, "hello?", limits=limits(first_byte_s=60.0))
        env.fake.faults.clear()
        checked = check_invariants(env.state_dir, env.audit_db, ["hello?"], shown, shows="gone")
        assert outcome.cause is not None
        assert outcome.cause.value == "server_gone"
        observe(checked.summary())


@scenario(
    "Server",
    "silent mid-stream",
    fault="the stream stops mid-answer (after 12 events) and the connection stays open",
    expected="after the silence limit: connection closed, broken entry, clear message",
)
async def test_silent_mid_stream(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.push(LONG)
        env.fake.faults.set(stall_mid_stream=Trigger(after=12, count=1))
        shown, _outcome = await say(rt, "tell me more")
        env.fake.faults.clear()
        after, _ = await say(rt, "again")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["tell me more", "again"], shown, shows="silent"
        )
        assert rt.log.state("terminal").idle
        assert after.startswith("You said: again")
        observe(checked.summary())


@scenario(
    "Server",
    "malformed SSE",
    fault="one event mid-answer is broken JSON",
    expected="the stream is not trusted: broken entry (never replayed), clear message",
)
async def test_malformed_sse(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.push(LONG)
        env.fake.faults.set(malformed_chunk=Trigger(after=12, count=1))
        shown, _ = await say(rt, "stream please")
        after, _ = await say(rt, "next")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["stream please", "next"], shown, shows="malformed"
        )
        assert after.startswith("You said: next")
        observe(checked.summary())


@scenario(
    "Server",
    "error event mid-stream",
    fault="an error event after 12 events (mid-answer), then the stream ends without [DONE]",
    expected="the server's error shown as one line; broken entry; next turn answers",
)
async def test_error_event_mid_stream(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.push(LONG)
        env.fake.faults.set(error_mid_stream=Trigger(after=12, count=1))
        shown, _ = await say(rt, "go on")
        after, _ = await say(rt, "retry")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["go on", "retry"], shown, shows="error mid-stream"
        )
        assert after.startswith("You said: retry")
        observe(checked.summary())


@scenario(
    "Server",
    "HTTP 500 once",
    fault="the chat request answers 500 before streaming, once",
    expected="nothing was generated, so it is sent again (same bytes) and answered",
)
async def test_http_500_once_is_retried(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.faults.set(http_500=Trigger(count=1))
        shown, _outcome = await say(rt, "hi there")
        requests = env.chat_requests()
        checked = check_invariants(env.state_dir, env.audit_db, ["hi there"], shown)
        assert shown.startswith("You said: hi there")
        assert [r.status for r in requests] == [500, 200]
        assert requests[0].body["messages"] == requests[1].body["messages"]
        observe(checked.summary() + f"; {len(requests)} attempts")


@scenario(
    "Server",
    "HTTP 500 every time",
    fault="every chat request answers 500",
    expected="three attempts, then one clear message with the server's words",
)
async def test_http_500_always(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.faults.set(http_500=True)
        shown, _ = await say(rt, "hi there")
        checked = check_invariants(env.state_dir, env.audit_db, ["hi there"], shown, shows="500")
        assert len(env.chat_requests()) == 3
        observe(checked.summary())


@scenario(
    "Server",
    "503 while loading",
    fault="the router answers 503 'Loading model' for a while",
    expected="waited out (with backoff), then answered; not an error",
)
async def test_503_while_loading(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.faults.set(loading=True)

        async def loaded() -> None:
            await anyio.sleep(0.4)  # long enough for several 503s
            env.fake.faults.set(loading=False)

        async with anyio.create_task_group() as tg:
            tg.start_soon(loaded)
            shown, _ = await say(rt, "wake up")
        statuses = [r.status for r in env.chat_requests()]
        checked = check_invariants(env.state_dir, env.audit_db, ["wake up"], shown)
        assert shown.startswith("You said: wake up")
        assert statuses[0] == 503
        assert statuses[-1] == 200
        observe(checked.summary() + f"; {statuses.count(503)} x 503 waited out")


@scenario(
    "Server",
    "prompt over the context size (fake)",
    fault="the prompt is longer than the slot's context: 400 exceed_context_size_error",
    expected="one clear message with the sizes; not retried (the same request fails again)",
)
async def test_prompt_over_the_context(observe: Observe) -> None:
    async with box(fake_llama(n_ctx=256)) as env, runtime(env) as rt:
        text = "word " * 400
        shown, _outcome = await say(rt, text)
        checked = check_invariants(env.state_dir, env.audit_db, [text], shown, shows="400")
        assert len(env.chat_requests()) == 1
        assert "context" in shown
        observe(checked.summary())


@scenario(
    "Server",
    "connection dropped mid-stream (fake)",
    fault="the server closes the connection after 12 events (mid-answer)",
    expected="truncated stream recorded as broken, never replayed; clear message",
)
async def test_connection_dropped_mid_stream(observe: Observe) -> None:
    async with box() as env, runtime(env) as rt:
        env.fake.push(LONG)
        env.fake.faults.set(drop_mid_stream=Trigger(after=12, count=1))
        shown, _ = await say(rt, "a long one")
        after, _ = await say(rt, "short one")
        checked = check_invariants(
            env.state_dir, env.audit_db, ["a long one", "short one"], shown, shows="loopd:"
        )
        assert after.startswith("You said: short one")
        replayed = env.chat_requests()[-1].body["messages"]
        assert all("fairly long" not in str(m.get("content")) for m in replayed)
        observe(checked.summary())
