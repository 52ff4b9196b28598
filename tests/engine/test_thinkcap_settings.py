"""The thinking cap as shipped: with the default settings (``think_cap`` 6144 below
``max_tokens`` 12288) a long thought is capped and the turn still answers; on the real server a
low cap in a configuration the rules accept does the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.config import DEFAULTS, Settings, load_settings
from loopd.engine.limits import Limits
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, Pace, ScriptedReply
from tests.engine.engine_support import MODEL, served

pytestmark = pytest.mark.anyio

# Far past the shipped cap: a runaway thought that, uncapped, would fill max_tokens. Every
# word differs, so the repetition watch (loopd.engine.loops) leaves it to the cap.
LONG_THOUGHT = ScriptedReply(
    reasoning=" ".join(f"step{n}" for n in range(11_000)), content="The answer."
)


async def _one_turn(settings: Settings, text: str) -> tuple[Runtime, str | None]:
    runtime = Runtime.open(settings)
    session = runtime.ensure_session("s")
    await runtime.append_user("s", text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.failure is None, outcome.failure
    return runtime, outcome.answer


async def test_the_shipped_cap_fires_and_leaves_room_for_the_answer(tmp_path: Path) -> None:
    assert (DEFAULTS.think_cap, DEFAULTS.max_tokens) == (6144, 12288)
    # A fast model: the control call lands while it still thinks, as on production's hardware.
    fake = FakeLlama([ModelSpec(MODEL, n_ctx=65536)], pace=Pace(tokens_per_second=20_000))
    fake.push(LONG_THOUGHT)
    async with served(fake) as server:
        # Only where to find the server and the state: every other setting as shipped.
        settings = load_settings(infer_url=server.url, model=MODEL, state_dir=tmp_path)
        runtime, answer = await _one_turn(settings, "think about it")
        try:
            [request] = runtime.log.requests("s")
        finally:
            await runtime.aclose()
        body = server.fake.chat_records()[0].body
    perf = request.record.perf
    assert body["max_tokens"] == DEFAULTS.max_tokens
    assert answer == "The answer."
    assert perf.capped
    assert perf.extra["control_answer"] == "success"
    assert perf.extra["finish_reason"] == "stop", "the answer had room below max_tokens"
    # Ended by the server within the grace of where the control call's answer was read (what
    # the model wrote during the call's round trip is not held against it).
    answered_at = perf.extra["thinking_at_control_answer"]
    grace = Limits().think_grace
    assert DEFAULTS.think_cap <= answered_at <= (perf.thinking_tokens or 0) < answered_at + grace


@pytest.mark.real_server
async def test_a_low_cap_the_rules_accept_ends_thinking_on_the_real_server(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    # The lowest max_tokens the rule think_cap_leaves_answer_room accepts for this cap.
    settings = load_settings(
        infer_url=real_server.url,
        model=devserver.THINKING_MODEL,
        state_dir=tmp_path,
        slots=(0,),
        think_cap=24,
        max_tokens=24 + 1024,
        temperature=0.0,
    )
    runtime, answer = await _one_turn(
        settings, "Think step by step: a farmer has 17 sheep, buys 23 more and sells 9. How many?"
    )
    try:
        [request] = runtime.log.requests("s")
    finally:
        await runtime.aclose()
    perf = request.record.perf
    assert perf.capped
    assert perf.extra["control_answer"] == "success"
    answered_at = perf.extra["thinking_at_control_answer"]
    grace = Limits().think_grace
    assert 24 <= answered_at <= (perf.thinking_tokens or 0) < answered_at + grace, perf
    assert answer, "after the cap the model answered"
